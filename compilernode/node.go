// Package compilernode is the compiler node: a daemon that registers with a
// tracker what it can build, takes build jobs from the tracker's queue,
// builds each one in a subprocess under a timeout, uploads the artifact and
// reports the job done, or failed with the compiler's message.
//
// The subprocess is the same binary run as a job runner (RunJob reads a job
// directory and writes the artifact there), so a compiler crash or a hung C
// compiler costs one job, never the node. compilernode imports the compiler and the
// client SDK; nothing but cli imports it.
package compilernode

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler/toolchain"
	"github.com/kiln-ml/kiln/internal/metrics"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// Config configures a compiler node.
type Config struct {
	// Tracker is the tracker's address; Options its token and TLS.
	Tracker string
	Options client.TrackerOptions
	// Command runs one job: the job directory is appended as the last
	// argument (see RunJob). Required.
	Command []string
	// WorkDir holds the job directories (a temporary directory when empty).
	WorkDir string
	// Concurrency is the number of jobs built at once (1 when 0).
	Concurrency int
	// JobTimeout bounds one build when the job carries no run timeout
	// (10 minutes when 0).
	JobTimeout time.Duration
	// Targets lists what this node builds ("cpu" when empty). A node that
	// builds cpu also advertises "cpu -mtriple=TRIPLE" for every cross
	// compiler it finds (toolchain.Discover).
	Targets []string
	// Toolchains are configured C compilers by target triple
	// ("aarch64-linux-gnu" → "/opt/cross/bin/aarch64-linux-gnu-gcc", or
	// "clang --target=aarch64-linux-gnu"); they win over those found on
	// PATH, and one that cannot build a shared object stops the node.
	Toolchains map[string]string
	// Version is the kiln version reported to the tracker.
	Version string
	// Logger receives the node's logs (slog.Default() when nil).
	Logger *slog.Logger
	// Ready, when set, is closed once the node is registered.
	Ready chan<- struct{}
	// Sandbox is how build jobs are confined: SandboxAuto (when empty),
	// SandboxBwrap or SandboxOff. In the sandbox (internal/sandbox) a job
	// sees the system's programs and libraries, the job command and the
	// configured toolchains read-only and its job directory, the one
	// writable place; it has no network, no capabilities and, on a node
	// run as root, a uid of its own (never root).
	Sandbox string
	// JobEnv are NAME=VALUE variables added to a build job's environment,
	// which holds otherwise only PATH, HOME, TMPDIR, CC and
	// LD_LIBRARY_PATH: never put a secret there.
	JobEnv []string
	// MaxJobMemory caps a build job's address space in bytes
	// (DefaultMaxJobMemory when 0; no cap when negative). MaxJobProcs caps
	// its processes where it runs as a uid of its own (DefaultMaxJobProcs
	// when 0; no cap when negative). A job's CPU time is capped at its
	// timeout.
	MaxJobMemory int64
	MaxJobProcs  int
	// MetricsListen, when set, is the HTTP address serving Prometheus
	// /metrics: builds by outcome, build durations, builds running, and
	// the Go runtime's and the process's series.
	MetricsListen string
}

// JobFile is the name of the job description in a job directory.
const JobFile = "job.json"

// ModuleFile, ArtifactFile and ErrorFile are the module text the job
// builds, the artifact it writes and the error message it leaves on failure.
const (
	ModuleFile   = "module.py"
	ArtifactFile = "out.kiln"
	ErrorFile    = "error.txt"
)

// Job is what a job subprocess reads from JobFile.
type Job struct {
	ID      string            `json:"id"`
	Name    string            `json:"name"`
	Target  string            `json:"target"`
	Format  string            `json:"format"`
	Options map[string]string `json:"options,omitempty"`
	// CC is the C compiler command the node chose for the target's
	// triple ("" for the host's); never the client's.
	CC string `json:"cc,omitempty"`
}

// Run registers the node and serves build jobs until ctx is cancelled.
func Run(ctx context.Context, cfg Config) error {
	if len(cfg.Command) == 0 {
		return errors.New("compiler node: no job command configured")
	}
	if cfg.Tracker == "" {
		return errors.New("compiler node: no tracker address")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	if cfg.JobTimeout <= 0 {
		cfg.JobTimeout = 10 * time.Minute
	}
	work := cfg.WorkDir
	if work != "" {
		// Jobs run in their own directories: keep the path absolute.
		abs, err := filepath.Abs(work)
		if err != nil {
			return fmt.Errorf("compiler node: work directory: %w", err)
		}
		work = abs
		if err := os.MkdirAll(work, 0o755); err != nil {
			return fmt.Errorf("compiler node: work directory: %w", err)
		}
	} else {
		d, err := os.MkdirTemp("", "kiln-compiler-")
		if err != nil {
			return fmt.Errorf("compiler node: %w", err)
		}
		defer os.RemoveAll(d)
		work = d
	}
	for _, kv := range cfg.JobEnv {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fmt.Errorf("compiler node: --job-env %q: want NAME=VALUE", kv)
		}
	}
	jl, err := newJail(ctx, cfg, work)
	if err != nil {
		return err
	}
	if jl.bwrap != "" {
		log.Info("build jobs are sandboxed with bubblewrap: no network, no capabilities, only the job directory writable",
			"own_uids", jl.uids != nil, "max_job_memory", jl.memory, "max_job_procs", jl.procs)
	} else {
		log.Warn("build jobs are not sandboxed: they run as the node's user, in its namespaces", "why", jl.why)
	}
	n := &node{cfg: cfg, log: log, work: work, m: newNodeMetrics(), jail: jl}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	if cfg.MetricsListen != "" {
		stop, err := n.serveMetrics()
		if err != nil {
			return err
		}
		defer stop()
	}
	disc, err := toolchain.Discover(ctx, cfg.Toolchains)
	if err != nil {
		return fmt.Errorf("compiler node: %w", err)
	}
	for _, s := range disc.Skipped {
		log.Warn("C compiler left out", "why", s)
	}
	n.disc = disc
	attrs := Attrs(ctx, cfg.Targets, disc)
	cfg.Targets = attrs.Targets
	attrs.KilnVersion = cfg.Version
	reg := client.NewRegistrar(cfg.Tracker, cfg.Options, proto.RegisterArgs{Role: proto.NodeCompiler, Attrs: attrs})
	n.reg = reg
	n.registrar.Store(reg)
	regErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		regErr <- reg.Run(ctx)
	}()
	select {
	case <-reg.Ready():
	case err := <-regErr:
		cancel()
		wg.Wait()
		if err == nil { // ctx ended before the first registration
			return nil
		}
		return fmt.Errorf("compiler node: %w", err)
	case <-ctx.Done():
		wg.Wait()
		return nil
	}
	log.Info("compiler node registered", "tracker", cfg.Tracker, "node", reg.NodeID(), "targets", cfg.Targets, "triple", attrs.Triple, "compiler", attrs.Compiler)
	if cfg.Ready != nil {
		close(cfg.Ready)
	}
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.loop(ctx)
		}()
	}
	wg.Wait()
	select {
	case err := <-regErr:
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("compiler node: %w", err)
		}
	default:
	}
	return nil
}

type node struct {
	cfg Config
	reg *client.Registrar
	// registrar is reg for the readiness probe, which runs before reg is
	// made (C compilers are found first).
	registrar atomic.Pointer[client.Registrar]
	log       *slog.Logger
	work      string
	m         nodeMetrics
	disc      toolchain.Discovery
	jail      *jail
}

// nodeMetrics are the compiler node's Prometheus metrics.
type nodeMetrics struct {
	reg      *metrics.Registry
	builds   *metrics.Counter
	duration *metrics.Histogram
	running  *metrics.Gauge
}

func newNodeMetrics() nodeMetrics {
	r := metrics.NewRegistry()
	return nodeMetrics{
		reg:    r,
		builds: r.Counter("kiln_compiler_builds_total", "Build jobs this node finished, by outcome (succeeded: an artifact was built; failed).", "outcome"),
		duration: r.Histogram("kiln_compiler_build_duration_seconds", "Time from taking a build job to reporting its outcome.",
			[]float64{0.1, 0.5, 1, 5, 10, 30, 60, 300, 600}),
		running: r.Gauge("kiln_compiler_builds_running", "Build jobs being built now."),
	}
}

// ready is the node's readiness: registered with the tracker over a live
// connection.
func (n *node) ready() error {
	reg := n.registrar.Load()
	if reg == nil {
		return errors.New("finding C compilers; not registered with the tracker yet")
	}
	return reg.Connected()
}

// serveMetrics listens on cfg.MetricsListen and serves /metrics until stop
// is called.
func (n *node) serveMetrics() (stop func(), err error) {
	ln, err := net.Listen("tcp", n.cfg.MetricsListen)
	if err != nil {
		return nil, fmt.Errorf("compiler node: metrics listen %s: %w", n.cfg.MetricsListen, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", n.m.reg.Handler())
	metrics.HandleHealth(mux, n.ready)
	srv := metrics.NewServer(mux)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := metrics.Serve(srv, ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("compiler node metrics", "err", err)
		}
	}()
	n.log.Info("compiler node metrics", "addr", ln.Addr().String())
	return func() {
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		srv.Shutdown(sctx)
		<-done
	}, nil
}

// loop takes and builds jobs until ctx ends.
func (n *node) loop(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		job, err := n.reg.TakeJob(ctx, 5*time.Second)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			n.log.Warn("take build job", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		if job == nil {
			continue
		}
		n.serve(ctx, job)
	}
}

// serve builds one job and reports the outcome to the tracker.
func (n *node) serve(ctx context.Context, job *proto.BuildJob) {
	log := n.log.With("job", job.ID, "name", job.Name, "target", job.Target)
	start := time.Now()
	n.m.running.Add(1)
	sha, logText, err := n.build(ctx, job)
	n.m.running.Add(-1)
	if ctx.Err() != nil {
		return // shutting down: the tracker requeues the job when we go
	}
	// The metrics change before the tracker hears the outcome, so whoever
	// waits for the job sees them.
	n.m.duration.Observe(time.Since(start).Seconds())
	if err != nil {
		n.m.builds.Inc("failed")
		log.Info("build failed", "err", err, "took", time.Since(start))
		if ferr := n.reg.FailJob(ctx, job.ID, err.Error(), logText); ferr != nil {
			log.Warn("report failed build", "err", ferr)
		}
		return
	}
	n.m.builds.Inc("succeeded")
	if cerr := n.reg.CompleteJob(ctx, job.ID, sha, logText); cerr != nil {
		log.Warn("report finished build", "err", cerr)
		return
	}
	log.Info("built", "artifact", sha, "took", time.Since(start))
}

// build runs the job subprocess and uploads the artifact. The error and
// the log it returns go to the tracker and the client: the node's own paths
// in them (its work directory) are replaced by "<job>" and "<work>".
func (n *node) build(ctx context.Context, job *proto.BuildJob) (sha, logText string, err error) {
	dir, err := os.MkdirTemp(n.work, "job-")
	if err != nil {
		n.log.Error("build job directory", "err", err)
		return "", "", errors.New("compiler node: cannot create a job directory")
	}
	defer os.RemoveAll(dir)
	hide := strings.NewReplacer(dir, "<job>", n.work, "<work>")
	sha, logText, err = n.buildIn(ctx, job, dir)
	if err != nil {
		err = errors.New(hide.Replace(err.Error()))
	}
	return sha, hide.Replace(logText), err
}

// buildIn is build in the job directory dir.
func (n *node) buildIn(ctx context.Context, job *proto.BuildJob, dir string) (sha, logText string, err error) {
	spec := Job{ID: job.ID, Name: job.Name, Target: job.Target, Format: job.Format, Options: job.Options}
	if triple := proto.TargetTriple(job.Target); triple != "" {
		cc, ok := n.disc.For(triple, proto.SameTriple)
		if !ok {
			return "", "", fmt.Errorf("this compiler node has no C compiler for %s (it builds for %s); give it one with kiln compiler --toolchain %s=COMMAND",
				triple, strings.Join(n.triples(), ", "), triple)
		}
		spec.CC = cc
	}
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, JobFile), b, 0o644); err != nil {
		return "", "", err
	}
	if proto.StoredFormat(job.Format) {
		// The module is in the artifact store: fetch it (the job
		// subprocess reads its raw bytes for these formats).
		if err := n.fetchModel(ctx, job.Module, filepath.Join(dir, ModuleFile)); err != nil {
			return "", "", err
		}
	} else if job.Module == "" && job.ModuleSize > 0 {
		// A module too large to come inline is streamed from the
		// tracker's module store into the job directory.
		if err := n.fetchModule(ctx, job, filepath.Join(dir, ModuleFile)); err != nil {
			return "", "", err
		}
	} else if err := os.WriteFile(filepath.Join(dir, ModuleFile), []byte(job.Module), 0o644); err != nil {
		return "", "", err
	}
	timeout := job.RunTimeout
	if timeout <= 0 {
		timeout = n.cfg.JobTimeout
	}
	_ = n.reg.JobProgress(ctx, job.ID, 0.1, "compiling")
	jctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	uid, err := n.jail.take(jctx)
	if err != nil {
		return "", "", err
	}
	defer n.jail.give(uid)
	argv, err := n.jail.command(dir, uid, int64(timeout/time.Second)+1, n.cfg.Command)
	if err != nil {
		return "", "", err
	}
	cmd := exec.CommandContext(jctx, argv[0], argv[1:]...)
	cmd.Env = jobEnv(n.cfg, dir, n.jail.bwrap != "")
	var out bytes.Buffer
	// The job's stages become its progress, between "compiling" (0.1)
	// and "uploading" (0.9).
	seen := 0
	so := &stageScanner{out: &out, stage: func(name string) {
		seen++
		_ = n.reg.JobProgress(ctx, job.ID, 0.1+0.8*float64(min(seen, 7))/8, name)
	}}
	cmd.Stdout, cmd.Stderr = so, so
	cmd.WaitDelay = 5 * time.Second
	ownGroup(cmd)
	runErr := cmd.Run()
	logText = tail(out.String(), 16<<10)
	if jctx.Err() == context.DeadlineExceeded && ctx.Err() == nil {
		return "", logText, fmt.Errorf("build did not finish within %s", timeout)
	}
	if runErr != nil {
		msg, rerr := os.ReadFile(filepath.Join(dir, ErrorFile))
		if rerr == nil && len(msg) > 0 {
			return "", logText, errors.New(strings.TrimSpace(string(msg)))
		}
		return "", logText, fmt.Errorf("build process: %v: %s", runErr, strings.TrimSpace(tail(out.String(), 4<<10)))
	}
	art := filepath.Join(dir, ArtifactFile)
	sha, size, err := client.FileSHA256(art)
	if err != nil {
		return "", logText, fmt.Errorf("build wrote no artifact: %w", err)
	}
	_ = n.reg.JobProgress(ctx, job.ID, 0.9, "uploading")
	f, err := os.Open(art)
	if err != nil {
		return "", logText, err
	}
	defer f.Close()
	if err := n.reg.UploadArtifact(ctx, sha, size, f); err != nil {
		return "", logText, fmt.Errorf("upload artifact: %w", err)
	}
	return sha, logText, nil
}

// stageScanner keeps a job subprocess's output and calls stage with the
// name of each stage line (StagePrefix) it writes.
type stageScanner struct {
	out     *bytes.Buffer
	partial []byte
	stage   func(name string)
}

func (s *stageScanner) Write(p []byte) (int, error) {
	s.out.Write(p)
	s.partial = append(s.partial, p...)
	for {
		i := bytes.IndexByte(s.partial, '\n')
		if i < 0 {
			break
		}
		if name, ok := strings.CutPrefix(string(s.partial[:i]), StagePrefix); ok {
			s.stage(name)
		}
		s.partial = s.partial[i+1:]
	}
	if len(s.partial) > 1<<16 {
		s.partial = nil // a long line without a newline is not a stage
	}
	return len(p), nil
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// triples lists the triples this node builds for.
func (n *node) triples() []string {
	var out []string
	if n.disc.Host.Triple != "" {
		out = append(out, n.disc.Host.Triple)
	}
	for _, c := range n.disc.Cross {
		out = append(out, c.Triple)
	}
	return out
}

// Attrs describes what this machine can build: the targets (a cpu target
// once more with -mtriple for each cross compiler in d), the host's triple,
// the C compiler's identity, the cross compilers' triples and whether
// NVRTC or nvcc are present.
func Attrs(ctx context.Context, targets []string, d toolchain.Discovery) proto.NodeAttrs {
	if len(targets) == 0 {
		targets = []string{"cpu"}
	}
	a := proto.NodeAttrs{CPUCores: runtime.NumCPU(), Triple: d.Host.Triple}
	cpu := false
	for _, t := range targets {
		a.Targets = append(a.Targets, t)
		cpu = cpu || (proto.TargetKind(t) == "cpu" && proto.TargetTriple(t) == "")
	}
	for _, c := range d.Cross {
		a.CrossCompilers = append(a.CrossCompilers, c.Triple)
		if t := "cpu -mtriple=" + c.Triple; cpu && !slices.Contains(a.Targets, t) {
			a.Targets = append(a.Targets, t)
		}
	}
	if tc, err := toolchain.Find(ctx, toolchain.Options{}); err == nil {
		a.Compiler = tc.Identity()
	}
	if _, err := exec.LookPath("nvcc"); err == nil {
		a.NVCC = true
	}
	for _, pat := range []string{"/usr/lib/*/libnvrtc.so*", "/usr/local/cuda*/lib64/libnvrtc.so*", "/usr/lib64/libnvrtc.so*"} {
		if m, _ := filepath.Glob(pat); len(m) > 0 {
			a.NVRTC = true
			break
		}
	}
	return a
}

// fetchModel downloads the artifact-store entry sha to path and checks
// its digest.
func (n *node) fetchModel(ctx context.Context, sha, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	// Into the file alone, so that a download cut by a tracker failover
	// can start over; the digest is taken from the file afterwards.
	if _, err := n.reg.DownloadArtifact(ctx, sha, f); err != nil {
		f.Close()
		return fmt.Errorf("fetch the model: %w", err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	got, _, err := client.FileSHA256(path)
	if err != nil {
		return fmt.Errorf("fetch the model: %w", err)
	}
	if got != sha {
		return fmt.Errorf("fetch the model: its sha256 is %s, not %s", got, sha)
	}
	return nil
}

// fetchModule streams job's module to path, checked against its size and
// digest.
func (n *node) fetchModule(ctx context.Context, job *proto.BuildJob, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := n.reg.FetchModule(ctx, job, f); err != nil {
		f.Close()
		return fmt.Errorf("fetch the module: %w", err)
	}
	return f.Close()
}
