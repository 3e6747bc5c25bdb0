// Package arith is kiln's integer arithmetic analysis of TensorIR: an
// Analyzer that knows the ranges of variables (loop variables, block
// iteration variables, symbolic shapes) and uses them to bound integer
// expressions (ConstIntBound), to prove facts (CanProve, CanProveEqual,
// CanProveDivisible) and to simplify expressions and statements
// (Simplify, SimplifyStmt).
//
// # Soundness under wrap-around
//
// TensorIR integers wrap around at their dtype's width, and so does the
// interpreter (compiler/interp) that the fuzz test checks the simplifier
// against. The analyzer keeps two kinds of rewrites apart:
//
//   - Ring identities (reassociating and combining sums, x*0, x*1, x-x,
//     (x*c1)*c2, (x+c1)+c2, constant folding with the dtype's wrap-around,
//     floordiv(x, c)*c + floormod(x, c) = x) hold in arithmetic modulo 2^n
//     and are always applied.
//   - Rewrites that depend on values (division and modulo splitting, min and
//     max ordering, comparisons decided by bounds) are applied only when the
//     interval analysis proves that the expressions involved do not wrap.
//     Bounds are computed on mathematical integers and any bound that leaves
//     the dtype's range is widened to the whole range, so ConstIntBound is
//     sound for wrapped values.
//
// One exception follows TVM: a variable of type int64 without a known
// range is taken to stay far from the int64 limits (index arithmetic does
// not overflow), so its bounds are infinite rather than wrapped. Bounds
// computed from finite ranges that overflow int64 are still widened.
// uint64 expressions get no value-dependent rewrites.
//
// Floating-point expressions are folded only when every operand is a
// constant (with the interpreter's rounding), plus x*1, x/1, x+0 and x-0
// (which may turn -0.0 into +0.0); x*0 is never rewritten for floats.
//
// This package is pure IR code: it imports compiler/ir and compiler/interp
// (for constant folding) and must not import passes, code generators,
// devices or the text format (its tests use compiler/script).
package arith
