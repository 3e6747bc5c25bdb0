// Command matmul is the tensor-expression tutorial's second program: a matrix multiplication
// with symbolic sizes N, M and K and a reduction over K, scheduled so the
// rows of C run in parallel (s[C].parallel(C.op.axis[0])), built for the
// CPU, run on random matrices and checked against a Go reference with a
// relative tolerance of 1e-5.
//
//	go run ./examples/matmul [-n 1024 -m 1024 -k 1024]
//
// The Python it follows:
//
//	N, M, K = te.var("N"), te.var("M"), te.var("K")
//	A = te.placeholder((N, K), name="A")
//	B = te.placeholder((K, M), name="B")
//	k = te.reduce_axis((0, K), name="k")
//	C = te.compute((N, M), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
//	s = te.create_schedule(C.op)
//	s[C].parallel(C.op.axis[0])
//	fmatmul = tvm.build(s, [A, B, C], "llvm", name="matrix_multiply")
//	...
//	fmatmul(a, b, c)
//	np.testing.assert_allclose(c.asnumpy(), np.dot(a.asnumpy(), b.asnumpy()), rtol=1e-5)
//	print("Matrix multiplication result matches with NumPy.")
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/load"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// rtol is the tolerance of TVM's tensor-expression tutorial: |got - want| <= rtol·|want|.
const rtol = 1e-5

func main() {
	n := flag.Int("n", 1024, "rows of A and C (N)")
	m := flag.Int("m", 1024, "columns of B and C (M)")
	k := flag.Int("k", 1024, "columns of A, rows of B (K)")
	flag.Parse()
	if err := run(context.Background(), os.Stdout, *n, *m, *k); err != nil {
		fmt.Fprintf(os.Stderr, "matmul: %v\n", err)
		os.Exit(1)
	}
}

// run defines, schedules, builds and runs C = A·B for n×k and k×m random
// matrices and prints that the result matches when every entry of C is
// within rtol of a float64 Go reference.
func run(ctx context.Context, w io.Writer, n, m, k int) error {
	if n < 1 || m < 1 || k < 1 {
		return fmt.Errorf("sizes must be at least 1, not %d×%d×%d", n, m, k)
	}
	// 1. Define C[i, j] = sum over k of A[i, k]·B[k, j] with symbolic sizes.
	N, M, K := te.Var("N"), te.Var("M"), te.Var("K")
	A := te.Placeholder([]ir.Expr{N, K}, ir.Float32, "A")
	B := te.Placeholder([]ir.Expr{K, M}, ir.Float32, "B")
	rk := te.ReduceAxis(ir.RangeFromExtent(K), "k")
	C := te.Compute([]ir.Expr{N, M}, func(i, j ir.Expr) ir.Expr {
		return te.Sum(ir.Mul(A.At(i, rk), B.At(rk, j)), rk)
	}, "C")
	f, err := te.CreatePrimFunc([]*te.Tensor{A, B, C})
	if err != nil {
		return fmt.Errorf("define: %w", err)
	}

	// 2. Schedule: s[C].parallel(C.op.axis[0]).
	s, err := schedule.New(f)
	if err != nil {
		return fmt.Errorf("schedule: %w", err)
	}
	c, err := s.GetBlock("C")
	if err != nil {
		return fmt.Errorf("schedule: %w", err)
	}
	axis, err := s.GetLoops(c) // C.op.axis, then the reduce axis
	if err != nil {
		return fmt.Errorf("schedule: %w", err)
	}
	if err := s.Parallel(axis[0]); err != nil {
		return fmt.Errorf("schedule: %w", err)
	}

	// 3. Build for the CPU.
	mod := ir.NewIRModule().With("matrix_multiply", s.Func().WithAttr(ir.AttrGlobalSymbol, "matrix_multiply"))
	target, err := compiler.ParseTarget("llvm") // "llvm" names the CPU target, as in TVM
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	art, err := compiler.Build(ctx, mod, target, compiler.BuildOptions{})
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	mo, err := load.Artifact(art, load.Options{})
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	defer mo.Close()
	fmatmul, err := mo.GetFunction("matrix_multiply")
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}

	// 4. Run on random matrices.
	rng := rand.New(rand.NewPCG(0, 3))
	av, bv := random(rng, n*k), random(rng, k*m)
	a, err := ndarray.FromSlice(av, ndarray.Shape{int64(n), int64(k)})
	if err != nil {
		return err
	}
	b, err := ndarray.FromSlice(bv, ndarray.Shape{int64(k), int64(m)})
	if err != nil {
		return err
	}
	cc, err := ndarray.FromSlice(make([]float32, n*m), ndarray.Shape{int64(n), int64(m)})
	if err != nil {
		return err
	}
	if _, err := fmatmul.Call(packedfunc.Array(a), packedfunc.Array(b), packedfunc.Array(cc)); err != nil {
		return fmt.Errorf("call: %w", err)
	}

	// Check against the reference, as np.testing.assert_allclose(rtol=1e-5).
	got, err := ndarray.ToSlice[float32](cc)
	if err != nil {
		return err
	}
	want := reference(av, bv, n, m, k)
	for i := range n {
		for j := range m {
			g, x := float64(got[i*m+j]), want[i*m+j]
			if !(math.Abs(g-x) <= rtol*math.Abs(x)) {
				return fmt.Errorf("C[%d, %d] = %g, want %g (rtol %g)", i, j, g, x, rtol)
			}
		}
	}
	_, err = fmt.Fprintf(w, "Matrix multiplication result matches with the Go reference (%d×%d×%d).\n", n, m, k)
	return err
}

// random returns n uniform [0, 1) float32 values.
func random(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = rng.Float32()
	}
	return v
}

// reference is A·B in float64 (i, k, j order, so the inner loop is
// contiguous).
func reference(a, b []float32, n, m, k int) []float64 {
	c := make([]float64, n*m)
	for i := range n {
		row := c[i*m : (i+1)*m]
		for x := range k {
			aik := float64(a[i*k+x])
			for j, bkj := range b[x*m : (x+1)*m] {
				row[j] += aik * float64(bkj)
			}
		}
	}
	return c
}
