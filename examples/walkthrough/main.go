// Command walkthrough follows TVM's "Codebase Walkthrough by Example" ("TVM codebase walkthrough by
// example") with kiln: the vector add of 1024 elements goes through every
// phase, and each phase prints what it produced and which package did it.
//
//	go run ./examples/walkthrough [-n 1024]
//
// The phases, as the seed lists them for TVM:
//
//  1. Tensor expressions (te.placeholder, te.compute): compiler/te.
//  2. The schedule (te.create_schedule): compiler/schedule, over the
//     TensorIR PrimFunc that te.CreatePrimFunc makes.
//  3. Lowering (tvm.lower: bound inference, loop nests, then passes such
//     as VectorizeLoop and UnrollLoop): compiler/transform, a pass list.
//  4. Code generation (tvm.build: target code in a runtime module):
//     compiler/codegen/c writes C, compiler/toolchain compiles it into
//     host.so, package artifact packs the .kiln file; compiler.Build runs
//     all of it.
//  5. Running (runtime.Module, GetFunction, NDArrays, fadd(a, b, c)):
//     devices/cpu loads the artifact, packedfunc calls the kernel on
//     ndarray arrays.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/load"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

func main() {
	n := flag.Int("n", 1024, "number of elements")
	flag.Parse()
	if err := run(context.Background(), os.Stdout, *n); err != nil {
		fmt.Fprintf(os.Stderr, "walkthrough: %v\n", err)
		os.Exit(1)
	}
}

// run walks the vector add of n elements through every phase, printing
// each phase's result to w, and checks the output against A + B.
func run(ctx context.Context, w io.Writer, n int) error {
	if n < 1 {
		return fmt.Errorf("n must be at least 1, not %d", n)
	}
	p := &printer{w: w}

	p.section("1. Tensor expressions (compiler/te)")
	A := te.Placeholder(te.Shape(int64(n)), ir.Float32, "A")
	B := te.Placeholder(te.Shape(int64(n)), ir.Float32, "B")
	C := te.Compute(A.Shape, func(i ir.Expr) ir.Expr { return ir.Add(A.At(i), B.At(i)) }, "C")
	for _, t := range []*te.Tensor{A, B, C} {
		kind := "compute"
		if t.IsPlaceholder() {
			kind = "placeholder"
		}
		p.printf("%s: %s, shape %s, %s\n", t.Name, kind, t.Shape, t.DType)
	}
	f, err := te.CreatePrimFunc([]*te.Tensor{A, B, C})
	if err != nil {
		return fmt.Errorf("create prim func: %w", err)
	}
	f = f.WithAttr(ir.AttrGlobalSymbol, "vecadd")

	p.section("2. Schedule (compiler/schedule): the default one, loops in order")
	s, err := schedule.New(f)
	if err != nil {
		return fmt.Errorf("schedule: %w", err)
	}
	p.printf("%s", script.Print(s.Func()))

	p.section("3. Lowering (compiler/transform)")
	p.printf("passes: %s\n", strings.Join(transform.PassNames(), " → "))
	lowered, err := transform.Lower(s.Func(), transform.Options{StopAfter: "storage_rewrite", Verify: true})
	if err != nil {
		return fmt.Errorf("lower: %w", err)
	}
	p.printf("after storage_rewrite (make_packed_api then adds the argument checks):\n%s", script.Print(lowered))

	p.section("4. Code generation (compiler.Build: codegen/c, toolchain, artifact)")
	mod := ir.NewIRModule().With("vecadd", s.Func())
	// The loops as section 2 left them: kiln's default schedule would
	// vectorize them, and the C would no longer follow section 3.
	res, err := compiler.BuildWithResult(ctx, mod, compiler.Target{Kind: "cpu"}, compiler.BuildOptions{NoCache: true, NoDefaultSchedule: true})
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	p.printf("generated C for vecadd:\n%s", exported(res.Source, "vecadd"))
	p.printf("artifact: target %s, entries %s\n", res.Artifact.Manifest.Target, strings.Join(res.Artifact.Names(), ", "))
	for _, fi := range res.Artifact.Manifest.Functions {
		var params []string
		for _, prm := range fi.Params {
			dims := make([]string, len(prm.Shape))
			for i, d := range prm.Shape {
				dims[i] = d.Name
				if d.Name == "" {
					dims[i] = fmt.Sprint(d.Value)
				}
			}
			params = append(params, fmt.Sprintf("%s: %s[%s]", prm.Name, prm.DType, strings.Join(dims, ", ")))
		}
		p.printf("function %s(%s)\n", fi.Name, strings.Join(params, ", "))
	}

	p.section("5. Run (devices/cpu, packedfunc, ndarray)")
	m, err := load.Artifact(res.Artifact, load.Options{})
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	defer m.Close()
	fadd, err := m.GetFunction("vecadd")
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	p.printf("module %s: functions %s\n", m.Type(), strings.Join(m.Functions(), ", "))
	rng := rand.New(rand.NewPCG(0, 4))
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
	c, err := ndarray.Zeros(ndarray.Shape{int64(n)}, ndarray.Float32, a.Device())
	if err != nil {
		return err
	}
	if _, err := fadd.Call(packedfunc.Array(a), packedfunc.Array(b), packedfunc.Array(c)); err != nil {
		return fmt.Errorf("call: %w", err)
	}
	output, err := ndarray.ToSlice[float32](c)
	if err != nil {
		return err
	}
	p.printf("fadd(a, b, c): c = %s\n", head(output, 4))
	for i := range n {
		if want := av[i] + bv[i]; output[i] != want {
			return fmt.Errorf("C[%d] = %g, want %g", i, output[i], want)
		}
	}
	p.printf("Result matches with the Go reference.\n")
	return p.err
}

// printer writes to w and keeps the first write error.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) printf(format string, a ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, a...)
	}
}

func (p *printer) section(title string) { p.printf("\n== %s ==\n", title) }

// exported cuts the definition of the exported function name out of the
// generated C.
func exported(src, name string) string {
	start := strings.Index(src, " "+name+"(KilnValue*")
	if start < 0 {
		return src
	}
	start = strings.LastIndex(src[:start], "\n") + 1
	end := strings.Index(src[start:], "\n}\n")
	if end < 0 {
		return src[start:]
	}
	return src[start : start+end+3]
}

// head formats the first k values of v.
func head(v []float32, k int) string {
	if len(v) <= k {
		return fmt.Sprint(v)
	}
	return strings.TrimSuffix(fmt.Sprint(v[:k]), "]") + " …]"
}
