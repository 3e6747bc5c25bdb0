package onnx

import (
	"math"

	"github.com/kiln-ml/kiln/compiler/frontend/onnx/onnxpb"
	"github.com/kiln-ml/kiln/compiler/ir"
)

// bnFold is a BatchNormalization folded into the Conv producing its
// input: the Conv's weight and bias replaced by scaled ones.
type bnFold struct {
	conv         *onnxpb.NodeProto
	weight, bias *Tensor
}

// foldBatchNorm finds the inference BatchNormalizations whose input is
// a Conv with float32 weights used nowhere else, and computes the Conv's
// weights with the normalization folded in: W' = W·s, b' = (b − mean)·s +
// β with s = γ/√(var + ε) per output channel. The result maps each
// folded BatchNormalization to its fold; Import then gives the Conv the
// new weights and the BatchNormalization the Conv's output.
func foldBatchNorm(m *Model) map[*onnxpb.NodeProto]*bnFold {
	uses := map[string]int{}
	producer := map[string]*onnxpb.NodeProto{}
	for _, n := range m.Nodes {
		for _, in := range n.GetInput() {
			uses[in]++
		}
		for _, o := range n.GetOutput() {
			producer[o] = n
		}
	}
	for _, o := range m.Outputs {
		uses[o.GetName()] += 2 // a graph output is never folded away
	}
	out := map[*onnxpb.NodeProto]*bnFold{}
	f32 := func(name string, n int64) *Tensor {
		t, ok := m.Initializers[name]
		if !ok || t.DType != ir.Float32 || t.NumElements() != n {
			return nil
		}
		return t
	}
	for _, bn := range m.Nodes {
		if bn.GetOpType() != "BatchNormalization" || len(bn.GetInput()) != 5 || len(bn.GetOutput()) != 1 {
			continue
		}
		training := false
		eps := 1e-5
		for _, a := range bn.GetAttribute() {
			switch a.GetName() {
			case "training_mode":
				training = a.GetI() != 0
			case "epsilon":
				eps = float64(a.GetF())
			}
		}
		conv := producer[bn.GetInput()[0]]
		if training || conv == nil || conv.GetOpType() != "Conv" || uses[bn.GetInput()[0]] != 1 {
			continue
		}
		cin := conv.GetInput()
		if len(cin) < 2 || uses[cin[1]] != 1 || len(cin) == 3 && cin[2] != "" && uses[cin[2]] != 1 {
			continue
		}
		w, ok := m.Initializers[cin[1]]
		if !ok || w.DType != ir.Float32 || len(w.Shape) < 3 {
			continue
		}
		c := w.Shape[0]
		var b *Tensor
		if len(cin) == 3 && cin[2] != "" {
			if b = f32(cin[2], c); b == nil {
				continue
			}
		}
		in := bn.GetInput()
		gamma, beta, mean, vr := f32(in[1], c), f32(in[2], c), f32(in[3], c), f32(in[4], c)
		if gamma == nil || beta == nil || mean == nil || vr == nil {
			continue
		}
		nw := newTensor(ir.Float32, w.Shape)
		nw.Name = cin[1]
		nb := newTensor(ir.Float32, []int64{c})
		nb.Name = bn.GetName() + "_folded_bias"
		if b != nil {
			nb.Name = cin[2]
		}
		per := w.NumElements() / c
		for o := int64(0); o < c; o++ {
			s := gamma.elem(int(o)) / math.Sqrt(vr.elem(int(o))+eps)
			for k := int64(0); k < per; k++ {
				i := int(o*per + k)
				setElem(nw.Data, ir.Float32, i, w.elem(i)*s)
			}
			bias := 0.0
			if b != nil {
				bias = b.elem(int(o))
			}
			setElem(nb.Data, ir.Float32, int(o), (bias-mean.elem(int(o)))*s+beta.elem(int(o)))
		}
		out[bn] = &bnFold{conv: conv, weight: nw, bias: nb}
	}
	return out
}
