package op

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// relax.matmul_packed(x, w) is matmul(x, w') for a weight w' of shape
// (K, N) packed as w of shape (N/P, K, P): w[jo, k, ji] = w'[k, jo·P + ji],
// so that a tile of P columns reads one contiguous panel of K·P values
// (AlterDenseLayout makes it; kiln's own operator, not TVM's). x is
// (…, M, K), static; the result is (…, M, N).
func init() {
	mustRegister(&Def{Name: "relax.matmul_packed", Args: []Arg{{Name: "x"}, {Name: "w"}}, Infer: inferMatmulPacked})
}

func inferMatmulPacked(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	w, err := tensor(c, 1)
	if err != nil {
		return nil, err
	}
	dt, err := unifyDType(c, x.DType, w.DType)
	if err != nil {
		return nil, err
	}
	if x.Shape == nil || w.Shape == nil || len(x.Shape) < 2 || len(w.Shape) != 3 {
		return nil, fmt.Errorf("%s: shapes %s and %s: want (…, M, K) and a packed weight (N/P, K, P), both known", name(c), shapeStr(x), shapeStr(w))
	}
	k, ok1 := ir.ConstDim(x.Shape[len(x.Shape)-1])
	wk, ok2 := ir.ConstDim(w.Shape[1])
	nb, ok3 := ir.ConstDim(w.Shape[0])
	p, ok4 := ir.ConstDim(w.Shape[2])
	if !ok1 || !ok2 || !ok3 || !ok4 || k != wk {
		return nil, fmt.Errorf("%s: shapes %s and %s do not match: reduction dimensions differ or are not constants", name(c), shapeStr(x), shapeStr(w))
	}
	out := append(append([]ir.Expr{}, x.Shape[:len(x.Shape)-1]...), i64(nb*p))
	return ir.Tensor(dt, out...), nil
}
