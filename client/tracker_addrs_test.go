package client

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

func TestParseTrackerAddrs(t *testing.T) {
	got, err := ParseTrackerAddrs(" a:9190, 10.0.0.2:9190,[::1]:9190")
	check.NoError(t, err)
	check.Equal(t, got, []string{"a:9190", "10.0.0.2:9190", "[::1]:9190"})
	for spec, want := range map[string]string{
		"":             "no tracker address given",
		"a:1,,b:2":     "entry 2 is empty",
		"tracker":      `tracker address "tracker": want HOST:PORT`,
		":9190":        "with both parts",
		"a:1,b":        `tracker address "b"`,
		"a:9190,":      "entry 2 is empty",
		"a:1:2":        "want HOST:PORT",
		"host:":        "with both parts",
		"  ,  a:9190 ": "entry 1 is empty",
	} {
		_, err := ParseTrackerAddrs(spec)
		check.Error(t, err, want)
	}
	// A Registrar given a bad list fails at Run, naming the entry.
	r := NewRegistrar("a:1,,b:2", TrackerOptions{Logger: quiet()}, proto.RegisterArgs{Role: proto.NodeDevice})
	check.Error(t, r.Run(context.Background()), "entry 2 is empty")
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// replica is a fake tracker replica: it answers tracker.query with its
// name (in TrackerSummary.Keys) or, while down is set, with ErrUnavailable
// (a replica that lost its store), and registers nodes, counting them.
type replica struct {
	name       string
	addr       string
	down       atomic.Bool
	registered atomic.Int32
}

func startReplica(t *testing.T, name string) *replica {
	r := &replica{name: name}
	r.addr = fakeTracker(t, func(s *proto.Server) {
		s.Handle(proto.MethodTrackerQuery, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			if r.down.Load() {
				return nil, fmt.Errorf("replica %s cannot reach its store: %w", name, proto.ErrUnavailable)
			}
			return proto.TrackerSummary{Keys: []proto.KeySummary{{Key: name}}}, nil
		})
		s.Handle(proto.MethodTrackerRegister, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			r.registered.Add(1)
			return proto.RegisterReply{NodeID: "n1", HeartbeatInterval: 20 * time.Millisecond}, nil
		})
		s.Handle(proto.MethodTrackerHeartbeat, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			return proto.HeartbeatReply{State: proto.StateFree}, nil
		})
		s.Handle(proto.MethodLeaseVerify, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			return proto.LeaseInfo{ID: name}, nil
		})
	})
	return r
}

func whoAnswers(t *testing.T, tr *Tracker) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sum, err := tr.Query(ctx, 0)
	check.NoError(t, err)
	return sum.Keys[0].Key
}

// TestTrackerFailsOverToTheNextReplica: a call that a replica answers
// unavailable is made again on the next replica, and calls stay there.
func TestTrackerFailsOverToTheNextReplica(t *testing.T) {
	a, b := startReplica(t, "a"), startReplica(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tr, err := DialTracker(ctx, a.addr+","+b.addr, TrackerOptions{Logger: quiet()})
	check.NoError(t, err)
	defer tr.Close()
	check.Equal(t, whoAnswers(t, tr), "a")
	a.down.Store(true)
	check.Equal(t, whoAnswers(t, tr), "b")
	check.Equal(t, tr.Addr(), b.addr)
	a.down.Store(false)
	check.Equal(t, whoAnswers(t, tr), "b")

	// Both down: the call gives up after the failover time, naming both.
	b.down.Store(true)
	a.down.Store(true)
	short, err := DialTracker(ctx, a.addr+","+b.addr, TrackerOptions{Logger: quiet(), FailoverTimeout: 200 * time.Millisecond})
	check.NoError(t, err)
	defer short.Close()
	_, err = short.Query(ctx, 0)
	check.ErrorIs(t, err, proto.ErrUnavailable)
	check.Error(t, err, "cannot reach its store")
}

// TestRegistrarFailsOverToTheNextReplica: a node whose replica goes away
// registers with the next one, and its calls go there.
func TestRegistrarFailsOverToTheNextReplica(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	b := startReplica(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The first replica accepts the connection and drops it at once.
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	defer ln.Close()
	r := NewRegistrar(ln.Addr().String()+","+b.addr, TrackerOptions{Logger: quiet()}, proto.RegisterArgs{Role: proto.NodeDevice, Key: "k"})
	done := make(chan error, 1)
	rctx, stop := context.WithCancel(ctx)
	go func() { done <- r.Run(rctx) }()
	select {
	case <-r.Ready():
	case <-ctx.Done():
		t.Fatal("the registrar did not register with the second replica")
	}
	info, err := r.VerifyLease(ctx, "tok")
	check.NoError(t, err)
	check.Equal(t, info.ID, "b")
	check.True(t, b.registered.Load() >= 1)
	stop()
	check.NoError(t, <-done)
}

// TestDialTrackerByName: a name is resolved and each of its addresses
// tried ("localhost" may resolve to ::1, where nothing listens, first).
func TestDialTrackerByName(t *testing.T) {
	a := startReplica(t, "a")
	_, port, _ := net.SplitHostPort(a.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tr, err := DialTracker(ctx, "localhost:"+port, TrackerOptions{Logger: quiet()})
	check.NoError(t, err)
	defer tr.Close()
	check.Equal(t, whoAnswers(t, tr), "a")
	check.Equal(t, tr.Addr(), a.addr)
}

// TestTransferRetryNeedsARewind: an upload or download whose connection
// failed is not made again when its body or destination cannot start over.
func TestTransferRetryNeedsARewind(t *testing.T) {
	err := uploadArtifact(context.Background(), nil, "abc", 3, io.MultiReader(strings.NewReader("abc")), 1)
	check.ErrorIs(t, err, proto.ErrUnavailable)
	check.True(t, !retryable(err), "a body that cannot be read again is not retried")
	check.Error(t, err, "cannot be read again")
	_, err = downloadArtifact(context.Background(), nil, "abc", io.Discard, 10)
	check.True(t, !retryable(err), "a destination that cannot start over is not retried")
	check.Error(t, err, "after 10 bytes", "cannot start over")
}

// cutReader yields n bytes of data, then closes the connection under it.
type cutReader struct {
	data []byte
	n    int
	c    *proto.Conn
}

func (r *cutReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		r.c.Close()
		return 0, fmt.Errorf("cut: %w", proto.ErrUnavailable)
	}
	k := copy(p[:min(len(p), r.n)], r.data)
	r.data, r.n = r.data[k:], r.n-k
	return k, nil
}

// TestDownloadStartsOver: a download cut after some bytes by the tracker
// connection's end is made again on the next connection, into a buffer
// reset first, so the bytes arrive once and whole.
func TestDownloadStartsOver(t *testing.T) {
	data := []byte(strings.Repeat("artifact bytes ", 4000))
	var tries atomic.Int32
	addr := fakeTracker(t, func(s *proto.Server) {
		s.HandleBulk(proto.BulkArtifactDownload, func(ctx context.Context, c *proto.Conn, in proto.Bulk) (proto.Bulk, error) {
			if tries.Add(1) == 1 {
				return proto.Bulk{Name: in.Name, Size: int64(len(data)), Body: &cutReader{data: data, n: 20000, c: c}}, nil
			}
			return proto.Bulk{Name: in.Name, Size: int64(len(data)), Body: bytes.NewReader(data)}, nil
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tr, err := DialTracker(ctx, addr, TrackerOptions{Logger: quiet()})
	check.NoError(t, err)
	defer tr.Close()
	var buf bytes.Buffer
	n, err := tr.DownloadArtifact(ctx, "abc", &buf)
	check.NoError(t, err)
	check.Equal(t, n, int64(len(data)))
	check.True(t, bytes.Equal(buf.Bytes(), data), "the bytes arrive once and whole")
	check.Equal(t, tries.Load(), int32(2))
}
