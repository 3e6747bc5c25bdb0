package interp

import (
	"errors"
	"fmt"
	"math"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/ndarray"
)

// ErrDivisionByZero reports an integer division or modulo by zero.
var ErrDivisionByZero = errors.New("integer division by zero")

// castLane converts one lane from scalar type src to scalar type dst with
// C semantics (see the package doc).
func castLane(dst, src ir.DType, bits uint64) uint64 {
	dst, src = dst.Scalar(), src.Scalar()
	if src.IsFloat() {
		f := math.Float64frombits(bits)
		switch {
		case dst.IsFloat():
			return math.Float64bits(roundFloat(dst, f))
		case ir.IsBool(dst):
			if f != 0 {
				return 1
			}
			return 0
		}
		return uint64(wrap(dst, floatToInt(dst, f)))
	}
	// src is an integer or a bool.
	if dst.IsFloat() {
		var f float64
		unsigned := src.Code == ndarray.UInt
		switch {
		case dst.Bits == 64:
			if unsigned {
				f = float64(bits)
			} else {
				f = float64(int64(bits))
			}
		default: // float32 first, so 64-bit integers round once
			if unsigned {
				f = float64(float32(bits))
			} else {
				f = float64(float32(int64(bits)))
			}
			f = roundFloat(dst, f)
		}
		return math.Float64bits(f)
	}
	return uint64(wrap(dst, int64(bits)))
}

// floatToInt truncates f toward zero for a cast to integer type dst: NaN
// gives 0 and values beyond the 64-bit range saturate (C leaves both
// undefined).
func floatToInt(dst ir.DType, f float64) int64 {
	switch {
	case f != f:
		return 0
	case dst.Code == ndarray.UInt && f >= 0:
		if f >= 1<<64 {
			return -1 // all ones
		}
		return int64(uint64(f))
	case f >= 1<<63:
		return math.MaxInt64
	case f <= -(1 << 63):
		return math.MinInt64
	}
	return int64(f)
}

// binaryLane applies op to one lane of scalar type t (the operands' type).
// The result has type t for arithmetic and bool for comparisons and logic.
func binaryLane(op ir.BinaryOp, t ir.DType, a, b uint64) (uint64, error) {
	switch {
	case op.IsLogical():
		x, y := a != 0, b != 0
		if t.IsFloat() {
			x, y = math.Float64frombits(a) != 0, math.Float64frombits(b) != 0
		}
		if op == ir.OpAnd {
			return b2u(x && y), nil
		}
		return b2u(x || y), nil
	case t.IsFloat():
		return floatLane(op, t, math.Float64frombits(a), math.Float64frombits(b))
	case t.Code == ndarray.UInt:
		return uintLane(op, t, a, b)
	}
	return intLane(op, t, int64(a), int64(b))
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// compareLane evaluates a comparison operator (1 for true), reporting
// false for any other operator.
func compareLane[T int64 | uint64 | float64](op ir.BinaryOp, a, b T) (uint64, bool) {
	switch op {
	case ir.OpEQ:
		return b2u(a == b), true
	case ir.OpNE:
		return b2u(a != b), true
	case ir.OpLT:
		return b2u(a < b), true
	case ir.OpLE:
		return b2u(a <= b), true
	case ir.OpGT:
		return b2u(a > b), true
	case ir.OpGE:
		return b2u(a >= b), true
	}
	return 0, false
}

func intLane(op ir.BinaryOp, t ir.DType, a, b int64) (uint64, error) {
	var r int64
	if r, ok := compareLane(op, a, b); ok {
		return r, nil
	}
	switch op {
	case ir.OpAdd:
		r = a + b
	case ir.OpSub:
		r = a - b
	case ir.OpMul:
		r = a * b
	case ir.OpDiv, ir.OpMod, ir.OpFloorDiv, ir.OpFloorMod:
		if b == 0 {
			return 0, ErrDivisionByZero
		}
		switch op {
		case ir.OpDiv:
			r = a / b
		case ir.OpMod:
			r = a % b
		case ir.OpFloorDiv:
			r = FloorDiv(a, b)
		default:
			r = FloorMod(a, b)
		}
	case ir.OpMin:
		r = min(a, b)
	case ir.OpMax:
		r = max(a, b)
	default:
		return 0, fmt.Errorf("unknown binary operator %s", op)
	}
	return uint64(wrap(t, r)), nil
}

func uintLane(op ir.BinaryOp, t ir.DType, a, b uint64) (uint64, error) {
	var r uint64
	if r, ok := compareLane(op, a, b); ok {
		return r, nil
	}
	switch op {
	case ir.OpAdd:
		r = a + b
	case ir.OpSub:
		r = a - b
	case ir.OpMul:
		r = a * b
	case ir.OpDiv, ir.OpMod, ir.OpFloorDiv, ir.OpFloorMod:
		if b == 0 {
			return 0, ErrDivisionByZero
		}
		if op == ir.OpDiv || op == ir.OpFloorDiv {
			r = a / b
		} else {
			r = a % b
		}
	case ir.OpMin:
		r = min(a, b)
	case ir.OpMax:
		r = max(a, b)
	default:
		return 0, fmt.Errorf("unknown binary operator %s", op)
	}
	return uint64(wrap(t, int64(r))), nil
}

func floatLane(op ir.BinaryOp, t ir.DType, a, b float64) (uint64, error) {
	var r float64
	if r, ok := compareLane(op, a, b); ok {
		return r, nil
	}
	switch op {
	case ir.OpAdd:
		r = a + b
	case ir.OpSub:
		r = a - b
	case ir.OpMul:
		r = a * b
	case ir.OpDiv:
		r = a / b
	case ir.OpMod:
		r = math.Mod(a, b)
	case ir.OpFloorDiv:
		r = math.Floor(a / b)
	case ir.OpFloorMod:
		r = a - math.Floor(a/b)*b
	case ir.OpMin:
		r = b
		if a < b {
			r = a
		}
	case ir.OpMax:
		r = b
		if a > b {
			r = a
		}
	default:
		return 0, fmt.Errorf("unknown binary operator %s", op)
	}
	// Operands are exact in t; computing in float64 and rounding once gives
	// the correctly rounded t result for + - * / (and float32 for 16-bit
	// types, whose results are then rounded to 16 bits).
	return math.Float64bits(roundFloat(t, r)), nil
}

// FloorDiv is a // b with Python semantics (rounding toward negative
// infinity). b must not be 0.
func FloorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// FloorMod is a % b with Python semantics (the sign of b). b must not be 0.
func FloorMod(a, b int64) int64 {
	m := a % b
	if m != 0 && ((m < 0) != (b < 0)) {
		m += b
	}
	return m
}

// intrinsicLane applies the intrinsic op to one lane of each argument, of
// scalar type t.
func intrinsicLane(op string, t ir.DType, args []uint64) (uint64, error) {
	if !t.IsFloat() {
		switch op {
		case "abs", "fabs":
			v := int64(args[0])
			if t.Code == ndarray.Int && v < 0 {
				v = -v
			}
			return uint64(wrap(t, v)), nil
		}
		return 0, fmt.Errorf("intrinsic %q on %s: not defined on integers", op, t)
	}
	x := math.Float64frombits(args[0])
	var y float64
	if len(args) > 1 {
		y = math.Float64frombits(args[1])
	}
	var r float64
	switch op {
	case "exp":
		r = math.Exp(x)
	case "exp2":
		r = math.Exp2(x)
	case "exp10":
		r = math.Pow(10, x)
	case "log":
		r = math.Log(x)
	case "log2":
		r = math.Log2(x)
	case "log10":
		r = math.Log10(x)
	case "log1p":
		r = math.Log1p(x)
	case "sqrt":
		r = math.Sqrt(x)
	case "rsqrt":
		r = 1 / math.Sqrt(x)
	case "tanh":
		r = math.Tanh(x)
	case "sigmoid":
		r = 1 / (1 + math.Exp(-x))
	case "erf":
		r = math.Erf(x)
	case "sin":
		r = math.Sin(x)
	case "cos":
		r = math.Cos(x)
	case "tan":
		r = math.Tan(x)
	case "asin":
		r = math.Asin(x)
	case "acos":
		r = math.Acos(x)
	case "atan":
		r = math.Atan(x)
	case "sinh":
		r = math.Sinh(x)
	case "cosh":
		r = math.Cosh(x)
	case "asinh":
		r = math.Asinh(x)
	case "acosh":
		r = math.Acosh(x)
	case "atanh":
		r = math.Atanh(x)
	case "floor":
		r = math.Floor(x)
	case "ceil":
		r = math.Ceil(x)
	case "round", "nearbyint":
		r = math.RoundToEven(x)
	case "trunc":
		r = math.Trunc(x)
	case "fabs", "abs":
		r = math.Abs(x)
	case "pow":
		r = math.Pow(x, y)
	case "atan2":
		r = math.Atan2(x, y)
	case "fmod":
		r = math.Mod(x, y)
	case "hypot":
		r = math.Hypot(x, y)
	case "copysign":
		r = math.Copysign(x, y)
	default:
		return 0, fmt.Errorf("intrinsic %q is not supported by the interpreter", op)
	}
	return math.Float64bits(roundFloat(t, r)), nil
}
