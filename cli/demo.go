package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"text/tabwriter"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/compilernode"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker"
)

func demoCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "demo",
		Usage:     "run a whole fleet in this process: build the tensor-expression tutorial's matmul remotely, run it, check it, time it",
		UsageText: "kiln demo [--size N] [--keep DIR]",
		Description: `Starts an in-process tracker, compiler node and CPU device daemon on loopback
(127.0.0.1, random ports, a random token), then does what a user of a fleet
does: defines the tensor-expression tutorial's matrix multiply (te.compute with te.sum over k,
s[C].parallel(C.op.axis[0])), submits the build to the tracker's queue, where
the compiler node builds it, leases the device, uploads the artifact, runs the
kernel on random N×N inputs, checks the result against a reference computed
here, times it with the device-side time evaluator, then tunes that matmul's
definition bound to N=M=K=--tune-size (the tutorial's 1024) with kiln tune's
search (kiln tune --shape; --tune-trials candidates built on the compiler node
and timed on the device; 0 skips), shows it before (the tutorial's schedule
at that size) and after, and prints the table.
Everything stops and is removed at the end.

Examples:
   kiln demo
   kiln demo --size 512
   kiln demo --size 64 --tune-size 64 --tune-trials 4`,
		Flags: []ucli.Flag{
			&ucli.IntFlag{Name: "size", Value: 256, Usage: "matrix size N (N×N times N×N)"},
			&ucli.StringFlag{Name: "keep", Usage: "keep the fleet's files (tracker data, artifact) in this directory"},
			&ucli.BoolFlag{Name: "verbose", Usage: "show the daemons' logs"},
			&ucli.IntFlag{Name: "tune-trials", Value: 16, Usage: "then tune the demo's matmul bound to --tune-size with this many candidates (kiln tune's search) and show it before and after; 0 skips"},
			&ucli.IntFlag{Name: "tune-size", Value: 1024, Usage: "the size N=M=K the tuning step binds the matmul to (the tutorial's 1024)"},
		},
		OnUsageError: usageError,
		Action:       runDemo,
	}
}

// demoStep is one line of the demo's table.
type demoStep struct {
	what, result string
	took         time.Duration
}

func runDemo(c *ucli.Context) error {
	if err := noArgs(c); err != nil {
		return err
	}
	n := c.Int("size")
	for _, f := range []string{"size", "tune-size"} {
		if v := c.Int(f); v < 1 || v > 4096 {
			return fmt.Errorf("demo: --%s %d: want 1 to 4096", f, v)
		}
	}
	ctx, cancel := context.WithCancel(c.Context)
	defer cancel()
	out, errw := c.App.Writer, c.App.ErrWriter
	dir := c.String("keep")
	if dir == "" {
		d, err := os.MkdirTemp("", "kiln-demo-")
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if c.Bool("verbose") {
		log = logger(c)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	tokBytes := make([]byte, 16)
	rand.Read(tokBytes)
	tok := hex.EncodeToString(tokBytes)

	var steps []demoStep
	var spin *progress
	begin := func(what string) { spin = startProgress(c, what) }
	defer func() { spin.done() }()
	step := func(what string, start time.Time, format string, a ...any) {
		spin.done()
		spin = nil
		s := demoStep{what: what, result: fmt.Sprintf(format, a...), took: time.Since(start)}
		steps = append(steps, s)
		fmt.Fprintf(errw, "  %s: done in %s\n", s.what, s.took.Round(time.Millisecond))
	}
	fmt.Fprintf(errw, "kiln demo: a tracker, a compiler node and a CPU device daemon on loopback (files in %s)\n", dir)

	start := time.Now()
	begin("starting the fleet")
	fl, err := startFleet(ctx, dir, tok, rpcserver.WorkerSpec{Path: exe}, log)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer fl.stop()
	tc := fl.client
	tr, d := fl.tracker, fl.daemon
	step("fleet up", start, "tracker %s, device daemon %s, compiler node registered", tr.Addr(), d.Addr())

	err = demoMatmul(ctx, tc, tok, n, dir, begin, step)
	if trials := c.Int("tune-trials"); err == nil && trials > 0 {
		err = demoTune(ctx, tc, tok, c.Int("tune-size"), trials, dir, begin, step)
	}
	fleetErr := fl.stop()
	if err != nil {
		return errors.Join(fmt.Errorf("demo: %w", err), fleetErr)
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tRESULT\tTIME")
	for _, s := range steps {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.what, s.result, s.took.Round(time.Millisecond))
	}
	tw.Flush()
	return fleetErr
}

// fleet is an in-process tracker, CPU device daemon (key "cpu") and
// compiler node on loopback.
type fleet struct {
	tracker *tracker.Server
	daemon  *rpcserver.Daemon
	client  *client.Tracker
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	err     error
	once    sync.Once
}

// startFleet starts the fleet with its files under dir and waits until the
// compiler node and the device are registered. worker says how its daemon
// starts session workers; its Path is the kiln binary, which also runs the
// compiler node's jobs.
func startFleet(ctx context.Context, dir, tok string, worker rpcserver.WorkerSpec, log *slog.Logger) (_ *fleet, err error) {
	ctx, cancel := context.WithCancel(ctx)
	fl := &fleet{cancel: cancel}
	defer func() {
		if err != nil {
			err = errors.Join(err, fl.stop())
		}
	}()
	run := func(name string, f func() error) {
		fl.wg.Add(1)
		go func() {
			defer fl.wg.Done()
			if err := f(); err != nil && ctx.Err() == nil {
				fl.mu.Lock()
				fl.err = errors.Join(fl.err, fmt.Errorf("%s: %w", name, err))
				fl.mu.Unlock()
				cancel()
			}
		}()
	}
	fl.tracker, err = tracker.New(tracker.Config{Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, "tracker"), Token: tok, Logger: log})
	if err != nil {
		return fl, fmt.Errorf("tracker: %w", err)
	}
	run("tracker", func() error { return fl.tracker.Run(ctx) })
	topts := client.TrackerOptions{Token: tok, Logger: log}
	fl.daemon, err = rpcserver.New(rpcserver.Config{Listen: "127.0.0.1:0", Key: "cpu", Token: tok, Dir: filepath.Join(dir, "sessions"),
		Version: Version(), Logger: log, Worker: worker})
	if err != nil {
		return fl, fmt.Errorf("device daemon: %w", err)
	}
	reg := client.NewRegistrar(fl.tracker.Addr(), topts, proto.RegisterArgs{
		Role: proto.NodeDevice, Key: "cpu", Addr: fl.daemon.Addr().String(), Attrs: rpcserver.NodeAttrs(Version()),
	})
	reg.OnHealthCheck = deviceHealthCheck
	fl.daemon.SetTracker(reg)
	run("device daemon", func() error { return fl.daemon.Run(ctx) })
	ready := make(chan struct{})
	run("compiler node", func() error {
		return compilernode.Run(ctx, compilernode.Config{Tracker: fl.tracker.Addr(), Options: topts, Command: []string{worker.Path, "compiler-job"},
			WorkDir: filepath.Join(dir, "compiler"), Ready: ready, Version: Version(), Logger: log})
	})
	if fl.client, err = client.DialTracker(ctx, fl.tracker.Addr(), topts); err != nil {
		return fl, err
	}
	if err := waitFleet(ctx, fl.client, ready); err != nil {
		return fl, err
	}
	return fl, nil
}

// stop stops every part and waits for them; it returns what failed while
// they ran. It may be called more than once.
func (fl *fleet) stop() error {
	fl.once.Do(func() {
		if fl.client != nil {
			fl.client.Close()
		}
		fl.cancel()
		fl.wg.Wait()
	})
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.err
}

// waitFleet waits for the compiler node and a free cpu device.
func waitFleet(ctx context.Context, tc *client.Tracker, nodeReady <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	select {
	case <-nodeReady:
	case <-ctx.Done():
		return fmt.Errorf("compiler node did not register: %w", ctx.Err())
	}
	for {
		s, err := tc.Query(ctx, 0)
		if err != nil {
			return err
		}
		for _, k := range s.Keys {
			if k.Key == "cpu" && k.Free > 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("device daemon did not register: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// teMatmulDef is the tensor-expression tutorial's matmul, unscheduled:
// C[i, j] = sum over k of A[i, k] * B[k, j] with symbolic N, M, K.
func teMatmulDef() (*ir.PrimFunc, error) {
	N, M, K := te.Var("N"), te.Var("M"), te.Var("K")
	A := te.Placeholder([]ir.Expr{N, K}, ir.Float32, "A")
	B := te.Placeholder([]ir.Expr{K, M}, ir.Float32, "B")
	k := te.ReduceAxis(ir.RangeFromExtent(K), "k")
	C := te.Compute([]ir.Expr{N, M}, func(i, j ir.Expr) ir.Expr {
		return te.Sum(ir.Mul(A.At(i, k), B.At(k, j)), k)
	}, "C")
	f, err := te.CreatePrimFunc([]*te.Tensor{A, B, C})
	if err != nil {
		return nil, err
	}
	return f.WithAttr(ir.AttrGlobalSymbol, "matrix_multiply"), nil
}

// teMatmulScheduled is the tutorial's matmul with its schedule,
// s[C].parallel(C.op.axis[0]), and the schedule's trace.
func teMatmulScheduled() (*ir.PrimFunc, []string, error) {
	f, err := teMatmulDef()
	if err != nil {
		return nil, nil, err
	}
	s, err := schedule.New(f)
	if err != nil {
		return nil, nil, err
	}
	blk, err := s.GetBlock("C")
	if err != nil {
		return nil, nil, err
	}
	loops, err := s.GetLoops(blk)
	if err != nil {
		return nil, nil, err
	}
	if err := s.Parallel(loops[0]); err != nil {
		return nil, nil, err
	}
	return s.Func(), s.Trace(), nil
}

// teMatmul is the tutorial's scheduled matmul as TVMScript, and its trace.
func teMatmul() (string, []string, error) {
	f, trace, err := teMatmulScheduled()
	if err != nil {
		return "", nil, err
	}
	return script.Print(f), trace, nil
}

// demoMatmul builds, runs, checks and times the matmul on the fleet.
func demoMatmul(ctx context.Context, tc *client.Tracker, tok string, n int, dir string, begin func(string), step func(string, time.Time, string, ...any)) error {
	start := time.Now()
	src, trace, err := teMatmul()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "matmul.py"), []byte(src), 0o644); err != nil {
		return err
	}
	step("define", start, "TVM's tensor-expression tutorial matmul, schedule: %v", trace)

	start = time.Now()
	begin("build: queued at the tracker, built by the compiler node")
	job, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "matmul.py", Module: src, Target: "cpu"})
	if err != nil {
		return err
	}
	job, err = tc.WaitBuild(ctx, job.ID, nil)
	if err != nil {
		return err
	}
	var art bytes.Buffer
	if _, err := tc.DownloadArtifact(ctx, job.Artifact, &art); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "matmul.kiln"), art.Bytes(), 0o644); err != nil {
		return err
	}
	step("build (queued)", start, "job %s %s on %s, artifact %d bytes", job.ID, job.State, job.Node, art.Len())

	start = time.Now()
	begin("lease a device and upload the artifact")
	lease, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "cpu", User: "kiln demo"})
	if err != nil {
		return err
	}
	defer lease.Release(context.WithoutCancel(ctx))
	s, err := client.Connect(ctx, lease.Addr, client.SessionOptions{Token: tok, LeaseToken: lease.Token})
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.Upload(ctx, "matmul.kiln", art.Bytes()); err != nil {
		return err
	}
	mod, err := s.LoadModule(ctx, "matmul.kiln")
	if err != nil {
		return err
	}
	f, err := mod.GetFunction(ctx, "matrix_multiply")
	if err != nil {
		return err
	}
	step("lease + upload", start, "lease %s on %s, module loaded", lease.ID, lease.Addr)

	start = time.Now()
	begin(fmt.Sprintf("run %d×%d×%d on the device and check it", n, n, n))
	rng := mrand.New(mrand.NewPCG(3, 3))
	a, b := make([]float32, n*n), make([]float32, n*n)
	for i := range a {
		a[i], b[i] = rng.Float32(), rng.Float32()
	}
	shape := ndarray.Shape{int64(n), int64(n)}
	ha, err := ndarray.FromSlice(a, shape)
	if err != nil {
		return err
	}
	hb, err := ndarray.FromSlice(b, shape)
	if err != nil {
		return err
	}
	var remote [3]*client.Array
	for i := range remote {
		if remote[i], err = s.Empty(ctx, shape, ndarray.Float32, devices.CPUDevice); err != nil {
			return err
		}
	}
	if err := s.CopyFrom(ctx, remote[0], ha); err != nil {
		return err
	}
	if err := s.CopyFrom(ctx, remote[1], hb); err != nil {
		return err
	}
	if _, err := f.Call(ctx, remote[0], remote[1], remote[2]); err != nil {
		return err
	}
	hc, err := s.CopyTo(ctx, remote[2])
	if err != nil {
		return err
	}
	got, err := ndarray.ToSlice[float32](hc)
	if err != nil {
		return err
	}
	maxRel := 0.0
	for i := range n {
		for j := range n {
			var want float64
			for k := range n {
				want += float64(a[i*n+k]) * float64(b[k*n+j])
			}
			rel := math.Abs(float64(got[i*n+j])-want) / math.Max(math.Abs(want), 1e-6)
			maxRel = max(maxRel, rel)
		}
	}
	if maxRel > 1e-4 {
		return fmt.Errorf("remote result differs from the reference: max relative error %.3g", maxRel)
	}
	step("run + check", start, "%d×%d×%d on the device, max relative error %.2g vs reference", n, n, n, maxRel)

	start = time.Now()
	begin("time it on the device (5 repeats of at least 50 ms)")
	res, err := s.TimeEvaluator(ctx, f, client.TimeOptions{Number: 1, Repeat: 5, MinRepeatMS: 50}, remote[0], remote[1], remote[2])
	if err != nil {
		return err
	}
	gflops := 2 * float64(n) * float64(n) * float64(n) / res.Median / 1e9
	step("time (device side)", start, "median %s (mean %s, min %s, max %s, std %s) over %d repeats of %d: %.2f GFLOPS",
		fmtSeconds(res.Median), fmtSeconds(res.Mean), fmtSeconds(res.Min), fmtSeconds(res.Max), fmtSeconds(res.Std),
		len(res.Results), res.Number, gflops)
	return nil
}
