package op

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Elementwise operators: binary arithmetic with numpy broadcasting,
// comparisons (bool results), unary math, astype, clip and where.

var (
	binaryArith = []string{"add", "subtract", "multiply", "divide", "floor_divide", "power", "maximum", "minimum"}
	binaryCmp   = []string{"equal", "not_equal", "less", "less_equal", "greater", "greater_equal"}
	unaryMath   = []string{"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "abs", "negative", "erf", "floor", "ceil", "round", "square", "sin", "cos",
		"asin", "acos", "atan", "asinh", "acosh", "atanh"}
	unaryNN = []string{"nn.relu", "nn.gelu", "nn.gelu_tanh", "nn.silu"}
)

func init() {
	for _, n := range binaryArith {
		mustRegister(&Def{Name: "relax." + n, Args: []Arg{{Name: "x1"}, {Name: "x2"}}, Infer: inferBinary(ir.Void)})
	}
	for _, n := range binaryCmp {
		mustRegister(&Def{Name: "relax." + n, Args: []Arg{{Name: "x1"}, {Name: "x2"}}, Infer: inferBinary(ir.Bool)})
	}
	for _, n := range append(append([]string{}, unaryMath...), unaryNN...) {
		mustRegister(&Def{Name: "relax." + n, Args: []Arg{{Name: "x"}}, Infer: inferUnary})
	}
	mustRegister(&Def{Name: "relax.astype", Args: []Arg{{Name: "x"}},
		Attrs: []Attr{{Name: "dtype", Kind: AttrDType, Default: "float32"}}, Infer: inferAstype})
	mustRegister(&Def{Name: "relax.clip", Args: []Arg{{Name: "x"}, {Name: "min", Kind: ArgPrim}, {Name: "max", Kind: ArgPrim}},
		Infer: inferUnary})
	mustRegister(&Def{Name: "relax.where", Args: []Arg{{Name: "condition"}, {Name: "x1"}, {Name: "x2"}}, Infer: inferWhere})
}

func inferBinary(result ir.DType) func(c *ir.RCall) (ir.StructInfo, error) {
	return func(c *ir.RCall) (ir.StructInfo, error) {
		a, err := tensor(c, 0)
		if err != nil {
			return nil, err
		}
		b, err := tensor(c, 1)
		if err != nil {
			return nil, err
		}
		return broadcast(c, result, a, b)
	}
}

func inferUnary(c *ir.RCall) (ir.StructInfo, error) {
	return tensor(c, 0)
}

func inferAstype(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	dt, err := attrDType(c, "dtype")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name(c), err)
	}
	return &ir.TensorStructInfo{Shape: x.Shape, NDim: x.NDim, DType: dt}, nil
}

func inferWhere(c *ir.RCall) (ir.StructInfo, error) {
	cond, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	if !ir.IsVoid(cond.DType) && !ir.IsBool(cond.DType) {
		return nil, fmt.Errorf("%s: condition has dtype %s, want bool", name(c), cond.DType)
	}
	a, err := tensor(c, 1)
	if err != nil {
		return nil, err
	}
	b, err := tensor(c, 2)
	if err != nil {
		return nil, err
	}
	dt, err := unifyDType(c, a.DType, b.DType)
	if err != nil {
		return nil, err
	}
	cond = &ir.TensorStructInfo{Shape: cond.Shape, NDim: cond.NDim, DType: dt}
	return broadcast(c, dt, cond, a, b)
}
