package topi

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
)

// Matmul returns numpy's matmul of a and b as Relax legalizes it: one
// stage "matmul" with indices i0, i1… and reduce axis k. Batch dimensions
// broadcast; a 1-D a is a row vector and a 1-D b a column vector, their
// added dimension dropped from the result. outDType, when not Void, is
// the dtype both operands are converted to before multiplying.
func Matmul(a, b *te.Tensor, outDType ir.DType) (*te.Tensor, error) {
	const op = "matmul"
	if err := checkInputs(op, a, b); err != nil {
		return nil, err
	}
	if ir.IsVoid(outDType) {
		if err := sameDType(op, a, b); err != nil {
			return nil, err
		}
	}
	if len(a.Shape) == 0 || len(b.Shape) == 0 {
		return nil, fmt.Errorf("%s: shapes %s and %s: operands must have at least one dimension", op, shapeStr(a.Shape), shapeStr(b.Shape))
	}
	as, bs := a.Shape, b.Shape
	aPre, bApp := len(as) == 1, len(bs) == 1
	if aPre {
		as = []ir.Expr{iconst(as[0], 1), as[0]}
	}
	if bApp {
		bs = []ir.Expr{bs[0], iconst(bs[0], 1)}
	}
	ka, kb := as[len(as)-1], bs[len(bs)-2]
	if !ir.DimEqual(ka, kb) {
		return nil, fmt.Errorf("%s: shapes %s and %s do not match: reduction dimensions %s and %s differ",
			op, shapeStr(a.Shape), shapeStr(b.Shape), ir.DimString(ka), ir.DimString(kb))
	}
	abatch, bbatch := as[:len(as)-2], bs[:len(bs)-2]
	batch, err := BroadcastShape(op, abatch, bbatch)
	if err != nil {
		return nil, fmt.Errorf("%s: batch dimensions of shapes %s and %s do not broadcast", op, shapeStr(a.Shape), shapeStr(b.Shape))
	}
	out := append([]ir.Expr{}, batch...)
	if !aPre {
		out = append(out, as[len(as)-2])
	}
	if !bApp {
		out = append(out, bs[len(bs)-1])
	}
	k := te.ReduceAxis(ir.RangeFromExtent(ka), "k")
	conv := func(e ir.Expr) ir.Expr {
		if ir.IsVoid(outDType) || e.DType() == outDType {
			return e
		}
		return ir.NewCast(outDType, e)
	}
	nb := len(batch)
	return finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		ai := broadcastIndex(abatch, batch, idx[:nb])
		bi := broadcastIndex(bbatch, batch, idx[:nb])
		rest := idx[nb:]
		if !aPre {
			ai = append(ai, rest[0])
			rest = rest[1:]
		}
		ai = append(ai, k)
		bi = append(bi, k)
		if !bApp {
			bi = append(bi, rest[0])
		}
		return te.Sum(ir.Mul(conv(a.At(ai...)), conv(b.At(bi...))), k)
	}, "matmul", names("i", len(out))...))
}

// Linear returns x @ wᵀ + bias (bias may be nil): stage T_matmul_NT over
// the last dimension of x and the second of w (out_features,
// in_features), then T_add for the bias. outDType as for Matmul.
func Linear(x, w, bias *te.Tensor, outDType ir.DType) (*te.Tensor, error) {
	const op = "linear"
	if err := checkInputs(op, x, w); err != nil {
		return nil, err
	}
	if len(w.Shape) != 2 {
		return nil, fmt.Errorf("%s: weight has shape %s, want (out_features, in_features)", op, shapeStr(w.Shape))
	}
	if len(x.Shape) == 0 {
		return nil, fmt.Errorf("%s: data is a scalar", op)
	}
	if ir.IsVoid(outDType) {
		if err := sameDType(op, x, w); err != nil {
			return nil, err
		}
	}
	in := x.Shape[len(x.Shape)-1]
	if !ir.DimEqual(in, w.Shape[1]) {
		return nil, fmt.Errorf("%s: data of shape %s has %s features, weight of shape %s takes %s",
			op, shapeStr(x.Shape), ir.DimString(in), shapeStr(w.Shape), ir.DimString(w.Shape[1]))
	}
	out := append(append([]ir.Expr{}, x.Shape[:len(x.Shape)-1]...), w.Shape[0])
	conv := func(e ir.Expr) ir.Expr {
		if ir.IsVoid(outDType) || e.DType() == outDType {
			return e
		}
		return ir.NewCast(outDType, e)
	}
	k := te.ReduceAxis(ir.RangeFromExtent(in), "k")
	n := len(out)
	mm, err := finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		xi := append(append([]ir.Expr{}, idx[:n-1]...), k)
		return te.Sum(ir.Mul(conv(x.At(xi...)), conv(w.At(idx[n-1], k))), k)
	}, "T_matmul_NT", names("i", n)...))
	if err != nil || bias == nil {
		return mm, err
	}
	if err := checkInputs(op, bias); err != nil {
		return nil, err
	}
	if len(bias.Shape) != 1 || !ir.DimEqual(bias.Shape[0], w.Shape[0]) {
		return nil, fmt.Errorf("%s: bias has shape %s, want (%s,)", op, shapeStr(bias.Shape), ir.DimString(w.Shape[0]))
	}
	if bias.DType != mm.DType {
		return nil, fmt.Errorf("%s: bias has dtype %s, want %s", op, bias.DType, mm.DType)
	}
	return Add(mm, bias)
}

// MatmulPacked returns a @ w' for the weight w' (K, N) packed as w
// (N/P, K, P) (relax.matmul_packed): stage "matmul" over a's leading
// indices and j, w read at (j / P, k, j % P).
func MatmulPacked(a, w *te.Tensor) (*te.Tensor, error) {
	const op = "matmul_packed"
	if err := checkInputs(op, a, w); err != nil {
		return nil, err
	}
	if err := sameDType(op, a, w); err != nil {
		return nil, err
	}
	if len(a.Shape) < 2 || len(w.Shape) != 3 || !ir.DimEqual(a.Shape[len(a.Shape)-1], w.Shape[1]) {
		return nil, fmt.Errorf("%s: shapes %s and %s: want (…, M, K) and (N/P, K, P)", op, shapeStr(a.Shape), shapeStr(w.Shape))
	}
	p, ok := ir.ConstDim(w.Shape[2])
	nb, ok2 := ir.ConstDim(w.Shape[0])
	if !ok || !ok2 {
		return nil, fmt.Errorf("%s: packed weight %s: want constant dimensions", op, shapeStr(w.Shape))
	}
	n := len(a.Shape)
	out := append(append([]ir.Expr{}, a.Shape[:n-1]...), iconst(a.Shape[n-1], nb*p))
	k := te.ReduceAxis(ir.RangeFromExtent(a.Shape[n-1]), "k")
	return finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		j := idx[n-1]
		pp := iconst(j, p)
		ai := append(append([]ir.Expr{}, idx[:n-1]...), k)
		return te.Sum(ir.Mul(a.At(ai...), w.At(ir.FloorDiv(j, pp), k, ir.FloorMod(j, pp))), k)
	}, "matmul", names("i", n)...))
}
