// Command vecadd is the tensor-expression tutorial's first program: a vector add with a symbolic
// length, defined with tensor expressions, built for the CPU with the
// default schedule, run on random vectors and checked against a Go
// reference.
//
//	go run ./examples/vecadd [-n 1024]
//
// The Python it follows:
//
//	n = te.var("n")
//	A = te.placeholder((n,), name="A")
//	B = te.placeholder((n,), name="B")
//	C = te.compute(A.shape, lambda i: A[i] + B[i], name="C")
//	s = te.create_schedule(C.op)
//	fadd = tvm.build(s, [A, B, C], "llvm", name="matrix_add")
//	a = tvm.nd.array(np.random.uniform(size=n_value).astype(A.dtype), ctx)
//	...
//	fadd(a, b, c)
//	np.testing.assert_allclose(c.asnumpy(), a.asnumpy() + b.asnumpy())
//	print("Result matches with NumPy calculation.")
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
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

func main() {
	n := flag.Int("n", 1024, "number of elements")
	flag.Parse()
	if err := run(context.Background(), os.Stdout, *n); err != nil {
		fmt.Fprintf(os.Stderr, "vecadd: %v\n", err)
		os.Exit(1)
	}
}

// run defines, builds and runs the vector add on n random elements and
// prints "Result matches" when kiln's C equals A + B computed in Go.
func run(ctx context.Context, w io.Writer, n int) error {
	if n < 1 {
		return fmt.Errorf("n must be at least 1, not %d", n)
	}
	// 1. Define the computation: C = A + B over a symbolic length n.
	nv := te.Var("n")
	A := te.Placeholder([]ir.Expr{nv}, ir.Float32, "A")
	B := te.Placeholder([]ir.Expr{nv}, ir.Float32, "B")
	C := te.Compute(A.Shape, func(i ir.Expr) ir.Expr { return ir.Add(A.At(i), B.At(i)) }, "C")
	f, err := te.CreatePrimFunc([]*te.Tensor{A, B, C})
	if err != nil {
		return fmt.Errorf("define: %w", err)
	}

	// 2. The default schedule: the loop runs in order.
	s, err := schedule.New(f)
	if err != nil {
		return fmt.Errorf("schedule: %w", err)
	}

	// 3. Build for the CPU.
	mod := ir.NewIRModule().With("matrix_add", s.Func().WithAttr(ir.AttrGlobalSymbol, "matrix_add"))
	target, err := compiler.ParseTarget("llvm") // "llvm" names the CPU target, as in TVM
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	art, err := compiler.Build(ctx, mod, target, compiler.BuildOptions{})
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	m, err := load.Artifact(art, load.Options{})
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	defer m.Close()
	fadd, err := m.GetFunction("matrix_add")
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}

	// 4. Run on random inputs.
	rng := rand.New(rand.NewPCG(0, 3))
	av, bv := make([]float32, n), make([]float32, n)
	for i := range n {
		av[i], bv[i] = rng.Float32(), rng.Float32()
	}
	a, err := ndarray.FromSlice(av, ndarray.Shape{int64(n)})
	if err != nil {
		return err
	}
	b, err := ndarray.FromSlice(bv, ndarray.Shape{int64(n)})
	if err != nil {
		return err
	}
	c, err := ndarray.FromSlice(make([]float32, n), ndarray.Shape{int64(n)})
	if err != nil {
		return err
	}
	if _, err := fadd.Call(packedfunc.Array(a), packedfunc.Array(b), packedfunc.Array(c)); err != nil {
		return fmt.Errorf("call: %w", err)
	}

	// Check against the reference.
	got, err := ndarray.ToSlice[float32](c)
	if err != nil {
		return err
	}
	for i := range n {
		if want := av[i] + bv[i]; got[i] != want {
			return fmt.Errorf("C[%d] = %g, want %g", i, got[i], want)
		}
	}
	_, err = fmt.Fprintf(w, "Result matches with the Go reference (n = %d).\n", n)
	return err
}
