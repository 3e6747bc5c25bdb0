package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"time"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/packedfunc"
)

func init() {
	register(benchmark{
		name:    "vecadd",
		summary: "fp32 C = A + B over 16M elements built from TE (parallel + vectorized), GB/s against numpy's np.add",
		run:     runVecadd,
	})
}

// vecaddLanes is the vector width of the scheduled inner loop.
const vecaddLanes = 64

// vecaddResult is the vecadd benchmark's report. GB/s counts the bytes
// read and written (3 × 4 × n per call); figures are medians over rounds,
// each round timing kiln and numpy once, and the ratio is the median of
// the rounds' kiln/numpy pairs (absent when numpy cannot run here).
type vecaddResult struct {
	Name        string   `json:"name"`
	Elements    int      `json:"elements"`
	Repeats     int      `json:"repeats"`
	MinBatchMS  float64  `json:"min_batch_ms"`
	GBps        float64  `json:"gbps"`
	GBpsNumpy   float64  `json:"gbps_numpy,omitempty"`
	Ratio       float64  `json:"ratio,omitempty"` // kiln / numpy
	Numpy       string   `json:"numpy,omitempty"`
	NoReference string   `json:"no_reference,omitempty"`
	Trace       []string `json:"trace"`
	Quick       bool     `json:"quick,omitempty"`
}

func (r vecaddResult) Line() string {
	s := fmt.Sprintf("vecadd: %d fp32: kiln %.2f GB/s", r.Elements, r.GBps)
	if r.GBpsNumpy > 0 {
		s += fmt.Sprintf(", numpy %.2f GB/s; ratio %.3f", r.GBpsNumpy, r.Ratio)
	} else {
		s += fmt.Sprintf("; no ratio: %s", r.NoReference)
	}
	return s + fmt.Sprintf(" [median of %d]", r.Repeats)
}

// runVecadd builds C = A + B from tensor expressions with
// scheduleVecadd's schedule, checks it and times it interleaved with
// numpy's np.add(a, b, out=c).
func runVecadd(ctx context.Context, opt options) (result, error) {
	n, rounds, minBatch := 16<<20, 9, 200*time.Millisecond
	if opt.quick {
		n, rounds, minBatch = 1<<16, 1, time.Millisecond
	}
	r := vecaddResult{Name: "vecadd", Elements: n, Repeats: rounds, MinBatchMS: float64(minBatch) / 1e6, Quick: opt.quick}
	f, err := vecaddFunc(ir.I32(int64(n)))
	if err != nil {
		return nil, err
	}
	s, err := schedule.New(f)
	if err != nil {
		return nil, fmt.Errorf("schedule: %w", err)
	}
	if err := scheduleVecadd(s, vecaddLanes); err != nil {
		return nil, fmt.Errorf("schedule: %w", err)
	}
	r.Trace = s.Trace()
	dir, err := os.MkdirTemp("", "kiln-bench-vecadd-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	kern, err := buildKernel(ctx, s.Func(), "vecadd", dir, compiler.Target{Kind: "cpu"}, compiler.BuildOptions{})
	if err != nil {
		return nil, err
	}
	defer kern.close()

	rng := rand.New(rand.NewPCG(3, 4))
	a, err := randomArray(rng, n)
	if err != nil {
		return nil, err
	}
	b, err := randomArray(rng, n)
	if err != nil {
		return nil, err
	}
	c, err := randomArray(rng, n)
	if err != nil {
		return nil, err
	}
	args := []packedfunc.Value{packedfunc.Array(a), packedfunc.Array(b), packedfunc.Array(c)}
	if _, err := kern.fn.Call(args...); err != nil {
		return nil, fmt.Errorf("vecadd: %w", err)
	}
	af, bf, cf := floats(a), floats(b), floats(c)
	for i := range cf {
		if want := af[i] + bf[i]; cf[i] != want {
			return nil, fmt.Errorf("vecadd: C[%d] = %g, want %g", i, cf[i], want)
		}
	}

	bytes := 3 * 4 * float64(n)
	var gk, gn, ratios []float64
	for range rounds {
		t, err := timeCalls(ctx, func() error { _, err := kern.fn.Call(args...); return err }, minBatch)
		if err != nil {
			return nil, fmt.Errorf("vecadd: %w", err)
		}
		gk = append(gk, bytes/t/1e9)
		if r.NoReference != "" {
			continue
		}
		ref, err := runNumpy(ctx, "vecadd", n, 1)
		if errors.Is(err, errNoReference) {
			r.NoReference = err.Error()
			continue
		}
		if err != nil {
			return nil, err
		}
		g := num(ref, "gbps")
		if g <= 0 {
			return nil, fmt.Errorf("numpy reference: no gbps in %v", ref)
		}
		r.Numpy = numpyName(ref)
		gn = append(gn, g)
		ratios = append(ratios, gk[len(gk)-1]/g)
	}
	r.GBps = sig(median(gk), 4)
	if len(gn) > 0 {
		r.GBpsNumpy, r.Ratio = sig(median(gn), 4), sig(median(ratios), 3)
	}
	return r, nil
}

// vecaddFunc is the tensor-expression tutorial's vector add, C[i] = A[i] + B[i] over n fp32
// elements (n a constant or a size variable), as a PrimFunc with
// parameters A, B, C.
func vecaddFunc(n ir.Expr) (*ir.PrimFunc, error) {
	A := te.Placeholder([]ir.Expr{n}, ir.Float32, "A")
	B := te.Placeholder([]ir.Expr{n}, ir.Float32, "B")
	C := te.Compute(A.Shape, func(i ir.Expr) ir.Expr { return ir.Add(A.At(i), B.At(i)) }, "C")
	f, err := te.CreatePrimFunc([]*te.Tensor{A, B, C})
	if err != nil {
		return nil, fmt.Errorf("vecadd: %w", err)
	}
	return f, nil
}

// scheduleVecadd splits the loop into vectors of lanes elements: the
// outer loop runs in parallel, the inner one is one vector.
func scheduleVecadd(s *schedule.Schedule, lanes int64) error {
	c, err := s.GetBlock("C")
	if err != nil {
		return err
	}
	l, err := s.GetLoops(c)
	if err != nil {
		return err
	}
	i, err := s.Split(l[0], -1, lanes)
	if err != nil {
		return err
	}
	if err := s.Parallel(i[0]); err != nil {
		return err
	}
	return s.Vectorize(i[1])
}

// sig rounds x to digits significant digits, so JSON stays readable and
// a small figure (a quick run on a busy machine) never rounds to zero.
func sig(x float64, digits int) float64 {
	if x == 0 || math.IsInf(x, 0) || math.IsNaN(x) {
		return x
	}
	return round(x, digits-1-int(math.Floor(math.Log10(math.Abs(x)))))
}
