package proto

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/kiln-ml/kiln/internal/check"
)

// guard bounds every wait in these tests, so a broken server fails a test
// instead of hanging it. It is not a performance threshold.
const guard = 30 * time.Second

// logSink records log lines and forwards them to t.Log until the test ends.
type logSink struct {
	mu    sync.Mutex
	t     testing.TB
	lines []string
	done  bool
}

func newLogSink(t testing.TB) *logSink {
	s := &logSink{t: t}
	t.Cleanup(func() {
		s.mu.Lock()
		s.done = true
		s.mu.Unlock()
	})
	return s
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	line := strings.TrimSpace(string(p))
	s.lines = append(s.lines, line)
	if !s.done {
		s.t.Log(line)
	}
	return len(p), nil
}

// contains reports whether some recorded line contains sub.
func (s *logSink) contains(sub string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.lines {
		if strings.Contains(l, sub) {
			return true
		}
	}
	return false
}

func (s *logSink) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(s, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// testServer is a Server serving on 127.0.0.1:0 until the test ends.
type testServer struct {
	*Server
	addr string
	logs *logSink
	stop context.CancelFunc
	errc chan error
}

// startServer starts a server with cfg; setup registers its handlers. At
// the end of the test the server is stopped and Serve must return nil.
func startServer(t testing.TB, cfg ServerConfig, setup func(*Server)) *testServer {
	t.Helper()
	logs := newLogSink(t)
	if cfg.Logger == nil {
		cfg.Logger = logs.logger()
	}
	srv := NewServer(cfg)
	if setup != nil {
		setup(srv)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{Server: srv, addr: ln.Addr().String(), logs: logs, stop: cancel, errc: make(chan error, 1)}
	go func() { ts.errc <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-ts.errc:
			check.NoError(t, err, "Serve")
		case <-time.After(guard):
			t.Fatal("Serve did not return after its context was cancelled")
		}
	})
	return ts
}

// dial connects a client to ts with opts and closes it at the end of the test.
func (ts *testServer) dial(t testing.TB, opts DialOptions) *Client {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = ts.logs.logger()
	}
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	c, err := Dial(ctx, ts.addr, opts)
	check.NoError(t, err, "dial")
	t.Cleanup(func() { c.Close() })
	return c
}

// rawSession says hello by hand and opens the control stream, for tests
// that write frames a Client never would.
func rawSession(t testing.TB, addr string, token string) (*yamux.Session, *yamux.Stream) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, guard)
	check.NoError(t, err)
	nc.SetDeadline(time.Now().Add(guard))
	check.NoError(t, WriteHello(nc, Hello{Version: ProtocolVersion, Role: RoleClient, Token: token}))
	rep, err := ReadHelloReply(nc)
	check.NoError(t, err)
	check.NoError(t, rep.Err())
	nc.SetDeadline(time.Time{})
	cfg := muxConfig(-1, slog.New(slog.DiscardHandler))
	sess, err := yamux.Client(nc, cfg)
	check.NoError(t, err)
	t.Cleanup(func() { sess.Close() })
	st, err := sess.OpenStream()
	check.NoError(t, err)
	st.SetDeadline(time.Now().Add(guard))
	return sess, st
}

// waitClosed waits for sess to end.
func waitClosed(t testing.TB, sess *yamux.Session) {
	t.Helper()
	select {
	case <-sess.CloseChan():
	case <-time.After(guard):
		t.Fatal("the server did not close the connection")
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
