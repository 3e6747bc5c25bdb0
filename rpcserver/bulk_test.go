package rpcserver_test

import (
	"bytes"
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestRawUpload: a file of a megabyte or more goes on a connection of its
// own and arrives whole; the session's quota still holds there; a bulk
// connection with a made-up ticket gets nothing written.
func TestRawUpload(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{SessionQuota: 5 << 20, Token: "tok"})
	s := td.connect(t, client.SessionOptions{Token: "tok"})
	ctx := testCtx(t)
	data := make([]byte, 3<<20+17)
	for i := range data {
		data[i] = byte(i * 31)
	}
	check.NoError(t, s.Upload(ctx, "big.bin", data))
	var back bytes.Buffer
	n, err := s.Download(ctx, "big.bin", &back)
	check.NoError(t, err)
	check.Equal(t, n, int64(len(data)))
	check.True(t, bytes.Equal(back.Bytes(), data), "the uploaded bytes differ")

	err = s.Upload(ctx, "second.bin", data)
	check.ErrorIs(t, err, proto.ErrQuota)
	files, err := s.List(ctx)
	check.NoError(t, err)
	check.Equal(t, len(files), 1, "files after the refused upload:", files)

	nc, err := proto.DialRaw(ctx, td.addr, proto.DialOptions{Role: proto.RoleBulk, Token: "tok"})
	check.NoError(t, err)
	defer nc.Close()
	check.NoError(t, proto.WriteFrame(nc, proto.BulkTicket{Ticket: "made-up"}, 0))
	b, err := proto.ReadFrame(nc, 0)
	check.NoError(t, err)
	resp, err := proto.DecodeResponse(b)
	check.NoError(t, err)
	check.True(t, resp.Error != nil && resp.Error.Code == proto.CodeUnauthorized, "a made-up ticket:", resp.Error)

	// Without the token, no bulk connection.
	_, err = proto.DialRaw(ctx, td.addr, proto.DialOptions{Role: proto.RoleBulk})
	check.ErrorIs(t, err, proto.ErrUnauthorized)
}

// TestInsecureFlagMetric: a daemon started with Insecure beyond loopback
// says so in /metrics; one on loopback does not.
func TestInsecureFlagMetric(t *testing.T) {
	for _, tc := range []struct {
		listen string
		want   string
	}{{"0.0.0.0:0", "kiln_rpcserver_insecure 1"}, {"127.0.0.1:0", "kiln_rpcserver_insecure 0"}} {
		d, err := rpcserver.New(rpcserver.Config{Listen: tc.listen, Dir: t.TempDir(), Insecure: true})
		check.NoError(t, err)
		rec := httptest.NewRecorder()
		d.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		check.True(t, strings.Contains(rec.Body.String(), tc.want), tc.listen, "metrics lack", tc.want)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		check.NoError(t, d.Run(ctx)) // releases the listener
	}
}
