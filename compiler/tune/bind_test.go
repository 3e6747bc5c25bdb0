package tune

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/internal/check"
)

// symbolicMatmul is the tensor-expression tutorial's matmul with
// symbolic N, M, K.
func symbolicMatmul(t testing.TB) *ir.PrimFunc {
	t.Helper()
	N, M, K := te.Var("N"), te.Var("M"), te.Var("K")
	A := te.Placeholder([]ir.Expr{N, K}, ir.Float32, "A")
	B := te.Placeholder([]ir.Expr{K, M}, ir.Float32, "B")
	rk := te.ReduceAxis(ir.RangeFromExtent(K), "k")
	C := te.Compute([]ir.Expr{N, M}, func(i, j ir.Expr) ir.Expr {
		return te.Sum(ir.Mul(A.At(i, rk), B.At(rk, j)), rk)
	}, "C")
	f, err := te.CreatePrimFunc([]*te.Tensor{A, B, C})
	check.NoError(t, err)
	return f
}

// TestBindSymbolicMatmul: the symbolic matmul is untunable as it is,
// bound to a shape it is tuned, its records name the shape and the
// unbound function, and Apply specializes the symbolic function to the
// recorded shape and gives it the best record's schedule, which computes
// what the static matmul computes.
func TestBindSymbolicMatmul(t *testing.T) {
	f := symbolicMatmul(t)
	mod := ir.NewIRModule().With("mm", f.WithAttr(ir.AttrGlobalSymbol, "mm"))

	_, skipped, err := Tasks(mod, testTarget, nil)
	check.NoError(t, err)
	check.Equal(t, len(skipped), 1)
	check.True(t, strings.Contains(skipped[0], "bind them with --shape"), skipped[0])
	check.True(t, strings.Contains(skipped[0], "K, M, N"), skipped[0])

	shape := map[string]int64{"N": 16, "M": 8, "K": 12}
	tasks, skipped, err := Tasks(mod, testTarget, shape)
	check.NoError(t, err)
	check.Equal(t, len(skipped), 0, skipped)
	check.Equal(t, len(tasks), 1)
	task := tasks[0]
	check.Equal(t, task.Workload.Generic, WorkloadOf(f).Hash)
	check.Equal(t, FormatShape(task.Workload.Shape), "K=12,M=8,N=16")
	check.True(t, task.Workload.Hash != task.Workload.Generic, "the bound function has the generic hash")
	check.Equal(t, task.Flops, Flops(matmulFunc(t, 16, 8, 12)))
	for _, b := range task.Func.BufferMap {
		for _, e := range b.Shape {
			_, ok := ir.IsConstInt(e)
			check.True(t, ok, "a bound buffer shape is not constant:", b.Shape)
		}
	}
	// Another shape is another workload.
	other, _, err := Tasks(mod, testTarget, map[string]int64{"N": 16, "M": 8, "K": 4})
	check.NoError(t, err)
	check.True(t, other[0].Workload.Hash != task.Workload.Hash, "two shapes, one workload")

	db := NewDatabase("cpu")
	sum, err := Tune(context.Background(), tasks, db, &fakeRunner{runs: map[string]int{}}, Options{Trials: 16, Batch: 8, Seed: 1})
	check.NoError(t, err)
	check.True(t, sum[0].Best > 0, sum[0])

	out, applied, err := Apply(mod, db, testTarget, nil)
	check.NoError(t, err)
	check.Equal(t, len(applied.Missing), 0, applied.Missing)
	check.Equal(t, applied.Specialized["mm"], "K=12,M=8,N=16")
	best, _ := db.Best(task.Workload.Hash)
	c, err := task.Space.Candidate(best)
	check.NoError(t, err)
	check.True(t, ir.StructuralEqual(out.PrimFunc("mm").WithAttr(ir.AttrGlobalSymbol, ""), c.Func.WithAttr(ir.AttrGlobalSymbol, "")),
		"Apply did not give the best record's schedule")
	check.Equal(t, run(t, out.PrimFunc("mm")), run(t, matmulFunc(t, 16, 8, 12)))

	// The same shape given explicitly applies the same record; a shape
	// with no record leaves the kernel missing.
	_, applied, err = Apply(mod, db, testTarget, shape)
	check.NoError(t, err)
	check.Equal(t, applied.Specialized["mm"], "K=12,M=8,N=16")
	_, applied, err = Apply(mod, db, testTarget, map[string]int64{"N": 32, "M": 8, "K": 12})
	check.NoError(t, err)
	check.Equal(t, len(applied.Missing), 1)

	// Records of two shapes: Apply asks to choose.
	_, err = Tune(context.Background(), other, db, &fakeRunner{runs: map[string]int{}}, Options{Trials: 8, Batch: 8, Seed: 2})
	check.NoError(t, err)
	_, _, err = Apply(mod, db, testTarget, nil)
	check.Error(t, err, "choose one with --shape")
}

// TestBindBadInput: unknown names, sizes below 1 and malformed specs are
// errors naming them.
func TestBindBadInput(t *testing.T) {
	f := symbolicMatmul(t)
	_, err := Bind(f, map[string]int64{"n": 4})
	check.Error(t, err, `no symbolic size "n" (its symbolic sizes: K, M, N)`)
	_, err = Bind(f, map[string]int64{"N": 0})
	check.Error(t, err, "at least 1")
	_, err = Bind(matmulFunc(t, 4, 4, 4), map[string]int64{"N": 4})
	check.Error(t, err, "its sizes are all constant")

	mod := ir.NewIRModule().With("mm", f)
	_, _, err = Tasks(mod, testTarget, map[string]int64{"N": 4, "Q": 2})
	check.Error(t, err, `--shape Q: no kernel has a symbolic size "Q"`)

	for _, bad := range []string{"n", "=4", "n=0", "n=x", "n=-3"} {
		_, err := ParseShape([]string{bad})
		check.True(t, err != nil, bad)
	}
	_, err = ParseShape([]string{"n=4", "n=8"})
	check.Error(t, err, "given twice")
	s, err := ParseShape([]string{"N=1024, M=512", "K=64"})
	check.NoError(t, err)
	check.Equal(t, FormatShape(s), "K=64,M=512,N=1024")
	check.True(t, !errors.Is(err, ErrUntunable))
}
