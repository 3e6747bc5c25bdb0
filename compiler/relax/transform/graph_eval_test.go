package transform

import (
	"fmt"
	"math"
	"testing"

	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// graphEval runs a graph function of mod on host arrays: call_tir and
// direct PrimFunc calls go through the reference interpreter, grouped
// functions are evaluated recursively, and the memory operators of
// StaticPlanBlockMemory work on byte storages (a tensor is a view at its
// byte offset; a killed tensor is filled with 0xFF, so reading it
// afterwards shows as NaN).
type graphEval struct {
	mod *ir.IRModule
}

func (g *graphEval) call(name string, args []any) (any, error) {
	f, ok := g.mod.Lookup(name)
	if !ok {
		return nil, fmt.Errorf("no function %q", name)
	}
	switch f := f.(type) {
	case *ir.PrimFunc:
		return nil, interp.Run(f, args...)
	case *ir.Function:
		env := map[*ir.RVar]any{}
		for i, p := range f.Params {
			env[p] = args[i]
		}
		return g.seq(f.Body, env)
	}
	return nil, fmt.Errorf("cannot call %T", f)
}

func (g *graphEval) seq(s *ir.SeqExpr, env map[*ir.RVar]any) (any, error) {
	for _, b := range s.Blocks {
		for _, bd := range b.Bindings {
			v, err := g.expr(bd.BoundValue(), env)
			if err != nil {
				return nil, fmt.Errorf("binding %q: %w", bd.BoundVar().Name, err)
			}
			env[bd.BoundVar()] = v
		}
	}
	return g.expr(s.Body, env)
}

func (g *graphEval) expr(e ir.RExpr, env map[*ir.RVar]any) (any, error) {
	switch e := e.(type) {
	case *ir.RVar:
		v, ok := env[e]
		if !ok {
			return nil, fmt.Errorf("unbound %q", e.Name)
		}
		return v, nil
	case *ir.Constant:
		return ndarray.FromBytes(e.Data, e.Shape, e.DType, devices.CPUDevice)
	case *ir.RTuple:
		out := make([]any, len(e.Fields))
		for i, f := range e.Fields {
			v, err := g.expr(f, env)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	case *ir.TupleGetItem:
		t, err := g.expr(e.Tuple, env)
		if err != nil {
			return nil, err
		}
		return t.([]any)[e.Index], nil
	case *ir.ShapeExpr:
		out := make([]int64, len(e.Values))
		for i, v := range e.Values {
			c, ok := ir.ConstDim(v)
			if !ok {
				return nil, fmt.Errorf("symbolic shape")
			}
			out[i] = c
		}
		return out, nil
	case *ir.PrimValue, *ir.RString, *ir.DataTypeImm:
		return e, nil
	case *ir.RCall:
		return g.rcall(e, env)
	}
	return nil, fmt.Errorf("cannot evaluate %T", e)
}

func flatArrays(v any) []any {
	if t, ok := v.([]any); ok {
		var out []any
		for _, f := range t {
			out = append(out, flatArrays(f)...)
		}
		return out
	}
	return []any{v}
}

func (g *graphEval) rcall(c *ir.RCall, env map[*ir.RVar]any) (any, error) {
	args := make([]any, len(c.Args))
	for i, a := range c.Args {
		if _, ok := a.(*ir.GlobalVar); ok {
			continue
		}
		v, err := g.expr(a, env)
		if err != nil {
			return nil, err
		}
		args[i] = v
	}
	switch o := c.Op.(type) {
	case *ir.GlobalVar:
		var flat []any
		for _, a := range args {
			flat = append(flat, flatArrays(a)...)
		}
		if g.mod.PrimFunc(o.Name) != nil {
			return []any{}, g.runPrim(o.Name, flat)
		}
		return g.call(o.Name, args)
	case *ir.Op:
		switch o.Name {
		case ir.OpCallTIR:
			outs, _ := tensorFields(c.SInfoArgs[0])
			ins := flatArrays(args[1])
			var res []any
			for _, t := range outs {
				dims, _ := t.KnownShape()
				a, err := ndarray.Zeros(dims, t.DType, devices.CPUDevice)
				if err != nil {
					return nil, err
				}
				res = append(res, a)
			}
			if err := g.runPrim(c.Args[0].(*ir.GlobalVar).Name, append(ins, res...)); err != nil {
				return nil, err
			}
			if len(res) == 1 {
				if _, tuple := c.SInfoArgs[0].(*ir.TupleStructInfo); !tuple {
					return res[0], nil
				}
			}
			return res, nil
		case "relax.memory.alloc_storage":
			size := args[0].([]int64)[0]
			return ndarray.Zeros(ndarray.Shape{size}, ndarray.MustParseDType("uint8"), devices.CPUDevice)
		case "relax.memory.alloc_tensor":
			st := args[0].(*ndarray.NDArray)
			off, ok := ir.IsConstInt(args[1].(*ir.PrimValue).Value)
			if !ok {
				return nil, fmt.Errorf("alloc_tensor: offset %v", args[1])
			}
			shape := ndarray.Shape(args[2].([]int64))
			return st.StridedView(shape, args[3].(*ir.DataTypeImm).DType, ndarray.CompactStrides(shape), off)
		case "relax.builtin.alloc_tensor":
			return ndarray.Zeros(args[0].([]int64), args[1].(*ir.DataTypeImm).DType, devices.CPUDevice)
		case "relax.memory.kill_tensor":
			a := args[0].(*ndarray.NDArray)
			b := make([]byte, a.NumBytes())
			for i := range b {
				b[i] = 0xFF
			}
			return []any{}, a.CopyFromBytes(b)
		case "relax.memory.kill_storage":
			return []any{}, nil
		}
	}
	return nil, fmt.Errorf("cannot evaluate a call of %s", calleeHint(c))
}

func (g *graphEval) runPrim(name string, args []any) error {
	f := g.mod.PrimFunc(name)
	if f == nil {
		return fmt.Errorf("no PrimFunc %q", name)
	}
	return interp.Run(f, args...)
}

// randomInputs makes deterministic inputs for the parameters of main.
func randomInputs(t *testing.T, mod *ir.IRModule) []any {
	t.Helper()
	f, _ := mod.Lookup("main")
	seed := uint32(12345)
	var out []any
	for _, p := range f.(*ir.Function).Params {
		ts := p.Info.(*ir.TensorStructInfo)
		dims, ok := ts.KnownShape()
		check.True(t, ok, "static shapes")
		n := ndarray.Shape(dims).NumElements()
		data := make([]float32, n)
		for i := range data {
			seed = seed*1664525 + 1013904223
			data[i] = float32(seed>>8)/float32(1<<24)*2 - 1
		}
		a, err := ndarray.FromSlice(data, dims)
		check.NoError(t, err)
		out = append(out, a)
	}
	return out
}

// runMain evaluates main and returns its result's float32 values.
func runMain(t *testing.T, mod *ir.IRModule, inputs []any) [][]float32 {
	t.Helper()
	res, err := (&graphEval{mod: mod}).call("main", inputs)
	check.NoError(t, err)
	var out [][]float32
	for _, a := range flatArrays(res) {
		b, err := a.(*ndarray.NDArray).Bytes()
		check.NoError(t, err)
		vals := make([]float32, len(b)/4)
		for i := range vals {
			vals[i] = math.Float32frombits(uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24)
		}
		out = append(out, vals)
	}
	return out
}

// sameResults checks two results agree to a relative 1e-5.
func sameResults(t *testing.T, got, want [][]float32) {
	t.Helper()
	check.Equal(t, len(got), len(want), "outputs")
	for i := range want {
		check.Equal(t, len(got[i]), len(want[i]), "elements")
		for j := range want[i] {
			g, w := float64(got[i][j]), float64(want[i][j])
			if math.IsNaN(g) || math.Abs(g-w) > 1e-5*max(1, math.Abs(w)) {
				t.Fatalf("output %d element %d: got %v, want %v", i, j, g, w)
			}
		}
	}
}
