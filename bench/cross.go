package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/toolchain"
	"github.com/kiln-ml/kiln/compilernode"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/tracker"
)

func init() {
	register(benchmark{
		name: "cross",
		summary: "cross-compile time and artifact size of the scheduled 1024³ matmul per triple (vs native), " +
			"and a remote build-and-run on an emulated ARM64 board (vs a native board daemon)",
		run: runCross,
	})
}

// crossTarget is one target's cold build of the scheduled matmul.
type crossTarget struct {
	Target string `json:"target"`
	CC     string `json:"cc,omitempty"`
	// ColdMS is compiler.Build from an empty cache; LowerMS and CCMS its
	// lowering and C compiler parts (medians).
	ColdMS  float64 `json:"cold_ms,omitempty"`
	LowerMS float64 `json:"lower_ms,omitempty"`
	CCMS    float64 `json:"cc_ms,omitempty"`
	// VsNative is ColdMS over the native target's.
	VsNative float64 `json:"vs_native,omitempty"`
	// ArtifactBytes is the .kiln file; SharedObjectBytes its host.so.
	ArtifactBytes     int    `json:"artifact_bytes,omitempty"`
	SharedObjectBytes int    `json:"so_bytes,omitempty"`
	VectorBytes       int64  `json:"vector_bytes"`
	Skipped           string `json:"skipped,omitempty"`
	runs              []float64
}

// crossBoard is the end-to-end latency a user sees of `kiln build
// --tracker` (queue, cross-compile on the compiler node, download) and
// `kiln run --tracker` (lease, upload, run, outputs back) of a 1024-float
// vadd, on a board daemon under qemu and, as the peer, on a native daemon
// on this machine; medians in milliseconds.
type crossBoard struct {
	Board         string  `json:"board"`
	Repeats       int     `json:"repeats"`
	BuildMS       float64 `json:"build_ms"`
	RunMS         float64 `json:"run_ms"`
	TotalMS       float64 `json:"total_ms"`
	NativeBuildMS float64 `json:"native_build_ms"`
	NativeRunMS   float64 `json:"native_run_ms"`
	NativeTotalMS float64 `json:"native_total_ms"`
	Note          string  `json:"note"`
}

type crossResult struct {
	Name    string        `json:"name"`
	Func    string        `json:"func"`
	Repeats int           `json:"repeats"`
	Targets []crossTarget `json:"targets"`
	// NativeColdMS is the native target's cold build (the peer).
	NativeColdMS float64     `json:"native_cold_ms"`
	Board        *crossBoard `json:"board,omitempty"`
	BoardSkipped string      `json:"board_skipped,omitempty"`
	// Load is the 1-minute load average at the start: the machine may be
	// shared.
	Load  float64 `json:"load"`
	Quick bool    `json:"quick,omitempty"`
}

func (r crossResult) Line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cross: %s, cold build [median of %d]:", r.Func, r.Repeats)
	for _, t := range r.Targets {
		if t.Skipped != "" {
			fmt.Fprintf(&b, " %s skipped (%s);", t.Target, t.Skipped)
			continue
		}
		fmt.Fprintf(&b, " %s %.0f ms (x%.2f native, %d B artifact);", t.Target, t.ColdMS, t.VsNative, t.ArtifactBytes)
	}
	if r.Board != nil {
		fmt.Fprintf(&b, " remote build+run on %s %.0f ms (build %.0f, run %.0f) vs native daemon %.0f ms (build %.0f, run %.0f)",
			r.Board.Board, r.Board.TotalMS, r.Board.BuildMS, r.Board.RunMS, r.Board.NativeTotalMS, r.Board.NativeBuildMS, r.Board.NativeRunMS)
	} else {
		fmt.Fprintf(&b, " emulated board skipped: %s", r.BoardSkipped)
	}
	fmt.Fprintf(&b, " [load %.1f]", r.Load)
	return b.String()
}

// crossTargets are the targets built: the host first (the peer).
var crossTargets = []string{
	"cpu",
	"cpu -mtriple=aarch64-linux-gnu -mcpu=cortex-a72",
	"cpu -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1",
	"cpu -mtriple=riscv64-linux-gnu -mattr=+v",
}

func runCross(ctx context.Context, opt options) (result, error) {
	n, repeats := 1024, 3
	if opt.quick {
		n, repeats = 64, 1
	}
	r := crossResult{Name: "cross", Func: fmt.Sprintf("scheduled matmul %d³ fp32", n), Repeats: repeats, Quick: opt.quick, Load: loadAvg()}
	mod, _, err := scheduledMatmulModule(n)
	if err != nil {
		return nil, err
	}
	for _, ts := range crossTargets {
		target := compiler.MustParseTarget(ts)
		ct := crossTarget{Target: ts, VectorBytes: target.VectorBytes()}
		if target.Triple != "" {
			ct.CC = target.Triple + "-gcc"
			if _, err := exec.LookPath(ct.CC); err != nil {
				ct.Skipped = ct.CC + " not found"
				r.Targets = append(r.Targets, ct)
				continue
			}
		}
		var lower, cc []float64
		for range repeats {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			dir, err := os.MkdirTemp("", "kiln-bench-cross-")
			if err != nil {
				return nil, err
			}
			start := time.Now()
			res, err := compiler.BuildWithResult(ctx, mod, target, compiler.BuildOptions{Cache: &toolchain.Cache{Dir: dir}})
			d := time.Since(start)
			if err == nil && res.Cached {
				err = errors.New("a build into an empty cache came from the cache")
			}
			if err != nil {
				os.RemoveAll(dir)
				return nil, fmt.Errorf("%s: %w", ts, err)
			}
			ct.runs, lower, cc = append(ct.runs, ms(d)), append(lower, ms(res.Lower)), append(cc, ms(res.Compile))
			var buf bytes.Buffer
			err = res.Artifact.Write(&buf)
			os.RemoveAll(dir)
			if err != nil {
				return nil, err
			}
			ct.ArtifactBytes, ct.SharedObjectBytes = buf.Len(), len(res.Artifact.Files[artifact.HostLib])
		}
		ct.ColdMS, ct.LowerMS, ct.CCMS = sig(median(ct.runs), 4), sig(median(lower), 3), sig(median(cc), 4)
		r.Targets = append(r.Targets, ct)
	}
	r.NativeColdMS = r.Targets[0].ColdMS
	for i := range r.Targets {
		if r.Targets[i].ColdMS > 0 {
			r.Targets[i].VsNative = sig(r.Targets[i].ColdMS/r.NativeColdMS, 3)
		}
	}
	if opt.quick {
		// The emulated board needs kiln cross-built for ARM64 (minutes
		// the first time); the emulated-board test covers that workflow.
		r.BoardSkipped = "not in --quick"
		return r, nil
	}
	board, why, err := crossBoardLatency(ctx, 5)
	if err != nil {
		return nil, fmt.Errorf("emulated board: %w", err)
	}
	r.Board, r.BoardSkipped = board, why
	return r, nil
}

// crossBoardLatency measures the end-to-end latency of a remote build and
// run on an emulated ARM64 board and on a native board daemon: an
// in-process tracker and compiler node, kiln built for this machine and
// (scripts/release) for linux/arm64. It returns why it was skipped when
// qemu-aarch64 or the cross compiler is missing.
func crossBoardLatency(ctx context.Context, repeats int) (*crossBoard, string, error) {
	if runtime.GOARCH != "amd64" {
		return nil, "the emulated board is run from an amd64 machine", nil
	}
	for _, tool := range []string{"qemu-aarch64", "aarch64-linux-gnu-gcc", "go", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, tool + " not found", nil
		}
	}
	const sysroot = "/usr/aarch64-linux-gnu"
	if _, err := os.Stat(sysroot); err != nil {
		return nil, sysroot + " not found (libc6-dev-arm64-cross)", nil
	}
	dir, err := os.MkdirTemp("", "kiln-bench-board-")
	if err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintln(os.Stderr, "cross: building kiln for this machine and for linux/arm64 (scripts/release)")
	native := filepath.Join(dir, "kiln")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", native, "./cmd/kiln").CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("go build ./cmd/kiln (run the benchmark from the repository root): %v\n%s", err, out)
	}
	rel := filepath.Join(dir, "dist")
	if out, err := exec.CommandContext(ctx, "bash", "scripts/release", "--out", rel, "linux/arm64").CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("scripts/release linux/arm64: %v\n%s", err, out)
	}
	arm := filepath.Join(rel, "kiln-linux-arm64")

	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte("bench-cross-token\n"), 0o600); err != nil {
		return nil, "", err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tr, err := tracker.New(tracker.Config{Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, "tracker"), Token: "bench-cross-token", Logger: quiet})
	if err != nil {
		return nil, "", err
	}
	trDone := make(chan error, 1)
	go func() { trDone <- tr.Run(ctx) }()
	defer func() { tr.Close(); <-trDone }()
	addr := tr.Addr()
	// Each build below has a function name of its own, so the compiler
	// node's build cache never answers: every build is a cold cross-compile.
	ready := make(chan struct{})
	nodeDone := make(chan error, 1)
	go func() {
		nodeDone <- compilernode.Run(ctx, compilernode.Config{Tracker: addr, Options: client.TrackerOptions{Token: "bench-cross-token", Logger: quiet},
			Command: []string{native, "compiler-job"}, WorkDir: filepath.Join(dir, "compiler"), Logger: quiet, Ready: ready})
	}()
	defer func() { cancel(); <-nodeDone }()
	select {
	case <-ready:
	case err := <-nodeDone:
		return nil, "", fmt.Errorf("compiler node: %v", err)
	}

	// startBoard runs exe's rpcserver under wrapper (none: natively), its
	// workers too, and waits until the tracker has it free.
	startBoard := func(key, exe string, wrapper ...string) (func(), error) {
		argv := append(append(wrapper, exe), "rpcserver", "--key", key, "--tracker", addr, "--listen", "127.0.0.1:0",
			"--token-file", tokFile, "--dir", filepath.Join(dir, key))
		if len(wrapper) > 0 {
			argv = append(argv, "--worker-wrapper", strings.Join(wrapper, " "))
		}
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		var logBuf bytes.Buffer
		cmd.Stdout, cmd.Stderr = &logBuf, &logBuf
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		stop := func() {
			cmd.Process.Signal(os.Interrupt)
			cmd.Wait()
		}
		c, err := client.DialTracker(ctx, addr, client.TrackerOptions{Token: "bench-cross-token", Logger: quiet})
		if err != nil {
			stop()
			return nil, err
		}
		defer c.Close()
		for deadline := time.Now().Add(2 * time.Minute); ; {
			sum, err := c.Query(ctx, 0)
			if err != nil {
				stop()
				return nil, err
			}
			for _, k := range sum.Keys {
				if k.Key == key && k.Free > 0 {
					return stop, nil
				}
			}
			if time.Now().After(deadline) {
				stop()
				return nil, fmt.Errorf("board %s did not register within 2 minutes:\n%s", key, logBuf.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	stopArm, err := startBoard("arm64", arm, "qemu-aarch64", "-L", sysroot)
	if err != nil {
		return nil, "", err
	}
	defer stopArm()
	stopNative, err := startBoard("native", native)
	if err != nil {
		return nil, "", err
	}
	defer stopNative()

	xs := make([]float32, 1024)
	for i := range xs {
		xs[i] = float32(i)
	}
	x, err := ndarray.FromSlice(xs, ndarray.Shape{1024})
	if err != nil {
		return nil, "", err
	}
	in := filepath.Join(dir, "x.npy")
	if err := ndarray.SaveNPY(in, x); err != nil {
		return nil, "", err
	}
	kiln := func(args ...string) (float64, error) {
		cmd := exec.CommandContext(ctx, native, append(args, "--tracker", addr, "--token-file", tokFile)...)
		start := time.Now()
		out, err := cmd.CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("kiln %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return ms(time.Since(start)), nil
	}
	measure := func(key, triple string, i int) (build, run float64, err error) {
		src := filepath.Join(dir, fmt.Sprintf("vadd_%s_%d.py", key, i))
		fn := fmt.Sprintf("vadd_%s_%d", key, i)
		if err := os.WriteFile(src, []byte(strings.ReplaceAll(vaddSource, "def vadd(", "def "+fn+"(")), 0o644); err != nil {
			return 0, 0, err
		}
		art := strings.TrimSuffix(src, ".py") + ".kiln"
		target := "cpu"
		if triple != "" {
			target = "cpu -mtriple=" + triple
		}
		if build, err = kiln("build", src, "--target", target, "-o", art); err != nil {
			return 0, 0, err
		}
		run, err = kiln("run", art, "--key", key, "--input", "A="+in, "--input", "B="+in, "--output", filepath.Join(dir, "out-"+key))
		return build, run, err
	}
	b := &crossBoard{Board: "arm64 under qemu-aarch64", Repeats: repeats,
		Note: "the board's times include qemu's emulation: they say what the workflow costs, not how fast a real board is"}
	var ab, ar, at, nb, nr, nt []float64
	// One untimed round first: the processes' first start.
	for i := -1; i < repeats; i++ {
		x, y, err := measure("arm64", "aarch64-linux-gnu", i+1)
		if err != nil {
			return nil, "", err
		}
		u, v, err := measure("native", "", i+1)
		if err != nil {
			return nil, "", err
		}
		if i >= 0 {
			ab, ar, at = append(ab, x), append(ar, y), append(at, x+y)
			nb, nr, nt = append(nb, u), append(nr, v), append(nt, u+v)
		}
	}
	b.BuildMS, b.RunMS, b.TotalMS = sig(median(ab), 3), sig(median(ar), 3), sig(median(at), 3)
	b.NativeBuildMS, b.NativeRunMS, b.NativeTotalMS = sig(median(nb), 3), sig(median(nr), 3), sig(median(nt), 3)
	return b, "", nil
}

const vaddSource = `@T.prim_func
def vadd(A: T.Buffer((1024,), "float32"), B: T.Buffer((1024,), "float32"), C: T.Buffer((1024,), "float32")):
    for i in T.parallel(1024):
        with T.block("C"):
            vi = T.axis.spatial(1024, i)
            T.reads(A[vi], B[vi])
            T.writes(C[vi])
            C[vi] = A[vi] + B[vi]
`
