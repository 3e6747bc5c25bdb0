package topi

import (
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
)

// Unary elementwise operators, cast, clip and where. TVM's C++ operators
// (T_exp, T_cast, T_clip, T_where…) index with ax0, ax1…; its Python ones
// (relu, gelu, silu: stage "compute") with i0, i1….

// unaryFn is the element function of a unary operator and whether it
// needs a float input.
type unaryFn struct {
	fn        func(x ir.Expr) ir.Expr
	floatOnly bool
	stage     string // "" for T_<name>
}

func floatIntrin(f func(ir.Expr) ir.Expr) unaryFn { return unaryFn{fn: f, floatOnly: true} }

var unaryOps = map[string]unaryFn{
	"exp":     floatIntrin(ir.Exp),
	"log":     floatIntrin(ir.Log),
	"sqrt":    floatIntrin(ir.Sqrt),
	"rsqrt":   floatIntrin(ir.Rsqrt),
	"tanh":    floatIntrin(ir.Tanh),
	"sigmoid": floatIntrin(ir.Sigmoid),
	"erf":     floatIntrin(ir.Erf),
	"floor":   floatIntrin(ir.Floor),
	"ceil":    floatIntrin(ir.Ceil),
	"round":   floatIntrin(ir.Round),
	"sin":     floatIntrin(func(x ir.Expr) ir.Expr { return ir.CallIntrin("sin", x) }),
	"cos":     floatIntrin(func(x ir.Expr) ir.Expr { return ir.CallIntrin("cos", x) }),
	"asin":    floatIntrin(func(x ir.Expr) ir.Expr { return ir.CallIntrin("asin", x) }),
	"acos":    floatIntrin(func(x ir.Expr) ir.Expr { return ir.CallIntrin("acos", x) }),
	"atan":    floatIntrin(func(x ir.Expr) ir.Expr { return ir.CallIntrin("atan", x) }),
	"asinh":   floatIntrin(func(x ir.Expr) ir.Expr { return ir.CallIntrin("asinh", x) }),
	"acosh":   floatIntrin(func(x ir.Expr) ir.Expr { return ir.CallIntrin("acosh", x) }),
	"atanh":   floatIntrin(func(x ir.Expr) ir.Expr { return ir.CallIntrin("atanh", x) }),
	"abs": {fn: func(x ir.Expr) ir.Expr {
		if x.DType().IsFloat() {
			return ir.Fabs(x)
		}
		return ir.NewSelect(ir.LT(x, ir.Const(x.DType(), 0)), ir.Sub(ir.Const(x.DType(), 0), x), x)
	}},
	"negative": {fn: func(x ir.Expr) ir.Expr { return ir.Sub(ir.Const(x.DType(), 0), x) }},
	"square":   {fn: func(x ir.Expr) ir.Expr { return ir.Mul(x, x) }},
	"relu":     {fn: func(x ir.Expr) ir.Expr { return ir.Max(x, ir.Const(x.DType(), 0)) }, stage: "compute"},
	// gelu(x) = x * (0.5 + erf(x / sqrt(2)) * 0.5)
	"gelu": {fn: func(x ir.Expr) ir.Expr {
		t := x.DType()
		erf := ir.Erf(ir.Mul(x, ir.Const(t, math.Sqrt2/2)))
		return ir.Mul(x, ir.Add(ir.Const(t, 0.5), ir.Mul(erf, ir.Const(t, 0.5))))
	}, floatOnly: true, stage: "compute"},
	// gelu_tanh(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
	"gelu_tanh": {fn: func(x ir.Expr) ir.Expr {
		t := x.DType()
		inner := ir.Mul(ir.Const(t, math.Sqrt(2/math.Pi)), ir.Add(x, ir.Mul(ir.Const(t, 0.044715), ir.Mul(ir.Mul(x, x), x))))
		return ir.Mul(ir.Mul(ir.Const(t, 0.5), x), ir.Add(ir.Const(t, 1), ir.Tanh(inner)))
	}, floatOnly: true, stage: "compute"},
	"silu": {fn: func(x ir.Expr) ir.Expr { return ir.Mul(x, ir.Sigmoid(x)) }, floatOnly: true, stage: "compute"},
}

// UnaryOps lists the operator names Unary accepts, sorted.
func UnaryOps() []string { return slices.Sorted(maps.Keys(unaryOps)) }

// Unary applies the elementwise operator op to x: "exp", "log", "sqrt",
// "rsqrt", "tanh", "sigmoid", "erf", "floor", "ceil", "round", "sin",
// "cos", "asin", "acos", "atan", "asinh", "acosh", "atanh", "abs",
// "negative", "square" (stage T_<op>, indices ax0…) and
// "relu", "gelu" (erf form), "gelu_tanh", "silu" (stage compute, indices
// i0…). Math functions need a float input.
func Unary(op string, x *te.Tensor) (*te.Tensor, error) {
	u, ok := unaryOps[op]
	if !ok {
		return nil, fmt.Errorf("unary: unknown operator %q", op)
	}
	if err := checkInputs(op, x); err != nil {
		return nil, err
	}
	if u.floatOnly {
		if err := checkFloat(op, x); err != nil {
			return nil, err
		}
	}
	stage, prefix := "T_"+op, "ax"
	if u.stage != "" {
		stage, prefix = u.stage, "i"
	}
	return finish(te.Compute(x.Shape, func(idx []ir.Expr) ir.Expr {
		return u.fn(x.At(idx...))
	}, stage, names(prefix, len(x.Shape))...))
}

// Exp returns e**x.
func Exp(x *te.Tensor) (*te.Tensor, error) { return Unary("exp", x) }

// Log returns the natural logarithm of x.
func Log(x *te.Tensor) (*te.Tensor, error) { return Unary("log", x) }

// Sqrt returns the square root of x.
func Sqrt(x *te.Tensor) (*te.Tensor, error) { return Unary("sqrt", x) }

// Tanh returns tanh(x).
func Tanh(x *te.Tensor) (*te.Tensor, error) { return Unary("tanh", x) }

// Sigmoid returns 1 / (1 + e**-x).
func Sigmoid(x *te.Tensor) (*te.Tensor, error) { return Unary("sigmoid", x) }

// Relu returns max(x, 0) (stage compute, as TVM's topi.nn.relu).
func Relu(x *te.Tensor) (*te.Tensor, error) { return Unary("relu", x) }

// Gelu returns x * (0.5 + erf(x / sqrt(2)) * 0.5).
func Gelu(x *te.Tensor) (*te.Tensor, error) { return Unary("gelu", x) }

// Silu returns x * sigmoid(x).
func Silu(x *te.Tensor) (*te.Tensor, error) { return Unary("silu", x) }

// Abs returns |x|.
func Abs(x *te.Tensor) (*te.Tensor, error) { return Unary("abs", x) }

// Negative returns -x.
func Negative(x *te.Tensor) (*te.Tensor, error) { return Unary("negative", x) }

// Erf returns the error function of x.
func Erf(x *te.Tensor) (*te.Tensor, error) { return Unary("erf", x) }

// Cast converts x to dtype (stage T_cast), with C conversion semantics.
func Cast(x *te.Tensor, dtype ir.DType) (*te.Tensor, error) {
	const op = "astype"
	if err := checkInputs(op, x); err != nil {
		return nil, err
	}
	if dtype.Lanes != 1 || dtype.Bits == 0 {
		return nil, fmt.Errorf("%s: cannot cast to %s", op, dtype)
	}
	return finish(te.Compute(x.Shape, func(idx []ir.Expr) ir.Expr {
		return ir.NewCast(dtype, x.At(idx...))
	}, "T_cast", names("ax", len(x.Shape))...))
}

// Clip limits x to [lo, hi] (stage T_clip): max(min(x, hi), lo). The
// bounds are converted to x's dtype.
func Clip(x *te.Tensor, lo, hi ir.Expr) (*te.Tensor, error) {
	const op = "clip"
	if err := checkInputs(op, x); err != nil {
		return nil, err
	}
	if lo == nil || hi == nil {
		return nil, fmt.Errorf("%s: missing bound", op)
	}
	lo, hi = castScalar(lo, x.DType), castScalar(hi, x.DType)
	return finish(te.Compute(x.Shape, func(idx []ir.Expr) ir.Expr {
		return ir.Max(ir.Min(x.At(idx...), hi), lo)
	}, "T_clip", names("ax", len(x.Shape))...))
}

// castScalar converts a scalar to dtype t, folding constants.
func castScalar(e ir.Expr, t ir.DType) ir.Expr {
	if e.DType() == t {
		return e
	}
	switch c := e.(type) {
	case *ir.IntImm:
		if t.IsFloat() {
			return ir.NewFloatImm(t, float64(c.Value))
		}
		return ir.NewIntImm(t, c.Value)
	case *ir.FloatImm:
		if t.IsFloat() {
			return ir.NewFloatImm(t, c.Value)
		}
		v := c.Value
		switch {
		case math.IsInf(v, 1) || v > math.MaxInt64:
			return ir.NewIntImm(t, math.MaxInt64)
		case math.IsInf(v, -1) || v < math.MinInt64:
			return ir.NewIntImm(t, math.MinInt64)
		}
		return ir.NewIntImm(t, int64(v))
	}
	return ir.NewCast(t, e)
}

// Where returns cond ? a : b elementwise over the broadcast shape of the
// three (stage T_where). A condition that is not boolean is compared
// with zero.
func Where(cond, a, b *te.Tensor) (*te.Tensor, error) {
	const op = "where"
	if err := checkInputs(op, cond, a, b); err != nil {
		return nil, err
	}
	if err := sameDType(op, a, b); err != nil {
		return nil, err
	}
	out, err := BroadcastShape(op, cond.Shape, a.Shape, b.Shape)
	if err != nil {
		return nil, err
	}
	return finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		c := cond.At(broadcastIndex(cond.Shape, out, idx)...)
		if !ir.IsBool(c.DType()) {
			c = ir.NE(c, ir.Const(c.DType(), 0))
		}
		return ir.NewSelect(c, a.At(broadcastIndex(a.Shape, out, idx)...), b.At(broadcastIndex(b.Shape, out, idx)...))
	}, "T_where", names("ax", len(out))...))
}
