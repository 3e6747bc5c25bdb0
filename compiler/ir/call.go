package ir

import (
	"fmt"
	"slices"
)

// OpCallExtern is the Op of a Call to an external function: Args[0] is a
// StringImm naming it, the rest are its arguments.
const OpCallExtern = "call_extern"

// OpIfThenElse is the Op of the lazy conditional call if_then_else(cond, t, f):
// unlike Select only the taken branch is evaluated.
const OpIfThenElse = "if_then_else"

// OpRet is the Op of TVM's tir.ret(value): the function stops and returns
// value, a scalar of the function's RetType (TVMScript's `return value`).
// It appears only as the value of an Evaluate, outside loops and blocks.
const OpRet = "tir.ret"

// Ret returns the statement `return value`.
func Ret(value Expr) Stmt {
	return &Evaluate{Value: &Call{Type: value.DType(), Op: OpRet, Args: []Expr{value}}}
}

// RetValue returns the value a statement `return value` returns, or nil
// when s is not one.
func RetValue(s Stmt) Expr {
	if e, ok := s.(*Evaluate); ok {
		if c, ok := e.Value.(*Call); ok && c.Op == OpRet && len(c.Args) == 1 {
			return c.Args[0]
		}
	}
	return nil
}

// OpWarpShuffleDown is the Op of TVM's tvm_warp_shuffle_down(mask, value,
// delta, width, warp_size): the value of the thread delta lanes above the
// caller within its group of width lanes of a warp, or the caller's own
// value where that lane is outside the group (CUDA's __shfl_down_sync).
// Every thread of the warp must reach it; the result has value's type.
const OpWarpShuffleDown = "tvm_warp_shuffle_down"

// WarpShuffleDown returns tvm_warp_shuffle_down over all 32 lanes of a
// warp (full mask, width 32).
func WarpShuffleDown(value Expr, delta int64) Expr {
	return &Call{Type: value.DType(), Op: OpWarpShuffleDown, Args: []Expr{
		NewIntImm(Uint32, 0xffffffff), value, NewIntImm(Int32, delta), NewIntImm(Int32, 32), NewIntImm(Int32, 32)}}
}

// OpPtxMma is the Op of TVM's ptx_mma(shape, A_layout, B_layout, A_dtype,
// B_dtype, C_dtype, a, a_index, b, b_index, c, c_index, saturate): one
// warp-wide matrix multiply-accumulate on the tensor cores (PTX's
// mma.sync), D = A·B + C with D stored over C. a, b and c are the data
// variables of the calling thread's "local" fragment buffers and the
// indices are element offsets into them: each of the 32 threads of the
// warp holds its part of A, B and C as PTX lays them out for the shape.
// Before flatten_buffers an operand may instead be a vector load of the
// thread's whole fragment (see PtxMmaFragments), its index argument an
// element offset from the load's first element: compaction rewrites such a
// load like any other, and flattening makes it (data, offset).
// kiln takes shape "m16n8k16", layouts "row" and "col", A_dtype = B_dtype
// "fp16" or "bf16", C_dtype "fp32" and saturate false (see PtxMma). Every
// thread of the warp must reach it; it returns nothing.
const OpPtxMma = "ptx_mma"

// PtxMma returns ptx_mma m16n8k16 (A row-major, B column-major) of
// operands of dtype ab ("fp16" or "bf16") accumulating in float32: 8
// elements of a from aIndex, 4 of b from bIndex and 4 of c from cIndex
// per thread.
func PtxMma(ab string, a *Var, aIndex Expr, b *Var, bIndex Expr, c *Var, cIndex Expr) *Call {
	return &Call{Type: Void, Op: OpPtxMma, Args: []Expr{Str("m16n8k16"), Str("row"), Str("col"), Str(ab), Str(ab), Str("fp32"),
		a, aIndex, b, bIndex, c, cIndex, NewIntImm(Bool, 0)}}
}

// PtxMmaFragments is PtxMma over fragments given as vector loads: a loads
// the thread's 8 elements of A, b its 4 of B and c its 4 of C, each with
// its last index a Ramp of stride 1 over them (A_frag[fm, 0, T.Ramp(0, 1,
// 8)]). It panics when a load is not of that form (internal misuse).
func PtxMmaFragments(ab string, a, b, c *BufferLoad) *Call {
	for i, l := range []*BufferLoad{a, b, c} {
		if _, ok := PtxMmaFragment(l, []int{8, 4, 4}[i]); !ok {
			panic(fmt.Sprintf("ir: ptx_mma fragment %s is not a load of %d consecutive elements", l, []int{8, 4, 4}[i]))
		}
	}
	zero := NewIntImm(Int32, 0)
	return &Call{Type: Void, Op: OpPtxMma, Args: []Expr{Str("m16n8k16"), Str("row"), Str("col"), Str(ab), Str(ab), Str("fp32"),
		a, zero, b, zero, c, zero, NewIntImm(Bool, 0)}}
}

// PtxMmaFragment returns the indices of the first element of a ptx_mma
// operand given as a vector load of n consecutive elements (the last
// index a Ramp of stride 1 and n lanes), ok false when l is not one.
func PtxMmaFragment(l *BufferLoad, n int) ([]Expr, bool) {
	if l == nil || len(l.Indices) == 0 {
		return nil, false
	}
	last := len(l.Indices) - 1
	r, ok := l.Indices[last].(*Ramp)
	if !ok || r.Lanes != n {
		return nil, false
	}
	if s, ok := IsConstInt(r.Stride); !ok || s != 1 {
		return nil, false
	}
	for _, ix := range l.Indices[:last] {
		if ix.DType().Lanes > 1 {
			return nil, false
		}
	}
	idx := slices.Clone(l.Indices)
	idx[last] = r.Base
	return idx, true
}

// Intrinsic describes a built-in math function callable with Call.
type Intrinsic struct {
	// Name is the Op string ("exp", "pow"…), also the TVMScript name T.<Name>.
	Name string
	// Arity is the number of arguments.
	Arity int
	// FloatOnly reports that the arguments must be floats.
	FloatOnly bool
}

// Intrinsics lists the built-in functions by name.
var Intrinsics = map[string]Intrinsic{}

func init() {
	for _, n := range []string{"exp", "exp2", "exp10", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
		"tanh", "sigmoid", "erf", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
		"floor", "ceil", "round", "trunc", "nearbyint"} {
		Intrinsics[n] = Intrinsic{Name: n, Arity: 1, FloatOnly: true}
	}
	Intrinsics["fabs"] = Intrinsic{Name: "fabs", Arity: 1}
	Intrinsics["abs"] = Intrinsic{Name: "abs", Arity: 1}
	for _, n := range []string{"pow", "atan2", "fmod", "hypot", "copysign"} {
		Intrinsics[n] = Intrinsic{Name: n, Arity: 2, FloatOnly: true}
	}
}

// IntrinsicNames returns the names of Intrinsics, sorted.
func IntrinsicNames() []string {
	names := make([]string, 0, len(Intrinsics))
	for n := range Intrinsics {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// CallIntrin calls intrinsic op on args; the result has the (promoted) type
// of the arguments. It panics on an unknown op or a wrong argument count
// (internal misuse); the parser checks both before calling it.
func CallIntrin(op string, args ...Expr) Expr {
	in, ok := Intrinsics[op]
	if !ok {
		panic(fmt.Sprintf("ir: unknown intrinsic %q", op))
	}
	if len(args) != in.Arity {
		panic(fmt.Sprintf("ir: intrinsic %q takes %d arguments, got %d", op, in.Arity, len(args)))
	}
	for _, a := range args {
		if a == nil {
			panic(fmt.Sprintf("ir: intrinsic %q with a nil argument", op))
		}
	}
	if len(args) == 2 {
		args[0], args[1] = Promote(args[0], args[1])
	}
	return &Call{Type: args[0].DType(), Op: op, Args: args}
}

// Exp returns exp(x).
func Exp(x Expr) Expr { return CallIntrin("exp", x) }

// Log returns log(x).
func Log(x Expr) Expr { return CallIntrin("log", x) }

// Sqrt returns sqrt(x).
func Sqrt(x Expr) Expr { return CallIntrin("sqrt", x) }

// Rsqrt returns 1/sqrt(x).
func Rsqrt(x Expr) Expr { return CallIntrin("rsqrt", x) }

// Tanh returns tanh(x).
func Tanh(x Expr) Expr { return CallIntrin("tanh", x) }

// Sigmoid returns 1/(1+exp(-x)).
func Sigmoid(x Expr) Expr { return CallIntrin("sigmoid", x) }

// Erf returns erf(x).
func Erf(x Expr) Expr { return CallIntrin("erf", x) }

// Pow returns x**y.
func Pow(x, y Expr) Expr { return CallIntrin("pow", x, y) }

// Fabs returns |x|.
func Fabs(x Expr) Expr { return CallIntrin("fabs", x) }

// Floor returns floor(x).
func Floor(x Expr) Expr { return CallIntrin("floor", x) }

// Ceil returns ceil(x).
func Ceil(x Expr) Expr { return CallIntrin("ceil", x) }

// Round returns x rounded to the nearest integer, halves to even (C nearbyint).
func Round(x Expr) Expr { return CallIntrin("round", x) }

// NewCallExtern calls the external function name, returning type t.
func NewCallExtern(t DType, name string, args ...Expr) *Call {
	return &Call{Type: t, Op: OpCallExtern, Args: append([]Expr{Str(name)}, args...)}
}

// NewIfThenElse returns the lazy conditional if_then_else(cond, t, f).
func NewIfThenElse(cond, t, f Expr) *Call {
	t, f = Promote(t, f)
	return &Call{Type: t.DType(), Op: OpIfThenElse, Args: []Expr{toBool(cond), t, f}}
}
