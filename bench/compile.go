package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/toolchain"
)

func init() {
	register(benchmark{
		name:    "compile",
		summary: "compile time of the scheduled 1024³ matmul: lowering + C compiler from an empty cache, and from the build cache",
		run:     runCompile,
	})
}

// compileResult is the compile benchmark's report, in milliseconds, each
// the median over repeats. A cold build starts from an empty build cache
// (a fresh directory): lowering and C generation (lower_ms), then the C
// compiler (cc_ms); cold_ms is the whole compiler.Build call. A cached
// build is the same call again with the same cache: it hashes the IR and
// reads the artifact back.
type compileResult struct {
	Name     string   `json:"name"`
	Func     string   `json:"func"`
	Repeats  int      `json:"repeats"`
	ColdMS   float64  `json:"cold_ms"`
	LowerMS  float64  `json:"lower_ms"`
	CCMS     float64  `json:"cc_ms"`
	CachedMS float64  `json:"cached_ms"`
	Source   int      `json:"source_bytes"` // generated C
	Trace    []string `json:"trace"`
	Quick    bool     `json:"quick,omitempty"`
}

func (r compileResult) Line() string {
	return fmt.Sprintf("compile: %s: cold %.0f ms (lowering %.1f ms, cc %.0f ms), cached %.2f ms [median of %d]",
		r.Func, r.ColdMS, r.LowerMS, r.CCMS, r.CachedMS, r.Repeats)
}

// runCompile builds the matmul benchmark's scheduled function cold (a new
// cache directory each repeat) and then from that cache.
func runCompile(ctx context.Context, opt options) (result, error) {
	n, repeats := 1024, 5
	if opt.quick {
		n, repeats = 64, 1
	}
	mod, s, err := scheduledMatmulModule(n)
	if err != nil {
		return nil, err
	}
	r := compileResult{Name: "compile", Func: fmt.Sprintf("scheduled matmul %d³ fp32", n), Repeats: repeats, Trace: s.Trace(), Quick: opt.quick}
	var cold, lower, cc, cached []float64
	for range repeats {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		dir, err := os.MkdirTemp("", "kiln-bench-compile-")
		if err != nil {
			return nil, err
		}
		cache := &toolchain.Cache{Dir: dir}
		start := time.Now()
		res, err := compiler.BuildWithResult(ctx, mod, compiler.Target{Kind: "cpu"}, compiler.BuildOptions{Cache: cache})
		d := time.Since(start)
		if err == nil && res.Cached {
			err = fmt.Errorf("a build into the empty cache %s came from the cache", dir)
		}
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("cold build: %w", err)
		}
		cold, lower, cc = append(cold, ms(d)), append(lower, ms(res.Lower)), append(cc, ms(res.Compile))
		r.Source = len(res.Source)
		start = time.Now()
		res, err = compiler.BuildWithResult(ctx, mod, compiler.Target{Kind: "cpu"}, compiler.BuildOptions{Cache: cache})
		d = time.Since(start)
		os.RemoveAll(dir)
		if err == nil && !res.Cached {
			err = fmt.Errorf("the second build did not come from the cache")
		}
		if err != nil {
			return nil, fmt.Errorf("cached build: %w", err)
		}
		cached = append(cached, ms(d))
	}
	r.ColdMS, r.LowerMS, r.CCMS, r.CachedMS = sig(median(cold), 4), sig(median(lower), 3), sig(median(cc), 4), sig(median(cached), 3)
	return r, nil
}

func ms(d time.Duration) float64 { return d.Seconds() * 1e3 }

// scheduledMatmulModule is the matmul benchmark's scheduled n³ function
// for the host (named matmul_N) in a module, with its schedule.
func scheduledMatmulModule(n int) (*ir.IRModule, *schedule.Schedule, error) {
	f, err := matmulFunc(n, n, n)
	if err != nil {
		return nil, nil, err
	}
	s, err := schedule.New(f)
	if err != nil {
		return nil, nil, fmt.Errorf("schedule: %w", err)
	}
	info, err := compiler.Target{Kind: "cpu"}.Info()
	if err != nil {
		return nil, nil, err
	}
	mr, nr, lanes := matmulHandTile(info)
	if err := scheduleMatmul(s, mr, nr, lanes); err != nil {
		return nil, nil, fmt.Errorf("schedule: %w", err)
	}
	name := fmt.Sprintf("matmul_%d", n)
	return ir.NewIRModule().With(name, s.Func().WithAttr(ir.AttrGlobalSymbol, name)), s, nil
}
