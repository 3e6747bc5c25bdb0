package op

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Reductions over axes: sum, mean, prod, max, min (axis=None reduces every
// axis) and argmax, argmin (one axis or all; int64 results).

func init() {
	for _, n := range []string{"sum", "mean", "prod", "max", "min", "variance", "std"} {
		mustRegister(&Def{Name: "relax." + n, Args: []Arg{{Name: "x"}},
			Attrs: []Attr{{Name: "axis", Kind: AttrOptInts}, {Name: "keepdims", Kind: AttrBool, Default: false}},
			Infer: inferReduce})
	}
	for _, n := range []string{"argmax", "argmin"} {
		mustRegister(&Def{Name: "relax." + n, Args: []Arg{{Name: "x"}},
			Attrs: []Attr{{Name: "axis", Kind: AttrOptInt}, {Name: "keepdims", Kind: AttrBool, Default: false}},
			Infer: inferReduce})
	}
}

func inferReduce(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	dt := x.DType
	if n := name(c); n == "argmax" || n == "argmin" {
		dt = ir.Int64
	}
	keep := attrBool(c, "keepdims")
	var axes []int64
	all := c.Attrs["axis"] == nil
	if !all {
		if a, ok := attrInt(c, "axis"); ok {
			axes = []int64{a}
		} else {
			axes, _ = attrInts(c, "axis")
		}
	}
	if x.NDim < 0 {
		if all && !keep {
			return ir.Tensor(dt), nil
		}
		return ir.TensorNDim(dt, -1), nil
	}
	reduced := make([]bool, x.NDim)
	if all {
		for i := range reduced {
			reduced[i] = true
		}
	} else {
		ax, err := normAxes(c, axes, x.NDim)
		if err != nil {
			return nil, err
		}
		for _, a := range ax {
			reduced[a] = true
		}
	}
	ndim := 0
	var out []ir.Expr
	for i, r := range reduced {
		switch {
		case !r:
			ndim++
			if x.Shape != nil {
				out = append(out, x.Shape[i])
			}
		case keep:
			ndim++
			out = append(out, i64(1))
		}
	}
	if x.Shape == nil {
		return ir.TensorNDim(dt, ndim), nil
	}
	if len(out) != ndim {
		return nil, fmt.Errorf("%s: internal rank mismatch", name(c))
	}
	return ir.Tensor(dt, out...), nil
}
