package main

/*
#cgo CFLAGS: -I${SRCDIR}/../abi
#cgo LDFLAGS: -ldl
#cgo noescape bench_call_packed
#cgo nocallback bench_call_packed
#cgo noescape bench_empty
#cgo nocallback bench_empty
#include <dlfcn.h>
#include <stdlib.h>
#include "kiln_abi.h"

static void* bench_dlopen(const char* path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }

static int32_t bench_call_packed(void* fn, KilnValue* args, int32_t* codes, int32_t n) {
	return ((KilnPackedFunc)fn)(args, codes, n);
}

static void bench_empty(void) {}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"
	"unsafe"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

func init() {
	register(benchmark{
		name:    "callov",
		summary: "cost of one packed call from Go into a loaded C function with three NDArray arguments",
		run:     runCallOverhead,
	})
}

// callovGoalNS is the target for one packed call, from the runtime issue.
const callovGoalNS = 100

// noopSource is a kernel that checks nothing and touches nothing, so a call
// costs only kiln's calling path.
const noopSource = `#include "kiln_abi.h"

KILN_DEFINE_LAST_ERROR()

KILN_EXPORT int32_t noop3(KilnValue* args, int32_t* codes, int32_t n) {
  (void)args; (void)codes; (void)n;
  return 0;
}

KILN_EXPORT const char* kiln_module_metadata(void) {
  return "{\"format_version\":1,\"target\":\"c\",\"functions\":[{\"name\":\"noop3\",\"params\":["
         "{\"name\":\"a\",\"kind\":\"tensor\",\"dtype\":\"float32\",\"shape\":[4]},"
         "{\"name\":\"b\",\"kind\":\"tensor\",\"dtype\":\"float32\",\"shape\":[4]},"
         "{\"name\":\"c\",\"kind\":\"tensor\",\"dtype\":\"float32\",\"shape\":[4]}]}]}";
}
`

// callovResult is the callov benchmark's report; every figure is the median
// over batches of nanoseconds per call.
type callovResult struct {
	Name          string  `json:"name"`
	NSPerCall     float64 `json:"ns_per_call"`     // f.Call(a, b, c) through cpu.Load
	GoalNS        float64 `json:"goal_ns"`         // the target for NSPerCall
	MeetsGoal     bool    `json:"meets_goal"`      // NSPerCall < GoalNS
	AllocsPerCall float64 `json:"allocs_per_call"` // heap allocations per f.Call
	CgoPackedNS   float64 `json:"cgo_packed_ns"`   // the same C function called directly through cgo
	CgoEmptyNS    float64 `json:"cgo_empty_ns"`    // a cgo call of an empty C function
	GoFuncNS      float64 `json:"go_func_ns"`      // an empty, not inlined Go function with three arguments
	KilnNS        float64 `json:"kiln_ns"`         // NSPerCall - CgoPackedNS: kiln's own checks and packing
	CallsPerBatch int     `json:"calls_per_batch"`
	Batches       int     `json:"batches"`
	Quick         bool    `json:"quick,omitempty"`
}

func (r callovResult) Line() string {
	return fmt.Sprintf("callov: packed call with 3 NDArrays %.1f ns (goal %.0f ns, %.1f allocs); direct cgo %.1f ns, empty cgo %.1f ns, empty Go func %.2f ns; kiln's share %.1f ns [median of %d batches of %d]",
		r.NSPerCall, r.GoalNS, r.AllocsPerCall, r.CgoPackedNS, r.CgoEmptyNS, r.GoFuncNS, r.KilnNS, r.Batches, r.CallsPerBatch)
}

//go:noinline
func emptyGoFunc(a, b, c *ndarray.NDArray) {}

// runCallOverhead compiles a no-op kernel with the system C compiler, loads
// it with cpu.Load and times f.Call with three NDArrays against a direct
// cgo call of the same symbol, an empty cgo call and an empty Go call.
func runCallOverhead(ctx context.Context, opt options) (result, error) {
	dir, err := os.MkdirTemp("", "kiln-callov-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	so, err := compileNoop(ctx, dir)
	if err != nil {
		return nil, err
	}
	mod, err := cpu.Load(so)
	if err != nil {
		return nil, err
	}
	defer mod.Close()
	f, err := mod.GetFunction("noop3")
	if err != nil {
		return nil, err
	}
	var arrs [3]*ndarray.NDArray
	for i := range arrs {
		if arrs[i], err = ndarray.Zeros(ndarray.Shape{4}, ndarray.Float32, devices.CPUDevice); err != nil {
			return nil, err
		}
	}
	args := []packedfunc.Value{packedfunc.Array(arrs[0]), packedfunc.Array(arrs[1]), packedfunc.Array(arrs[2])}
	if _, err := f.Call(args...); err != nil {
		return nil, fmt.Errorf("first call: %w", err)
	}
	if _, err := f.Call(args[:2]...); err == nil {
		return nil, errors.New("a call with two arguments succeeded; the loader does not check arity")
	}

	// The direct cgo baseline calls the same symbol with arguments packed
	// once, in C memory.
	cpath := C.CString(so)
	defer C.free(unsafe.Pointer(cpath))
	h := C.bench_dlopen(cpath)
	if h == nil {
		return nil, fmt.Errorf("dlopen %q for the cgo baseline failed", so)
	}
	defer C.dlclose(h)
	csym := C.CString("noop3")
	defer C.free(unsafe.Pointer(csym))
	fp := C.dlsym(h, csym)
	if fp == nil {
		return nil, errors.New("dlsym noop3 for the cgo baseline failed")
	}
	cvals := (*[3]C.KilnValue)(C.calloc(3, C.size_t(unsafe.Sizeof(C.KilnValue{}))))
	defer C.free(unsafe.Pointer(cvals))
	ccodes := (*[3]C.int32_t)(C.calloc(3, C.size_t(unsafe.Sizeof(C.int32_t(0)))))
	defer C.free(unsafe.Pointer(ccodes))
	for i, a := range arrs {
		*(*unsafe.Pointer)(unsafe.Pointer(&cvals[i])) = a.DLTensor()
		ccodes[i] = C.int32_t(abi.CodeDLTensor)
	}

	var callErr error
	variants := []func(n int){
		func(n int) { // packed call through kiln
			for range n {
				if _, err := f.Call(args...); err != nil {
					callErr = err
					return
				}
			}
		},
		func(n int) {
			for range n {
				if C.bench_call_packed(fp, &cvals[0], &ccodes[0], 3) != 0 {
					callErr = errors.New("noop3 returned non-zero through cgo")
					return
				}
			}
		},
		func(n int) {
			for range n {
				C.bench_empty()
			}
		},
		func(n int) {
			for range n {
				emptyGoFunc(arrs[0], arrs[1], arrs[2])
			}
		},
	}

	target, batches := 20*time.Millisecond, 9
	if opt.quick {
		target, batches = 200*time.Microsecond, 3
	}
	n := calibrate(variants[0], target)
	samples := make([][]float64, len(variants))
	for b := range batches {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for j := range variants {
			v := variants[(j+b)%len(variants)] // rotate the order between batches
			start := time.Now()
			v(n)
			ns := float64(time.Since(start).Nanoseconds()) / float64(n)
			samples[(j+b)%len(variants)] = append(samples[(j+b)%len(variants)], ns)
		}
		if callErr != nil {
			return nil, callErr
		}
	}
	runtime.KeepAlive(arrs)

	r := callovResult{
		Name:          "callov",
		NSPerCall:     round(median(samples[0]), 1),
		GoalNS:        callovGoalNS,
		AllocsPerCall: allocsPerCall(func() { _, _ = f.Call(args...) }, 1000),
		CgoPackedNS:   round(median(samples[1]), 1),
		CgoEmptyNS:    round(median(samples[2]), 1),
		GoFuncNS:      round(median(samples[3]), 2),
		CallsPerBatch: n,
		Batches:       batches,
		Quick:         opt.quick,
	}
	r.MeetsGoal = r.NSPerCall < r.GoalNS
	r.KilnNS = round(r.NSPerCall-r.CgoPackedNS, 1)
	return r, nil
}

// compileNoop writes the no-op kernel and the ABI header into dir and
// builds noop.so with $CC (default cc).
func compileNoop(ctx context.Context, dir string) (string, error) {
	src := filepath.Join(dir, "noop.c")
	if err := os.WriteFile(src, []byte(noopSource), 0o644); err != nil {
		return "", fmt.Errorf("write kernel: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, abi.HeaderName), []byte(abi.Header), 0o644); err != nil {
		return "", fmt.Errorf("write header: %w", err)
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	so := filepath.Join(dir, "noop.so")
	out, err := exec.CommandContext(ctx, cc, "-O2", "-shared", "-fPIC", "-o", so, src).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("compile %q with %q: %w\n%s", src, cc, err, out)
	}
	return so, nil
}

// calibrate doubles n until one batch of fn(n) lasts at least target.
func calibrate(fn func(n int), target time.Duration) int {
	n := 1000
	for {
		start := time.Now()
		fn(n)
		if time.Since(start) >= target || n >= 1<<30 {
			return n
		}
		n *= 2
	}
}

// allocsPerCall is the average number of heap allocations of one fn call.
func allocsPerCall(fn func(), runs int) float64 {
	fn()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		fn()
	}
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / float64(runs)
}
