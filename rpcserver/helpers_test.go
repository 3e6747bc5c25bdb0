package rpcserver_test

import (
	"context"
	_ "embed"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler/toolchain"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver"
)

// workerEnv makes this test binary run as a worker process.
const workerEnv = "KILN_RPCSERVER_TEST_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		os.Exit(rpcserver.WorkerMain())
	}
	os.Exit(m.Run())
}

// workerEnvVars is the environment of test workers. A race-enabled
// binary sleeps a second at exit unless told not to.
func workerEnvVars() []string {
	return []string{workerEnv + "=1", "GORACE=" + strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")}
}

// guard bounds every wait in these tests, so a broken daemon fails a test
// instead of hanging it. It is not a performance threshold.
const guard = 60 * time.Second

// testDaemon is a daemon running in this process on 127.0.0.1:0.
type testDaemon struct {
	d    *rpcserver.Daemon
	addr string
	dir  string
	logs *logSink
}

// logSink collects log lines.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = append(s.lines, strings.TrimSpace(string(p)))
	return len(p), nil
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "\n")
}

// startDaemon runs a daemon until the test ends; cfg's Listen, Dir and
// Worker are filled in.
// Each setup function runs after New, before Run (to attach a tracker
// registrar that needs the daemon's address).
func startDaemon(t testing.TB, cfg rpcserver.Config, setup ...func(*rpcserver.Daemon)) *testDaemon {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.Worker.Path == "" {
		cfg.Worker.Path = os.Args[0]
	}
	cfg.Worker.Args, cfg.Worker.Env = []string{"-test.run=^$"}, workerEnvVars()
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = time.Second
	}
	logs := &logSink{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	d, err := rpcserver.New(cfg)
	check.NoError(t, err)
	for _, f := range setup {
		f(d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			check.NoError(t, err, "daemon Run")
		case <-time.After(guard):
			t.Errorf("daemon did not stop within %s", guard)
		}
		if t.Failed() || os.Getenv("KILN_TEST_LOG") != "" {
			t.Logf("daemon log:\n%s", logs.String())
		}
	})
	return &testDaemon{d: d, addr: d.Addr().String(), dir: cfg.Dir, logs: logs}
}

// connect opens a session on td.
func (td *testDaemon) connect(t testing.TB, opts client.SessionOptions) *client.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	s, err := client.Connect(ctx, td.addr, opts)
	check.NoError(t, err, "connect")
	t.Cleanup(func() { s.Close() })
	return s
}

// metrics returns the daemon's /metrics text.
func (td *testDaemon) metrics(t testing.TB) string {
	rec := httptest.NewRecorder()
	td.d.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, err := io.ReadAll(rec.Result().Body)
	check.NoError(t, err)
	return string(b)
}

// waitIdle waits until the daemon has no session.
func (td *testDaemon) waitIdle(t testing.TB) {
	t.Helper()
	eventually(t, "the daemon is idle", func() bool {
		return strings.Contains(td.metrics(t), "kiln_rpcserver_sessions_active 0\n")
	})
}

// eventually polls cond until it holds, failing the test after guard.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(guard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, guard)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

//go:embed testdata/kernels.c
var kernelsC string

var (
	kernelsOnce sync.Once
	kernelsSO   []byte
	kernelsErr  error
	kernelsTC   string
)

// kernels compiles testdata/kernels.c once per test binary with the
// toolchain package, returning the shared object's bytes.
func kernels(t testing.TB) []byte {
	t.Helper()
	kernelsOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), guard)
		defer cancel()
		tc, err := toolchain.Find(ctx, toolchain.Options{Flags: []string{"-O1"}})
		if err != nil {
			kernelsErr = err
			return
		}
		dir, err := os.MkdirTemp("", "kiln-rpcserver-kernels-")
		if err != nil {
			kernelsErr = err
			return
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "kernels.so")
		if err := tc.BuildShared(ctx, []toolchain.Source{{Name: "kernels.c", Text: kernelsC}}, out, ""); err != nil {
			kernelsErr = err
			return
		}
		kernelsSO, kernelsErr = os.ReadFile(out)
		kernelsTC = tc.Identity()
	})
	if kernelsErr != nil {
		t.Skipf("no C toolchain to build the test kernels: %v", kernelsErr)
	}
	return kernelsSO
}

// kernelsArtifact wraps the kernels in a .kiln artifact.
func kernelsArtifact(t testing.TB) []byte {
	so := kernels(t)
	a := artifact.New("c", kernelsTC)
	check.NoError(t, a.Add(artifact.HostLib, so))
	b, err := a.Bytes()
	check.NoError(t, err)
	return b
}

// loadKernels uploads the kernels as a .kiln artifact and loads them.
func loadKernels(t testing.TB, s *client.Session) *client.Module {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	check.NoError(t, s.Upload(ctx, "kernels.kiln", kernelsArtifact(t)))
	mod, err := s.LoadModule(ctx, "kernels.kiln")
	check.NoError(t, err, "load module")
	return mod
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	t.Cleanup(cancel)
	return ctx
}
