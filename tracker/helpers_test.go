package tracker

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// guard bounds every wait in these tests so a broken tracker fails a test
// instead of hanging it. It is not a performance threshold.
const guard = 20 * time.Second

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// fastConfig is a tracker config with short intervals, on 127.0.0.1:0.
func fastConfig(t testing.TB) Config {
	return Config{
		Listen:            "127.0.0.1:0",
		DataDir:           t.TempDir(),
		HeartbeatInterval: 50 * time.Millisecond,
		LostAfter:         time.Second,
		LeaseWait:         100 * time.Millisecond,
		Logger:            quietLogger(),
	}
}

// running is a tracker serving until stopped or the test ends.
type running struct {
	*Server
	cancel context.CancelFunc
	errc   chan error
}

func startTracker(t testing.TB, cfg Config) *running {
	t.Helper()
	s, err := New(cfg)
	check.NoError(t, err)
	return runServer(t, s)
}

// runServer runs s until stopped or the test ends.
func runServer(t testing.TB, s *Server) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Server: s, cancel: cancel, errc: make(chan error, 1)}
	go func() { r.errc <- s.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels Run and checks it returned nil; it is idempotent.
func (r *running) stop(t testing.TB) {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.errc:
		if ok {
			check.NoError(t, err, "tracker Run")
			close(r.errc)
		}
	case <-time.After(guard):
		t.Fatal("tracker did not stop")
	}
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	t.Cleanup(cancel)
	return ctx
}

func dialTracker(t testing.TB, addr string) *client.Tracker {
	t.Helper()
	tr, err := client.DialTracker(testCtx(t), addr, client.TrackerOptions{Logger: quietLogger()})
	check.NoError(t, err)
	t.Cleanup(func() { tr.Close() })
	return tr
}

// device registers a device daemon through a client.Registrar until the
// returned cancel is called or the test ends.
func device(t testing.TB, addr, key string, attrs proto.NodeAttrs, setup ...func(*client.Registrar)) (*client.Registrar, context.CancelFunc) {
	t.Helper()
	r := client.NewRegistrar(addr, client.TrackerOptions{Logger: quietLogger()}, proto.RegisterArgs{
		Role: proto.NodeDevice, Key: key, Addr: "127.0.0.1:1", Attrs: attrs,
	})
	for _, f := range setup {
		f(r)
	}
	return r, runRegistrar(t, r)
}

// runRegistrar runs r until the returned stop is called or the test ends,
// and waits for its first registration.
func runRegistrar(t testing.TB, r *client.Registrar) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
	}()
	stop := func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	select {
	case <-r.Ready():
	case <-time.After(guard):
		t.Fatal("device did not register")
	}
	return stop
}

// eventually polls cond every 10ms until it holds or guard passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(guard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// nodeState returns a node's state in the tracker's summary, "" when absent.
func nodeState(s *Server, id string) proto.NodeState {
	sum := s.Summary(0)
	for _, n := range append(sum.Devices, sum.Compiler...) {
		if n.NodeID == id {
			return n.State
		}
	}
	return ""
}

// queueLen returns the number of requests waiting in the named queue.
func queueLen(s *Server, name string) int {
	for _, q := range s.Summary(0).Queues {
		if q.Queue == name {
			return len(q.Waiting)
		}
	}
	return 0
}
