package transform

import (
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestFlattenMmaFragments: ptx_mma operands given as vector loads of a
// fragment become the fragment's data and its first element's offset.
func TestFlattenMmaFragments(t *testing.T) {
	af := ir.NewBuffer("A_frag", ir.Float16, []ir.Expr{ir.I32(2), ir.I32(8)}, "local")
	bf := ir.NewBuffer("B_frag", ir.Float16, []ir.Expr{ir.I32(3), ir.I32(4)}, "local")
	cf := ir.NewBuffer("C_frag", ir.Float32, []ir.Expr{ir.I32(2), ir.I32(3), ir.I32(4)}, "local")
	frag := func(b *ir.Buffer, n int, lead ...int64) *ir.BufferLoad {
		idx := []ir.Expr{}
		for _, x := range lead {
			idx = append(idx, ir.I32(x))
		}
		return b.Load(append(idx, ir.NewRamp(ir.I32(0), ir.I32(1), n))...)
	}
	call := ir.PtxMmaFragments("fp16", frag(af, 8, 1), frag(bf, 4, 2), frag(cf, 4, 1, 2))
	body := &ir.Allocate{Buffer: af, Body: &ir.Allocate{Buffer: bf, Body: &ir.Allocate{Buffer: cf, Body: &ir.Evaluate{Value: call}}}}
	f, err := FlattenBuffers(ir.NewPrimFunc(nil, body, nil))
	check.NoError(t, err)
	var got *ir.Call
	ir.Visit(f.Body, func(n ir.Node) bool {
		if c, ok := n.(*ir.Call); ok && c.Op == ir.OpPtxMma {
			got = c
		}
		return true
	})
	check.True(t, got != nil, "no ptx_mma")
	for n, w := range []struct {
		data *ir.Var
		off  int64
	}{{af.Data, 8}, {bf.Data, 8}, {cf.Data, 20}} {
		i := 6 + 2*n
		check.True(t, got.Args[i] == w.data, "argument", i, "is", got.Args[i])
		off, ok := ir.IsConstInt(got.Args[i+1])
		check.True(t, ok && off == w.off, "offset of", w.data.Name, "is", got.Args[i+1])
	}

	bad := &ir.Call{Type: ir.Void, Op: ir.OpPtxMma, Args: append(append([]ir.Expr{}, call.Args[:6]...),
		frag(af, 4, 1), ir.I32(0), call.Args[8], call.Args[9], call.Args[10], call.Args[11], call.Args[12])}
	_, err = FlattenBuffers(ir.NewPrimFunc(nil, &ir.Allocate{Buffer: af, Body: &ir.Evaluate{Value: bad}}, nil))
	check.True(t, err != nil, "a fragment of 4 elements of A flattens")
	check.Equal(t, err.Error(), "ptx_mma operand A_frag[1, T.Ramp(0, 1, 4)] is not a load of the 8 elements of a fragment")
}
