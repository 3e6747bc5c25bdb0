package te

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the printer's output")

func golden(t *testing.T, name, text string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		check.NoError(t, os.MkdirAll("testdata", 0o755))
		check.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	}
	want, err := os.ReadFile(path)
	check.NoError(t, err, "run go test -update to create", path)
	if text != string(want) {
		t.Fatalf("%s differs from %s (run go test -update to accept):\n%s", name, path, text)
	}
}

// TestCreatePrimFunc prints the PrimFuncs of the tensor-expression tutorial's examples and a few
// more stages and checks that each verifies and parses back.
func TestCreatePrimFunc(t *testing.T) {
	cases := []struct {
		name  string
		build func() []*Tensor
	}{
		{"vecadd_symbolic", func() []*Tensor {
			n := Var("n")
			A := Placeholder([]ir.Expr{n}, ir.Float32, "A")
			B := Placeholder([]ir.Expr{n}, ir.Float32, "B")
			C := Compute(A.Shape, func(i ir.Expr) ir.Expr { return ir.Add(A.At(i), B.At(i)) }, "C")
			return []*Tensor{A, B, C}
		}},
		{"matmul_symbolic", func() []*Tensor {
			N, M, K := Var("N"), Var("M"), Var("K")
			A := Placeholder([]ir.Expr{N, K}, ir.Float32, "A")
			B := Placeholder([]ir.Expr{K, M}, ir.Float32, "B")
			k := ReduceAxis(ir.RangeFromExtent(K), "k")
			C := Compute([]ir.Expr{N, M}, func(i, j ir.Expr) ir.Expr {
				return Sum(ir.Mul(A.At(i, k), B.At(k, j)), k)
			}, "C")
			return []*Tensor{A, B, C}
		}},
		{"two_stages", func() []*Tensor {
			A := Placeholder(Shape(4, 8), ir.Float32, "A")
			k := ReduceAxis(ir.RangeFromExtent(ir.I32(8)), "k")
			M := Compute(Shape(4), func(i ir.Expr) ir.Expr { return Max(A.At(i, k), k) }, "M")
			E := Compute(A.Shape, func(i ...ir.Expr) ir.Expr {
				return ir.Exp(ir.Sub(A.At(i...), M.At(i[0])))
			}, "E")
			S := Compute(Shape(4), func(i ir.Expr) ir.Expr { return Sum(E.At(i, k), k) }, "S")
			P := Compute(A.Shape, func(i, j ir.Expr) ir.Expr { return ir.Div(E.At(i, j), S.At(i)) }, "P", "row", "col")
			return []*Tensor{A, P}
		}},
		{"stencil_min_int", func() []*Tensor {
			A := Placeholder(Shape(10), ir.Int32, "A")
			r := ReduceAxis(ir.Range{Min: ir.I32(0), Extent: ir.I32(3)}, "r")
			B := Compute(Shape(8), func(i ir.Expr) ir.Expr { return Min(A.At(ir.Add(i, r)), r) }, "B")
			C := Compute(Shape(8), func(i ir.Expr) ir.Expr { return ir.Add(A.At(i), A.At(ir.Add(i, ir.I32(2)))) }, "C")
			return []*Tensor{A, B, C}
		}},
		{"int64_sizes", func() []*Tensor {
			n := VarOf("n", ir.Int64)
			A := Placeholder([]ir.Expr{n, ir.I64(3)}, ir.Float64, "A")
			B := Compute(A.Shape, func(i []ir.Expr) ir.Expr { return ir.Mul(A.At(i...), ir.F64(2)) }, "B")
			return []*Tensor{A, B}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, err := CreatePrimFunc(c.build())
			check.NoError(t, err)
			check.NoError(t, ir.Verify(f))
			text := script.Print(f)
			golden(t, c.name, text)
			m, err := script.Parse(c.name+".py", text)
			check.NoError(t, err)
			g := m.PrimFunc("main")
			check.True(t, g != nil, "main parses back")
			check.True(t, ir.StructuralEqual(f, g), "parse(print(f)) equals f")
		})
	}
}

// TestErrors checks that mistakes in definitions come back as errors.
func TestErrors(t *testing.T) {
	A := Placeholder(Shape(4, 4), ir.Float32, "A")
	B := Placeholder(Shape(4), ir.Float32, "B")
	k := ReduceAxis(ir.RangeFromExtent(ir.I32(4)), "k")
	cases := []struct {
		name string
		args func() []*Tensor
		want []string
	}{
		{"rank mismatch", func() []*Tensor {
			C := Compute(Shape(4), func(i ir.Expr) ir.Expr { return A.At(i) }, "C")
			return []*Tensor{A, C}
		}, []string{`compute "C"`, `tensor "A" has 2 dimensions, indexed with 1 indices`}},
		{"reduce axis outside reduction", func() []*Tensor {
			C := Compute(Shape(4), func(i ir.Expr) ir.Expr { return ir.Add(A.At(i, k), ir.F32(1)) }, "C")
			return []*Tensor{A, C}
		}, []string{`reduce axis "k" used outside a reduction over it`}},
		{"reduce axis of another reduction", func() []*Tensor {
			k2 := ReduceAxis(ir.RangeFromExtent(ir.I32(4)), "k2")
			C := Compute(Shape(4), func(i ir.Expr) ir.Expr { return Sum(A.At(i, k), k2) }, "C")
			return []*Tensor{A, C}
		}, []string{`reduce axis "k" used outside a reduction over it`}},
		{"nested reduction", func() []*Tensor {
			C := Compute(Shape(4), func(i ir.Expr) ir.Expr { return ir.Mul(Sum(A.At(i, k), k), ir.F32(2)) }, "C")
			return []*Tensor{A, C}
		}, []string{"te.Sum must be the outermost expression"}},
		{"unknown placeholder", func() []*Tensor {
			C := Compute(Shape(4), func(i ir.Expr) ir.Expr { return ir.Add(A.At(i, i), B.At(i)) }, "C")
			return []*Tensor{A, C}
		}, []string{`placeholder "B" read by "C" is not among the arguments`}},
		{"raw buffer", func() []*Tensor {
			raw := ir.NewBuffer("X", ir.Float32, Shape(4), "")
			C := Compute(Shape(4), func(i ir.Expr) ir.Expr { return raw.Load(i) }, "C")
			return []*Tensor{C}
		}, []string{`reads buffer "X", which is not a tensor`}},
		{"arity", func() []*Tensor {
			C := Compute(Shape(4, 4), func(i ir.Expr) ir.Expr { return B.At(i) }, "C")
			return []*Tensor{B, C}
		}, []string{"takes 1 indices, the shape has 2 dimensions"}},
		{"panicking closure", func() []*Tensor {
			C := Compute(Shape(4), func(i ...ir.Expr) ir.Expr { return B.At(i[3]) }, "C")
			return []*Tensor{B, C}
		}, []string{"the compute function panicked"}},
		{"nil value", func() []*Tensor {
			C := Compute(Shape(4), func(i ir.Expr) ir.Expr { return nil }, "C")
			return []*Tensor{C}
		}, []string{"returned nil"}},
		{"error propagates", func() []*Tensor {
			C := Compute(Shape(4), func(i ir.Expr) ir.Expr { return A.At(i) }, "C")
			D := Compute(Shape(4), func(i ir.Expr) ir.Expr { return C.At(i) }, "D")
			return []*Tensor{A, D}
		}, []string{`compute "D": reads "C": compute "C"`}},
		{"float extent", func() []*Tensor {
			C := Placeholder([]ir.Expr{ir.F32(2)}, ir.Float32, "C")
			return []*Tensor{C}
		}, []string{`tensor "C": extent 0`, "want an integer"}},
		{"duplicate argument", func() []*Tensor { return []*Tensor{B, B} }, []string{`tensor "B" is passed twice`}},
		{"nil argument", func() []*Tensor { return []*Tensor{B, nil} }, []string{"argument 1 is nil"}},
		{"no stage", func() []*Tensor { return []*Tensor{B} }, []string{"no compute stage"}},
		{"undefined size", func() []*Tensor {
			m := Var("m")
			C := Compute([]ir.Expr{m}, func(i ir.Expr) ir.Expr { return ir.F32(1) }, "C")
			D := Compute(Shape(4), func(i ir.Expr) ir.Expr { return C.At(i) }, "D")
			return []*Tensor{D}
		}, []string{`size variable "m" of "C" is not defined by the shape of any argument`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := CreatePrimFunc(c.args())
			check.Error(t, err, append([]string{"create_prim_func: "}, c.want...)...)
		})
	}
}

// TestReducerIdentities checks the init values of Max and Min per dtype.
func TestReducerIdentities(t *testing.T) {
	cases := []struct {
		t        ir.DType
		max, min string
	}{
		{ir.Float32, "T.float32(-3.4028234663852886e+38)", "T.float32(3.4028234663852886e+38)"},
		{ir.Int32, "-2147483648", "2147483647"},
		{ir.Int8, "T.int8(-128)", "T.int8(127)"},
		{ir.Uint8, "T.uint8(0)", "T.uint8(255)"},
	}
	for _, c := range cases {
		t.Run(c.t.String(), func(t *testing.T) {
			check.Equal(t, reduceMax.identity(c.t).String(), c.max)
			check.Equal(t, reduceMin.identity(c.t).String(), c.min)
			check.Equal(t, reduceSum.identity(c.t).String(), ir.Const(c.t, 0).String())
		})
	}
}
