package compilernode_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compilernode"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker"
)

// The test binary doubles as the job subprocess.
func TestMain(m *testing.M) {
	if os.Getenv("KILN_TEST_NODE_JOB") == "1" {
		if err := compilernode.RunJob(context.Background(), os.Args[len(os.Args)-1], os.Stdout); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const vadd = `@T.prim_func
def vadd(A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32"), C: T.Buffer((8,), "float32")):
    for i in range(8):
        with T.block("C"):
            vi = T.axis.spatial(8, i)
            T.reads(A[vi], B[vi])
            T.writes(C[vi])
            C[vi] = A[vi] + B[vi]
`

func TestNodeBuildsThroughTracker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	metricsAddr := freeAddr(t)
	c := nodeFleet(t, ctx, tracker.Config{}, compilernode.Config{MetricsListen: metricsAddr})
	job, err := c.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "vadd.py", Module: vadd, Target: "cpu"})
	check.NoError(t, err)
	var states []proto.JobState
	job, err = c.WaitBuild(ctx, job.ID, func(j proto.BuildJob) { states = append(states, j.State) })
	check.NoError(t, err)
	check.Equal(t, job.State, proto.JobSucceeded)
	checkVadd(t, ctx, c, job.Artifact)
	// The job's stages are in its log (and were its progress messages);
	// "schedule" comes before the build cache answers.
	check.True(t, strings.Contains(job.Log, compilernode.StagePrefix+"schedule\n"), job.Log)

	// A module with a syntax error fails with the parser's message.
	bad, err := c.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "bad.py", Module: "@T.prim_func\ndef f(:\n", Target: "cpu"})
	check.NoError(t, err)
	_, err = c.WaitBuild(ctx, bad.ID, nil)
	check.True(t, errors.Is(err, client.ErrBuildFailed), "want ErrBuildFailed, got", err)
	check.Error(t, err, "bad.py:2:")

	// An unknown target fails naming it.
	tgt, err := c.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "v.py", Module: vadd, Target: "cpu -mfoo=1"})
	check.NoError(t, err)
	_, err = c.WaitBuild(ctx, tgt.ID, nil)
	check.Error(t, err, "mfoo")

	// /metrics counts the builds, with the Go and process series.
	_, body := httpGet(t, "http://"+metricsAddr+"/metrics")
	for _, want := range []string{
		`kiln_compiler_builds_total{outcome="succeeded"} 1` + "\n",
		`kiln_compiler_builds_total{outcome="failed"} 2` + "\n",
		"kiln_compiler_build_duration_seconds_count 3\n",
		"kiln_compiler_builds_running 0\n",
		"\ngo_goroutines ", "\nprocess_resident_memory_bytes ",
	} {
		check.True(t, strings.Contains(body, want), "missing", want, "in", body)
	}
	// Registered: live and ready.
	for _, path := range []string{"/healthz", "/readyz"} {
		code, body := httpGet(t, "http://"+metricsAddr+path)
		check.Equal(t, code, http.StatusOK, path, body)
	}
}

// nodeFleet runs a tracker with cfg (on loopback, with a token unless cfg
// has one) and a compiler node with ncfg (building through this test
// binary unless it names a command), until the test ends, and returns a
// client of the tracker.
func nodeFleet(t *testing.T, ctx context.Context, cfg tracker.Config, ncfg compilernode.Config) *client.Tracker {
	t.Helper()
	cfg.Listen, cfg.DataDir = "127.0.0.1:0", t.TempDir()
	if cfg.Token == "" {
		cfg.Token = "s3cret"
	}
	tr, err := tracker.New(cfg)
	check.NoError(t, err)
	trDone := make(chan error, 1)
	go func() { trDone <- tr.Run(ctx) }()
	t.Cleanup(func() { check.NoError(t, tr.Close()); <-trDone })

	if ncfg.Command == nil {
		t.Setenv("KILN_TEST_NODE_JOB", "1")
		exe, err := os.Executable()
		check.NoError(t, err)
		ncfg.Command, ncfg.JobEnv = []string{exe}, []string{"KILN_TEST_NODE_JOB=1"}
	}
	if ncfg.WorkDir == "" {
		ncfg.WorkDir = t.TempDir()
	}
	if ncfg.JobTimeout == 0 {
		ncfg.JobTimeout = 30 * time.Second
	}
	opts := client.TrackerOptions{Token: cfg.Token}
	ready := make(chan struct{})
	nctx, ncancel := context.WithCancel(ctx)
	nodeDone := make(chan error, 1)
	ncfg.Tracker, ncfg.Options, ncfg.Ready = tr.Addr(), opts, ready
	go func() { nodeDone <- compilernode.Run(nctx, ncfg) }()
	select {
	case <-ready:
		t.Cleanup(func() { ncancel(); check.NoError(t, <-nodeDone) })
	case err := <-nodeDone:
		ncancel()
		t.Fatalf("node stopped: %v", err)
	}
	c, err := client.DialTracker(ctx, tr.Addr(), opts)
	check.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// checkVadd checks that the artifact sha downloads and holds vadd.
func checkVadd(t *testing.T, ctx context.Context, c *client.Tracker, sha string) {
	t.Helper()
	var buf bytes.Buffer
	_, err := c.DownloadArtifact(ctx, sha, &buf)
	check.NoError(t, err)
	a, err := artifact.Read(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	check.NoError(t, err)
	_, ok := a.Function("vadd")
	check.True(t, ok, "artifact lacks vadd:", a.Manifest.Functions)
}

// httpGet returns the status and body of a GET.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	check.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	check.NoError(t, err)
	return resp.StatusCode, string(body)
}

// TestNodeNotReadyWithoutTracker: a node whose tracker cannot be reached
// is alive (/healthz) but not ready (/readyz), naming the tracker.
func TestNodeNotReadyWithoutTracker(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	gone := freeAddr(t) // nothing listens there
	metricsAddr := freeAddr(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	done := make(chan error, 1)
	go func() {
		done <- compilernode.Run(ctx, compilernode.Config{Tracker: gone, Command: []string{"true"}, WorkDir: t.TempDir(), MetricsListen: metricsAddr,
			Logger: quiet, Options: client.TrackerOptions{Logger: quiet}})
	}()
	defer func() { cancel(); check.NoError(t, <-done) }()
	var code int
	var body string
	deadline := time.Now().Add(30 * time.Second) // a bound on the wait, not a speed threshold
	for time.Now().Before(deadline) && !strings.Contains(body, "not connected to tracker "+gone) {
		time.Sleep(20 * time.Millisecond)
		if resp, err := http.Get("http://" + metricsAddr + "/readyz"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			code, body = resp.StatusCode, string(b)
		}
	}
	check.Equal(t, code, http.StatusServiceUnavailable, body)
	check.True(t, strings.Contains(body, "not connected to tracker "+gone), body)
	code, body = httpGet(t, "http://"+metricsAddr+"/healthz")
	check.Equal(t, code, http.StatusOK, body)
}

// freeAddr returns a loopback address that was free a moment ago.
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// TestNodeHidesItsPaths runs a job command that fails naming its job
// directory: the error and log the client gets name "<job>" instead of the
// node's paths.
func TestNodeHidesItsPaths(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	work := t.TempDir()
	c := commandNode(t, ctx, work, "/bin/sh", "-c", `echo "compiling in $0/module.py"; echo "no luck in $0" >&2; exit 1`)
	job, err := c.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "v.py", Module: vadd, Target: "cpu"})
	check.NoError(t, err)
	_, err = c.WaitBuild(ctx, job.ID, nil)
	check.ErrorIs(t, err, client.ErrBuildFailed)
	check.Error(t, err, "no luck in <job>")
	got, err := c.BuildStatus(ctx, job.ID)
	check.NoError(t, err)
	check.True(t, strings.Contains(got.Log, "compiling in <job>/module.py"), got.Log)
	for _, text := range []string{got.Error, got.Log} {
		check.True(t, !strings.Contains(text, work), "the node's work directory reached the client:", text)
	}
}

// TestNodeCrossToolchains: a node given a --toolchain for a triple
// advertises it and gets that triple's jobs; the compiler's stderr reaches
// the client when it fails; a triple no node builds fails at submit.
func TestNodeCrossToolchains(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr, err := tracker.New(tracker.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir()})
	check.NoError(t, err)
	trDone := make(chan error, 1)
	go func() { trDone <- tr.Run(ctx) }()
	defer func() { check.NoError(t, tr.Close()); <-trDone }()

	// A "cross compiler" that builds the probe but fails on real work.
	cc := filepath.Join(t.TempDir(), "mips-linux-gnu-gcc")
	check.NoError(t, os.WriteFile(cc, []byte(`#!/bin/sh
case "$*" in
*-fvisibility=hidden*) echo "mips-linux-gnu-gcc: internal compiler error: Segmentation fault (program cc1)" >&2; exit 4 ;;
esac
exec cc "$@"
`), 0o755))
	t.Setenv("KILN_TEST_NODE_JOB", "1")
	exe, err := os.Executable()
	check.NoError(t, err)
	ready := make(chan struct{})
	nctx, ncancel := context.WithCancel(ctx)
	nodeDone := make(chan error, 1)
	go func() {
		nodeDone <- compilernode.Run(nctx, compilernode.Config{Tracker: tr.Addr(), Command: []string{exe}, JobEnv: []string{"KILN_TEST_NODE_JOB=1"}, WorkDir: t.TempDir(), Ready: ready, JobTimeout: 30 * time.Second,
			Toolchains: map[string]string{"mips-linux-gnu": cc}})
	}()
	defer func() { ncancel(); check.NoError(t, <-nodeDone) }()
	select {
	case <-ready:
	case err := <-nodeDone:
		t.Fatalf("node stopped: %v", err)
	}
	c, err := client.DialTracker(ctx, tr.Addr(), client.TrackerOptions{})
	check.NoError(t, err)
	defer c.Close()
	sum, err := c.Query(ctx, 0)
	check.NoError(t, err)
	check.Equal(t, len(sum.Compiler), 1)
	attrs := sum.Compiler[0].Attrs
	check.True(t, slices.Contains(attrs.Targets, "cpu -mtriple=mips-linux-gnu"), attrs.Targets)
	check.True(t, slices.Contains(attrs.CrossCompilers, "mips-linux-gnu"), attrs.CrossCompilers)
	check.True(t, attrs.Triple != "", "the node's own triple")

	job, err := c.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "v.py", Module: vadd, Target: "cpu -mtriple=mips-linux-gnu"})
	check.NoError(t, err)
	_, err = c.WaitBuild(ctx, job.ID, nil)
	check.ErrorIs(t, err, client.ErrBuildFailed)
	check.Error(t, err, "internal compiler error: Segmentation fault (program cc1)")

	job, err = c.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "v.py", Module: vadd, Target: "cpu -mtriple=sparc64-linux-gnu"})
	check.NoError(t, err)
	check.Equal(t, job.State, proto.JobFailed)
	_, err = c.WaitBuild(ctx, job.ID, nil)
	check.Error(t, err, `no compiler node can build target "cpu -mtriple=sparc64-linux-gnu"; nodes serve: `, "cpu -mtriple=mips-linux-gnu")

	// A --toolchain that cannot build stops the node, with what it printed.
	bad := filepath.Join(t.TempDir(), "bad-gcc")
	check.NoError(t, os.WriteFile(bad, []byte("#!/bin/sh\necho 'bad-gcc: no such sysroot /opt/none' >&2\nexit 1\n"), 0o755))
	err = compilernode.Run(ctx, compilernode.Config{Tracker: tr.Addr(), Command: []string{exe}, Toolchains: map[string]string{"aarch64-linux-gnu": bad}})
	check.Error(t, err, "--toolchain aarch64-linux-gnu="+bad, "bad-gcc: no such sysroot /opt/none")
}

// TestNodeKillsBuildAtLimit: a job past its run limit fails saying so,
// and the processes its command started (a C compiler) die with it.
func TestNodeKillsBuildAtLimit(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc to see the processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	c := commandNode(t, ctx, t.TempDir(), "/bin/sh", "-c", `sleep 300 & echo $! > "$1.tmp" && mv "$1.tmp" "$1"; wait`, "job", pidFile)
	job, err := c.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "v.py", Module: vadd, Target: "cpu", RunTimeout: 300 * time.Millisecond})
	check.NoError(t, err)
	_, err = c.WaitBuild(ctx, job.ID, nil)
	check.ErrorIs(t, err, client.ErrBuildFailed)
	check.Error(t, err, "300ms")
	var pid int
	for pid == 0 {
		b, rerr := os.ReadFile(pidFile)
		if rerr == nil {
			pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
			check.NoError(t, err)
		} else if ctx.Err() != nil {
			t.Fatal("the job command did not start its child")
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
	for running(pid) {
		if ctx.Err() != nil {
			t.Fatalf("the job's child %d outlived the job's limit", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// running reports whether process pid runs (a zombie that no one reaps
// does not).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// commandNode starts a tracker and a compiler node whose job command is
// command (given the job directory after its arguments), working in
// work, until the test ends; it returns a client of the tracker.
func commandNode(t *testing.T, ctx context.Context, work string, command ...string) *client.Tracker {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	tr, err := tracker.New(tracker.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir()})
	check.NoError(t, err)
	trDone := make(chan error, 1)
	go func() { trDone <- tr.Run(ctx) }()
	ready := make(chan struct{})
	nodeDone := make(chan error, 1)
	go func() {
		nodeDone <- compilernode.Run(ctx, compilernode.Config{Tracker: tr.Addr(), WorkDir: work, Ready: ready, Command: command})
	}()
	c, err := client.DialTracker(ctx, tr.Addr(), client.TrackerOptions{})
	check.NoError(t, err)
	t.Cleanup(func() {
		c.Close()
		cancel()
		check.NoError(t, <-nodeDone)
		check.NoError(t, tr.Close())
		<-trDone
	})
	select {
	case <-ready:
	case err := <-nodeDone:
		nodeDone <- err
		t.Fatalf("node stopped: %v", err)
	}
	return c
}

// lines yields n bytes of comment lines.
type lines struct{ n, off int64 }

var commentLine = "# " + strings.Repeat("c", 61) + "\n" // 64 bytes

func (l *lines) Read(p []byte) (int, error) {
	if l.off >= l.n {
		return 0, io.EOF
	}
	k := 0
	for k < len(p) && l.off < l.n {
		p[k] = commentLine[l.off%int64(len(commentLine))]
		k++
		l.off++
	}
	return k, nil
}

// TestNodeBuildsStreamedModule: a module of 200 MiB (2 MiB under the race
// detector), over the one frame of 64 MiB that carried every module
// before, streams from the client (which never holds it) through the
// tracker's module store to the compiler node, and builds, where the
// tracker's --max-module-size allows it; with the default limit a 200 MiB
// one is refused naming that limit.
func TestNodeBuildsStreamedModule(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const size = streamedModuleSize
	c := nodeFleet(t, ctx, tracker.Config{MaxModuleSize: 256 << 20, MaxQueuedBytes: 512 << 20}, compilernode.Config{JobTimeout: 2 * time.Minute})
	body := io.MultiReader(strings.NewReader(vadd), &lines{n: size - int64(len(vadd))})
	job, err := c.SubmitBuildFrom(ctx, proto.BuildSubmitArgs{Name: "vadd-big.py", Target: "cpu"}, size, body)
	check.NoError(t, err)
	check.Equal(t, job.ModuleSize, int64(size))
	job, err = c.WaitBuild(ctx, job.ID, nil)
	check.NoError(t, err)
	check.Equal(t, job.State, proto.JobSucceeded)
	checkVadd(t, ctx, c, job.Artifact)

	// The default limit refuses it before taking a byte, naming the limit.
	dc := nodeFleet(t, ctx, tracker.Config{}, compilernode.Config{})
	_, err = dc.SubmitBuildFrom(ctx, proto.BuildSubmitArgs{Name: "vadd-big.py", Target: "cpu"}, 200<<20, &lines{n: 200 << 20})
	check.ErrorIs(t, err, proto.ErrTooLarge)
	check.Error(t, err, "exceeds the tracker's limit of 33554432", "--max-module-size")
}
