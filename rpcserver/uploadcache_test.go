package rpcserver_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// uploadedBytes is how many file bytes the daemon has received.
func (td *testDaemon) uploadedBytes(t testing.TB) int64 {
	t.Helper()
	const key = `kiln_rpcserver_bulk_bytes_total{method="file.upload"} `
	for _, line := range strings.Split(td.metrics(t), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			n, err := strconv.ParseFloat(v, 64)
			check.NoError(t, err)
			return int64(n)
		}
	}
	return 0
}

// randomBytes returns n random bytes.
func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// weightyArtifact is the test kernels with a file of weights of n bytes.
func weightyArtifact(t testing.TB, weights []byte) []byte {
	so := kernels(t)
	a := artifact.New("c", kernelsTC)
	check.NoError(t, a.Add(artifact.HostLib, so))
	check.NoError(t, a.Add("weights.bin", weights))
	b, err := a.Bytes()
	check.NoError(t, err)
	return b
}

// runVadd loads the module name in s and returns vadd of 0..n-1 and half of it.
func runVadd(t *testing.T, s *client.Session, name string) []float32 {
	t.Helper()
	ctx := testCtx(t)
	mod, err := s.LoadModule(ctx, name)
	check.NoError(t, err, "load module")
	vadd, err := mod.GetFunction(ctx, "vadd")
	check.NoError(t, err)
	const n = 256
	xa, xb := make([]float32, n), make([]float32, n)
	for i := range xa {
		xa[i], xb[i] = float32(i), 0.5*float32(i)
	}
	arrs := make([]*client.Array, 3)
	for i := range arrs {
		arrs[i], err = s.Empty(ctx, ndarray.Shape{n}, ndarray.Float32, devices.CPUDevice)
		check.NoError(t, err)
	}
	for i, x := range [][]float32{xa, xb} {
		l, err := ndarray.FromSlice(x, ndarray.Shape{n})
		check.NoError(t, err)
		check.NoError(t, s.CopyFrom(ctx, arrs[i], l))
	}
	_, err = vadd.Call(ctx, arrs[0], arrs[1], arrs[2])
	check.NoError(t, err)
	lc, err := s.CopyTo(ctx, arrs[2])
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](lc)
	check.NoError(t, err)
	return got
}

// download returns the session's file name.
func download(t *testing.T, s *client.Session, name string) []byte {
	t.Helper()
	var b bytes.Buffer
	_, err := s.Download(testCtx(t), name, &b)
	check.NoError(t, err)
	return b.Bytes()
}

// TestUploadCacheSecondSessionSendsNothing: a second session uploading the
// same artifact sends none of its bytes and runs it with the same outputs;
// a different file under the same name is uploaded, not taken for it.
func TestUploadCacheSecondSessionSendsNothing(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{UploadCacheBytes: 64 << 20})
	art := weightyArtifact(t, randomBytes(3<<20))
	ctx := testCtx(t)

	s1 := td.connect(t, client.SessionOptions{})
	check.NoError(t, s1.Upload(ctx, "model.kiln", art))
	check.Equal(t, td.uploadedBytes(t), int64(len(art)))
	check.Equal(t, s1.LinkedBytes(), int64(0))
	want := runVadd(t, s1, "model.kiln")
	check.NoError(t, s1.Close())
	td.waitIdle(t)

	s2 := td.connect(t, client.SessionOptions{})
	check.NoError(t, s2.Upload(ctx, "model.kiln", art))
	check.Equal(t, td.uploadedBytes(t), int64(len(art)), "bytes received for the second session's upload")
	check.Equal(t, s2.LinkedBytes(), int64(len(art)))
	check.Equal(t, runVadd(t, s2, "model.kiln"), want)
	check.Equal(t, download(t, s2, "model.kiln"), art)

	// Other bytes under the same name: sent, and what the session holds.
	other := randomBytes(2 << 20)
	check.NoError(t, s2.Upload(ctx, "model.kiln", other))
	check.Equal(t, td.uploadedBytes(t), int64(len(art)+len(other)))
	check.Equal(t, download(t, s2, "model.kiln"), other)
	// And the first bytes, under another name, still come from the cache.
	check.NoError(t, s2.Upload(ctx, "again.kiln", art))
	check.Equal(t, td.uploadedBytes(t), int64(len(art)+len(other)))
	check.Equal(t, download(t, s2, "again.kiln"), art)
}

// TestUploadCacheEvicts: past the byte bound the least recently used file
// goes (and is sent again when wanted), while a live session's link to it
// keeps its bytes.
func TestUploadCacheEvicts(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{UploadCacheBytes: 5 << 20, MaxSessions: 2, InsecureShared: true})
	ctx := testCtx(t)
	a, b, c := randomBytes(2<<20), randomBytes(2<<20), randomBytes(2<<20)

	s1 := td.connect(t, client.SessionOptions{})
	for i, f := range [][]byte{a, b, c} {
		check.NoError(t, s1.Upload(ctx, "f"+strconv.Itoa(i), f))
	}
	sent := td.uploadedBytes(t)
	check.Equal(t, sent, int64(6<<20))

	s2 := td.connect(t, client.SessionOptions{})
	// a went when c came (6 MiB > 5 MiB): sent again, which evicts b.
	check.NoError(t, s2.Upload(ctx, "a", a))
	check.Equal(t, td.uploadedBytes(t), sent+2<<20, "a was not sent again")
	check.NoError(t, s2.Upload(ctx, "c", c))
	check.Equal(t, td.uploadedBytes(t), sent+2<<20, "c was sent again")
	check.NoError(t, s2.Upload(ctx, "b", b))
	check.Equal(t, td.uploadedBytes(t), sent+4<<20, "b was not sent again")
	check.Equal(t, s2.LinkedBytes(), int64(2<<20))

	// The first session's files, evicted or not, are whole.
	for i, f := range [][]byte{a, b, c} {
		check.True(t, bytes.Equal(download(t, s1, "f"+strconv.Itoa(i)), f), "file", i, "of the first session changed")
	}
}

// TestUploadCacheRefusesWrongDigest: bytes that do not match the digest
// the client claimed are refused, kept neither in the session nor in the
// cache.
func TestUploadCacheRefusesWrongDigest(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{UploadCacheBytes: 64 << 20})
	ctx := testCtx(t)
	data := randomBytes(2 << 20)
	claimed := sha256.Sum256([]byte("something else"))
	claim := hex.EncodeToString(claimed[:])

	c, err := proto.Dial(ctx, td.addr, proto.DialOptions{Role: proto.RoleClient, Logger: quietLog()})
	check.NoError(t, err)
	defer c.Close()
	check.NoError(t, c.Call(ctx, proto.SessionOpen, proto.OpenArgs{}, nil))
	var tk proto.UploadTicket
	check.NoError(t, c.Call(ctx, proto.FileUploadTicket, proto.UploadTicketArgs{Name: "w.bin", Size: int64(len(data)), SHA256: claim}, &tk))
	err = rawSend(ctx, td.addr, tk.Ticket, data)
	check.ErrorIs(t, err, proto.ErrBadRequest)
	check.Error(t, err, "not the claimed")
	var files []proto.FileInfo
	check.NoError(t, c.Call(ctx, proto.FileList, nil, &files))
	check.Equal(t, len(files), 0)
	for _, sum := range []string{claim, sha256Hex(data)} {
		var out proto.LinkCached
		check.NoError(t, c.Call(ctx, proto.FileLinkCached, proto.LinkCachedArgs{Name: "w.bin", Size: int64(len(data)), SHA256: sum}, &out))
		check.Equal(t, out.Linked, false)
	}
	// A digest that is not one is a bad request.
	err = c.Call(ctx, proto.FileLinkCached, proto.LinkCachedArgs{Name: "w.bin", Size: 1, SHA256: "xyz"}, nil)
	check.ErrorIs(t, err, proto.ErrBadRequest)
	err = c.Call(ctx, proto.FileUploadTicket, proto.UploadTicketArgs{Name: "w.bin", Size: 1, SHA256: "xyz"}, nil)
	check.ErrorIs(t, err, proto.ErrBadRequest)
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// rawSend sends data on a bulk connection with ticket and returns the
// daemon's answer.
func rawSend(ctx context.Context, addr, ticket string, data []byte) error {
	nc, err := proto.DialRaw(ctx, addr, proto.DialOptions{Role: proto.RoleBulk, Logger: quietLog()})
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := proto.WriteFrame(nc, proto.BulkTicket{Ticket: ticket}, 0); err != nil {
		return err
	}
	if _, err := nc.Write(data); err != nil {
		return err
	}
	b, err := proto.ReadFrame(nc, 0)
	if err != nil {
		return err
	}
	resp, err := proto.DecodeResponse(b)
	if err != nil {
		return err
	}
	if resp.Error != nil {
		return resp.Error
	}
	return nil
}

// TestUploadCacheDisabled: with the cache off (0) every session's upload
// sends its bytes, and the files are right.
func TestUploadCacheDisabled(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{})
	ctx := testCtx(t)
	data := randomBytes(2 << 20)
	for i := 1; i <= 2; i++ {
		s := td.connect(t, client.SessionOptions{})
		check.NoError(t, s.Upload(ctx, "w.bin", data))
		check.Equal(t, td.uploadedBytes(t), int64(i*len(data)))
		check.Equal(t, s.LinkedBytes(), int64(0))
		check.True(t, bytes.Equal(download(t, s, "w.bin"), data), "file of session", i)
		check.NoError(t, s.Close())
	}
}

// TestUploadCacheKeepsUsersApart: a file one lease user uploaded is not
// linked into another's session (here one without a lease), while the
// same user's next upload of it is linked.
func TestUploadCacheKeepsUsersApart(t *testing.T) {
	f := startLeasedFleet(t)
	m := f.device(t, "m", rpcserver.Config{MaxSessions: 2, Sandbox: rpcserver.SandboxOff, InsecureShared: true, AllowWithoutLease: true, UploadCacheBytes: 64 << 20}, 2)
	ctx := testCtx(t)
	data := randomBytes(2 << 20)

	alice, err := client.Connect(ctx, m.addr, client.SessionOptions{LeaseToken: f.lease(t, "m").Token})
	check.NoError(t, err)
	defer alice.Close()
	check.NoError(t, alice.Upload(ctx, "w.bin", data))

	other, err := client.Connect(ctx, m.addr, client.SessionOptions{Token: "fleet"})
	check.NoError(t, err, "a session without a lease")
	defer other.Close()
	check.NoError(t, other.Upload(ctx, "w.bin", data))
	check.Equal(t, other.LinkedBytes(), int64(0), "another user's file was linked")
	check.Equal(t, m.uploadedBytes(t), int64(2*len(data)))

	check.NoError(t, alice.Upload(ctx, "again.bin", data))
	check.Equal(t, alice.LinkedBytes(), int64(len(data)))
	check.Equal(t, m.uploadedBytes(t), int64(2*len(data)))
}
