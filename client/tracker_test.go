package client

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// fakeTracker serves a few tracker methods scripted by the test; the real
// tracker's tests (package tracker) drive this SDK end to end.
func fakeTracker(t *testing.T, setup func(*proto.Server)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	srv := proto.NewServer(proto.ServerConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	setup(srv)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ctx, ln)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return ln.Addr().String()
}

func TestRequestLeasePositions(t *testing.T) {
	var mu sync.Mutex
	var released []string
	pos := 3
	addr := fakeTracker(t, func(s *proto.Server) {
		next := func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			mu.Lock()
			defer mu.Unlock()
			pos--
			if pos == 0 {
				return proto.LeaseTicket{Ticket: "t1", Lease: &proto.Lease{ID: "l1", Token: "tok", Addr: "127.0.0.1:9", TTL: time.Minute}}, nil
			}
			return proto.LeaseTicket{Ticket: "t1", Position: pos, Queue: "k", Served: true}, nil
		}
		s.Handle(proto.MethodLeaseRequest, next)
		s.Handle(proto.MethodLeaseWait, next)
		s.Handle(proto.MethodLeaseRelease, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			var a proto.LeaseRenewArgs
			check.NoError(t, msgpack.Unmarshal(raw, &a))
			mu.Lock()
			released = append(released, a.ID+"/"+a.Token)
			mu.Unlock()
			return nil, nil
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tr, err := DialTracker(ctx, addr, TrackerOptions{})
	check.NoError(t, err)
	defer tr.Close()
	var seen []int
	l, err := tr.RequestLease(ctx, LeaseRequest{Key: "k", NoRenew: true, OnPosition: func(p int, q string) { seen = append(seen, p) }})
	check.NoError(t, err)
	check.Equal(t, seen, []int{2, 1})
	check.Equal(t, l.Addr, "127.0.0.1:9")
	check.NoError(t, l.Release(ctx))
	check.Equal(t, released, []string{"l1/tok"})
}

func TestRequestLeaseDeadline(t *testing.T) {
	var mu sync.Mutex
	cancelled := false
	addr := fakeTracker(t, func(s *proto.Server) {
		wait := func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
			return proto.LeaseTicket{Ticket: "t1", Position: 4, Queue: "k"}, nil
		}
		s.Handle(proto.MethodLeaseRequest, wait)
		s.Handle(proto.MethodLeaseWait, wait)
		s.Handle(proto.MethodLeaseCancel, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			mu.Lock()
			cancelled = true
			mu.Unlock()
			return nil, nil
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tr, err := DialTracker(ctx, addr, TrackerOptions{})
	check.NoError(t, err)
	defer tr.Close()
	short, cancelShort := context.WithTimeout(ctx, 150*time.Millisecond)
	defer cancelShort()
	_, err = tr.RequestLease(short, LeaseRequest{Key: "k"})
	check.ErrorIs(t, err, proto.ErrDeadline)
	check.Error(t, err, `key "k"`, "queue position 4", "no live device serves it")
	mu.Lock()
	check.True(t, cancelled, "the queued request was cancelled on the tracker")
	mu.Unlock()
}

func TestDialTrackerUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = DialTracker(ctx, addr, TrackerOptions{})
	check.ErrorIs(t, err, proto.ErrUnavailable)
	check.Error(t, err, "connect to tracker")
}

func TestFileSHA256(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a.kiln")
	check.NoError(t, os.WriteFile(p, []byte("abc"), 0o644))
	sum, n, err := FileSHA256(p)
	check.NoError(t, err)
	check.Equal(t, sum, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
	check.Equal(t, n, int64(3))
	_, _, err = FileSHA256(filepath.Join(t.TempDir(), "missing"))
	check.Error(t, err, "missing")
}

// TestCancelledWaitsKeepTheConnection: a lease request and a build wait
// cancelled midway leave the Tracker's one connection up: the request is
// withdrawn and the job cancelled through it while the tracker still runs
// the abandoned waits, later calls work, and a lease held through the same
// Tracker goes on renewing.
func TestCancelledWaitsKeepTheConnection(t *testing.T) {
	var mu sync.Mutex
	conns := map[*proto.Conn]bool{}
	renewals := 0
	running := map[string]bool{} // long polls the tracker is serving
	var cancels []string         // what was cancelled, and whether its wait still ran
	entered := make(chan string, 4)
	seen := func(c *proto.Conn) {
		mu.Lock()
		conns[c] = true
		mu.Unlock()
	}
	poll := func(name string) proto.HandlerFunc {
		return func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			seen(c)
			mu.Lock()
			running[name] = true
			mu.Unlock()
			entered <- name
			<-ctx.Done() // held until the connection ends
			mu.Lock()
			running[name] = false
			mu.Unlock()
			return nil, ctx.Err()
		}
	}
	cancel := func(name string) proto.HandlerFunc {
		return func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			seen(c)
			mu.Lock()
			defer mu.Unlock()
			cancels = append(cancels, fmt.Sprintf("%s running=%v", name, running[name]))
			return proto.BuildJob{ID: "j1", State: proto.JobCancelled}, nil
		}
	}
	addr := fakeTracker(t, func(s *proto.Server) {
		s.Handle(proto.MethodLeaseRequest, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			seen(c)
			var a proto.LeaseRequestArgs
			check.NoError(t, msgpack.Unmarshal(raw, &a))
			if a.Key == "held" {
				return proto.LeaseTicket{Ticket: "t1", Lease: &proto.Lease{ID: "l1", Token: "tok", Addr: "127.0.0.1:9", TTL: 60 * time.Millisecond}}, nil
			}
			return proto.LeaseTicket{Ticket: "t2", Position: 1, Queue: a.Key, Served: true}, nil
		})
		s.Handle(proto.MethodLeaseWait, poll("lease wait"))
		s.Handle(proto.MethodLeaseCancel, cancel("lease wait"))
		s.Handle(proto.MethodBuildWait, poll("build wait"))
		s.Handle(proto.MethodBuildCancel, cancel("build wait"))
		s.Handle(proto.MethodLeaseRenew, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			seen(c)
			mu.Lock()
			renewals++
			mu.Unlock()
			return proto.Lease{ID: "l1", Token: "tok", TTL: 60 * time.Millisecond, Expires: time.Now().Add(60 * time.Millisecond)}, nil
		})
		s.Handle(proto.MethodTrackerQuery, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			seen(c)
			return proto.TrackerSummary{}, nil
		})
	})
	ctx, stop := context.WithTimeout(context.Background(), 20*time.Second)
	defer stop()
	tr, err := DialTracker(ctx, addr, TrackerOptions{Logger: quiet()})
	check.NoError(t, err)
	defer tr.Close()
	held, err := tr.RequestLease(ctx, LeaseRequest{Key: "held"})
	check.NoError(t, err)

	// cancelWhenEntered cancels a call once the tracker serves its wait.
	cancelWhenEntered := func(name string) context.Context {
		cctx, cancelC := context.WithCancel(ctx)
		go func() {
			select {
			case got := <-entered:
				if got != name {
					t.Errorf("the tracker served %s, want %s", got, name)
				}
			case <-ctx.Done():
			}
			cancelC()
		}()
		return cctx
	}
	_, err = tr.RequestLease(cancelWhenEntered("lease wait"), LeaseRequest{Key: "k"})
	check.ErrorIs(t, err, proto.ErrCancelled)
	_, err = tr.WaitBuild(cancelWhenEntered("build wait"), "j1", nil)
	check.ErrorIs(t, err, proto.ErrCancelled)
	j, err := tr.CancelBuild(ctx, "j1")
	check.NoError(t, err)
	check.Equal(t, j.State, proto.JobCancelled)
	_, err = tr.Query(ctx, 0)
	check.NoError(t, err)

	mu.Lock()
	check.Equal(t, cancels, []string{"lease wait running=true", "build wait running=true"})
	n := renewals
	mu.Unlock()
	for i := 0; i < 2000; i++ { // the lease renews on: three more renewals
		mu.Lock()
		more := renewals - n
		mu.Unlock()
		if more >= 3 || ctx.Err() != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	check.True(t, renewals-n >= 3, "the held lease renews after the cancelled calls")
	check.Equal(t, len(conns), 1)
	mu.Unlock()
	check.NoError(t, held.Err())
}
