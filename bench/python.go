package main

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver"
)

//go:embed python/python_bench.py
var pythonBenchScript []byte

//go:embed python/python_capi.c
var pythonCAPISource []byte

func init() {
	register(benchmark{
		name:    "python",
		summary: "the Python package over libkiln.so: remote empty call and numpy upload vs the Go SDK, local empty call through the C API",
		run:     runPython,
	})
}

// Goals of the python benchmark.
const (
	pythonCallRatioGoal   = 1.2 // Python's remote empty call ≤ 1.2× the Go SDK's
	pythonCAPICallGoalUS  = 2   // a local empty call through the C API
	pythonUploadRatioGoal = 0.9 // numpy upload ≥ 0.9× the Go SDK's throughput
)

// pythonResult is the python benchmark's report.
type pythonResult struct {
	Name string `json:"name"`
	// RemoteCallRatio is PyRemoteCallUS / GoRemoteCallUS: the median round
	// trip of the daemon's empty global function (rpcserver.nop) from
	// Python and from the Go SDK, each a client process of its own,
	// against the same daemon in the same run.
	RemoteCallRatio float64 `json:"ratio_remote_call"`
	PyRemoteCallUS  float64 `json:"py_remote_call_median_us"`
	GoRemoteCallUS  float64 `json:"go_remote_call_median_us"`
	// GoLockedCallUS is the Go SDK's call from a goroutine locked to its
	// OS thread, as a call from C (and so from Python) always is.
	GoLockedCallUS float64 `json:"go_locked_thread_call_median_us"`
	// CAPICallUS is a call of an empty compiled kernel (one array
	// argument) through kiln_call from C; PyLocalCallUS the same call
	// from Python (ctypes adds its conversions); both best of five rounds.
	CAPICallUS    float64 `json:"capi_local_call_us"`
	PyLocalCallUS float64 `json:"py_local_call_us"`
	// UploadRatio is PyUploadGBps / GoUploadGBps: filling a remote array
	// from a numpy array (copyfrom) and from a Go byte slice
	// (Array.CopyFromBytes), median over the uploads.
	UploadRatio  float64 `json:"ratio_upload"`
	PyUploadGBps float64 `json:"py_upload_gb_per_s"`
	GoUploadGBps float64 `json:"go_upload_gb_per_s"`
	UploadBytes  int     `json:"upload_bytes"`
	// Rounds is how many Python rounds ran, between Rounds+1 Go rounds.
	Rounds     int  `json:"rounds"`
	Calls      int  `json:"calls"`
	MeetsGoals bool `json:"meets_goals"`
	Quick      bool `json:"quick,omitempty"`
}

func (r pythonResult) Line() string {
	return fmt.Sprintf("python: remote empty call median %.1f µs from Python vs %.1f µs from the Go SDK (ratio %.2f, goal ≤ %.1f; %.1f µs from Go on a locked thread); local empty call %.3f µs through the C API from C (goal ≤ %d µs), %.2f µs from Python; numpy upload of %d MiB %.2f GB/s vs %.2f GB/s from Go (ratio %.2f, goal ≥ %.1f)",
		r.PyRemoteCallUS, r.GoRemoteCallUS, r.RemoteCallRatio, pythonCallRatioGoal, r.GoLockedCallUS, r.CAPICallUS, pythonCAPICallGoalUS, r.PyLocalCallUS,
		r.UploadBytes>>20, r.PyUploadGBps, r.GoUploadGBps, r.UploadRatio, pythonUploadRatioGoal)
}

// moduleRoot finds the directory of kiln's go.mod from the working
// directory up.
func moduleRoot() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/kiln-ml/kiln")) {
			return d, nil
		}
		p := filepath.Dir(d)
		if p == d {
			return "", errors.New("python: run it inside kiln's repository (no go.mod of github.com/kiln-ml/kiln above the working directory)")
		}
		d = p
	}
}

// pythonCommand is the Python to run: $KILN_PYTHON, else Debian's (which
// has numpy), else python3 on PATH.
func pythonCommand() string {
	if p := os.Getenv("KILN_PYTHON"); p != "" {
		return p
	}
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	return "python3"
}

func runPython(ctx context.Context, opt options) (_ result, err error) {
	calls, size, uploads, rounds := 20000, 64<<20, 7, 4
	if opt.quick {
		calls, size, uploads, rounds = 200, 1<<20, 2, 2
	}
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kiln-bench-python-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	// libkiln.so, as pip install builds it, and the C harness over it.
	lib := os.Getenv("KILN_LIBRARY")
	if lib == "" {
		lib = filepath.Join(dir, "libkiln.so")
		if err := runIn(ctx, root, "go", "build", "-buildmode=c-shared", "-o", lib, "./capi"); err != nil {
			return nil, fmt.Errorf("build libkiln.so: %w", err)
		}
	}
	csrc := filepath.Join(dir, "python_capi.c")
	if err := os.WriteFile(csrc, pythonCAPISource, 0o644); err != nil {
		return nil, err
	}
	harness := filepath.Join(dir, "python_capi")
	libDir := filepath.Dir(lib)
	if err := runIn(ctx, dir, "cc", "-O2", "-I", filepath.Join(root, "capi"), "-o", harness, csrc,
		lib, "-Wl,-rpath,"+libDir); err != nil {
		return nil, fmt.Errorf("compile the C harness: %w", err)
	}
	script := filepath.Join(dir, "python_bench.py")
	if err := os.WriteFile(script, pythonBenchScript, 0o644); err != nil {
		return nil, err
	}

	bd, err := startBenchDaemon(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, bd.stop()) }()

	// The daemon serves one session at a time, so the sides take turns:
	// rounds alternate, Go first and last, so a change in the machine's
	// load meets both; each side's figure is the median of its rounds. Each
	// round is a client process of its own, as a user's program is.
	var goRounds []goRound
	var pyRounds []pyRound
	for i := range rounds {
		g, err := goClientRound(ctx, bd.d.Addr().String(), calls, size, uploads)
		if err != nil {
			return nil, err
		}
		goRounds = append(goRounds, g)
		if i == rounds-1 {
			break
		}
		p, err := pythonRound(ctx, script, bd.d.Addr().String(), lib, root, dir, calls, size, uploads)
		if err != nil {
			return nil, err
		}
		pyRounds = append(pyRounds, p)
	}
	hout, err := exec.CommandContext(ctx, harness, filepath.Join(dir, "empty.kiln"), strconv.Itoa(max(calls*10, 100000))).Output()
	if err != nil {
		return nil, fmt.Errorf("C harness: %w", err)
	}
	var capiUS float64
	var live int
	if _, err := fmt.Sscan(string(hout), &capiUS, &live); err != nil {
		return nil, fmt.Errorf("C harness printed %q: %w", hout, err)
	}
	if live != 0 {
		return nil, fmt.Errorf("C harness left %d live handles", live)
	}
	goCall := medianOf(goRounds, func(g goRound) float64 { return g.CallUS })
	goUp := medianOf(goRounds, func(g goRound) float64 { return g.GBps })
	py := pyRound{
		RemoteCallUS: medianOf(pyRounds, func(p pyRound) float64 { return p.RemoteCallUS }),
		LocalCallUS:  medianOf(pyRounds, func(p pyRound) float64 { return p.LocalCallUS }),
		UploadGBps:   medianOf(pyRounds, func(p pyRound) float64 { return p.UploadGBps }),
	}
	r := pythonResult{
		Name: "python", PyRemoteCallUS: round(py.RemoteCallUS, 2), GoRemoteCallUS: round(goCall, 2),
		GoLockedCallUS: round(medianOf(goRounds, func(g goRound) float64 { return g.LockedUS }), 2),
		CAPICallUS:     round(capiUS, 4), PyLocalCallUS: round(py.LocalCallUS, 3),
		PyUploadGBps: round(py.UploadGBps, 3), GoUploadGBps: round(goUp, 3), Rounds: len(pyRounds),
		UploadBytes: size, Calls: calls, Quick: opt.quick,
	}
	if goCall > 0 {
		r.RemoteCallRatio = round(py.RemoteCallUS/goCall, 3)
	}
	if goUp > 0 {
		r.UploadRatio = round(py.UploadGBps/goUp, 3)
	}
	r.MeetsGoals = r.RemoteCallRatio <= pythonCallRatioGoal && r.CAPICallUS <= pythonCAPICallGoalUS && r.UploadRatio >= pythonUploadRatioGoal
	return r, nil
}

// pyRound is one round of the Python part's figures.
type pyRound struct {
	LocalCallUS  float64 `json:"local_call_us"`
	RemoteCallUS float64 `json:"remote_call_median_us"`
	UploadGBps   float64 `json:"upload_gbps"`
}

// pythonRound runs the Python part once.
func pythonRound(ctx context.Context, script, addr, lib, root, dir string, calls, size, uploads int) (pyRound, error) {
	cmd := exec.CommandContext(ctx, pythonCommand(), "-P", script, addr,
		strconv.Itoa(calls), strconv.Itoa(size), strconv.Itoa(uploads), dir)
	cmd.Env = append(os.Environ(), "KILN_LIBRARY="+lib, "PYTHONPATH="+filepath.Join(root, "python"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return pyRound{}, fmt.Errorf("python part: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var p pyRound
	if err := json.Unmarshal(out, &p); err != nil {
		return pyRound{}, fmt.Errorf("python part printed %q: %w", out, err)
	}
	return p, nil
}

// medianOf is the median of f over rounds.
func medianOf[T any](rounds []T, f func(T) float64) float64 {
	xs := make([]float64, len(rounds))
	for i, r := range rounds {
		xs[i] = f(r)
	}
	slices.Sort(xs)
	return median(xs)
}

// goRound is one round of the Go SDK's figures.
type goRound struct {
	CallUS   float64 `json:"call_us"`   // median empty-call round trip
	LockedUS float64 `json:"locked_us"` // the same from a goroutine locked to its thread
	GBps     float64 `json:"gbps"`      // median upload throughput
}

// goClientEnv makes this binary run one Go SDK round as a client process
// of its own, as a Go program using kiln is (and as the Python part is):
// KILN_BENCH_GO_CLIENT=ADDR,CALLS,SIZE,UPLOADS; it prints the round as JSON.
const goClientEnv = "KILN_BENCH_GO_CLIENT"

func init() {
	spec := os.Getenv(goClientEnv)
	if spec == "" {
		return
	}
	os.Exit(goClientMain(spec))
}

func goClientMain(spec string) int {
	f := strings.Split(spec, ",")
	if len(f) != 4 {
		fmt.Fprintf(os.Stderr, "%s=%q: want ADDR,CALLS,SIZE,UPLOADS\n", goClientEnv, spec)
		return 2
	}
	calls, err1 := strconv.Atoi(f[1])
	size, err2 := strconv.Atoi(f[2])
	uploads, err3 := strconv.Atoi(f[3])
	if err := errors.Join(err1, err2, err3); err != nil {
		fmt.Fprintf(os.Stderr, "%s=%q: %v\n", goClientEnv, spec, err)
		return 2
	}
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*7 + i>>13)
	}
	g, err := goSDKRound(context.Background(), f[0], calls, data, uploads)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(g); err != nil {
		return 1
	}
	return 0
}

// goClientRound runs one Go SDK round in a process of its own.
func goClientRound(ctx context.Context, addr string, calls, size, uploads int) (goRound, error) {
	exe, err := os.Executable()
	if err != nil {
		return goRound{}, err
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d,%d,%d", goClientEnv, addr, calls, size, uploads),
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return goRound{}, fmt.Errorf("go client: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var g goRound
	if err := json.Unmarshal(out, &g); err != nil {
		return goRound{}, fmt.Errorf("go client printed %q: %w", out, err)
	}
	return g, nil
}

// goSDKRound times the empty call and the upload from the Go SDK in one
// session, as the Python part does.
func goSDKRound(ctx context.Context, addr string, calls int, data []byte, uploads int) (goRound, error) {
	s, err := client.Connect(ctx, addr, client.SessionOptions{})
	if err != nil {
		return goRound{}, err
	}
	defer s.Close()
	nop, err := s.GetGlobal(ctx, rpcserver.GlobalNop)
	if err != nil {
		return goRound{}, err
	}
	for range max(min(calls/10, 500), 1) {
		if _, err := nop.Call(ctx); err != nil {
			return goRound{}, err
		}
	}
	lat := make([]float64, calls)
	for i := range lat {
		t0 := time.Now()
		if _, err := nop.Call(ctx); err != nil {
			return goRound{}, err
		}
		lat[i] = float64(time.Since(t0).Nanoseconds()) / 1e3
	}
	slices.Sort(lat)
	// The same calls from a goroutine locked to its thread, as every call
	// that comes from C runs: each reply's wake-up is a hand-over to that
	// thread. This is the Go SDK's share of the gap to Python.
	locked := make([]float64, calls)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for i := range locked {
			t0 := time.Now()
			if _, err := nop.Call(ctx); err != nil {
				done <- err
				return
			}
			locked[i] = float64(time.Since(t0).Nanoseconds()) / 1e3
		}
		done <- nil
	}()
	if err := <-done; err != nil {
		return goRound{}, err
	}
	slices.Sort(locked)
	a, err := s.Empty(ctx, ndarray.Shape{int64(len(data))}, ndarray.Uint8, devices.CPUDevice)
	if err != nil {
		return goRound{}, err
	}
	if err := a.CopyFromBytes(ctx, data); err != nil {
		return goRound{}, err
	}
	rates := make([]float64, uploads)
	for i := range rates {
		t0 := time.Now()
		if err := a.CopyFromBytes(ctx, data); err != nil {
			return goRound{}, err
		}
		rates[i] = float64(len(data)) / time.Since(t0).Seconds() / 1e9
	}
	slices.Sort(rates)
	return goRound{CallUS: median(lat), LockedUS: median(locked), GBps: rates[len(rates)/2]}, a.Free(ctx)
}

// runIn runs a command in dir, its output in the error when it fails.
func runIn(ctx context.Context, dir, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}
