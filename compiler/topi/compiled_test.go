package topi

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/ckernel"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// TestCompiledMatchesInterpreter builds every legalized operator of
// legalizeCases into one C library and checks that it computes what the
// interpreter computes (a differential test of the operator library
// against the code generator). One C compilation at -O0 (quick),
// cached between runs.
func TestCompiledMatchesInterpreter(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles C")
	}
	cases := legalizeCases()
	mod := ir.NewIRModule()
	results := map[string]*Result{}
	for _, name := range Ops() {
		c := cases[name]
		call, err := op.Call(name, c.args, c.attr)
		check.NoError(t, err, name)
		r, err := LegalizeCall(call)
		check.NoError(t, err, name)
		// Prefixed: the code generator exports functions under their own
		// names, and "exp", "log"… would clash with libm.
		fn := "topi_" + strings.ReplaceAll(strings.TrimPrefix(name, "relax."), ".", "_")
		results[fn] = r
		mod = mod.With(fn, r.Func.WithAttr(ir.AttrGlobalSymbol, fn))
	}
	// Lower, generate and compile directly: package compiler imports the
	// graph passes, which import topi.
	m := ckernel.Load(t, ckernel.Source(t, mod), "-O0")
	rng := rand.New(rand.NewPCG(30, 1))
	for fn, r := range results {
		t.Run(fn, func(t *testing.T) {
			var ins, outs []arr
			for _, a := range r.Args {
				ts := ir.StructInfoOf(a).(*ir.TensorStructInfo)
				shape, _ := ts.KnownShape()
				in := randArr(rng, ts.DType, shape...)
				if fn == "topi_log" || fn == "topi_sqrt" || fn == "topi_rsqrt" || fn == "topi_power" {
					for i := range in.data {
						in.data[i] = f32(in.data[i]*in.data[i] + 0.1)
					}
				}
				ins = append(ins, in)
			}
			infos := []ir.StructInfo{r.Out}
			if tup, ok := r.Out.(*ir.TupleStructInfo); ok {
				infos = tup.Fields
			}
			for _, si := range infos {
				ts := si.(*ir.TensorStructInfo)
				shape, _ := ts.KnownShape()
				outs = append(outs, newArr(ts.DType, shape...))
			}
			want := runPrimFunc(t, r.Func, ins, outs)
			f, err := m.GetFunction(fn)
			check.NoError(t, err)
			var args []packedfunc.Value
			var nds []*ndarray.NDArray
			for _, a := range append(append([]arr{}, ins...), outs...) {
				nd := toND(t, a)
				nds = append(nds, nd)
				args = append(args, packedfunc.Array(nd))
			}
			_, err = f.Call(args...)
			check.NoError(t, err)
			for i := range outs {
				got := arr{shape: outs[i].shape, dt: outs[i].dt, data: fromND(t, nds[len(ins)+i])}
				near(t, got, want[i], 1e-5)
			}
		})
	}
}
