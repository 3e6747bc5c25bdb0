package arith

import (
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

func TestConstIntBound(t *testing.T) {
	a, v := newTestAnalyzer()
	c := ir.I32
	tests := []struct {
		name   string
		e      ir.Expr
		lo, hi int64
	}{
		{"const", c(5), 5, 5},
		{"loop var", v.i, 0, 15},
		{"sum", ir.Add(ir.Mul(v.i, c(4)), v.j), 0, 63},
		{"difference", ir.Sub(v.i, v.j), -3, 15},
		{"same var cancels", ir.Sub(ir.Add(v.i, c(3)), v.i), 3, 3},
		{"unbounded int32", v.x, -1 << 31, 1<<31 - 1},
		{"int32 may wrap", ir.Add(v.x, c(1)), -1 << 31, 1<<31 - 1},
		{"unbounded int64", v.v, NegInf, PosInf},
		{"int64 loop", ir.Mul(v.w, ir.I64(3)), 0, 21},
		{"floordiv", ir.FloorDiv(v.i, c(4)), 0, 3},
		{"floormod", ir.FloorMod(v.x, c(8)), 0, 7},
		{"floormod of small", ir.FloorMod(ir.Add(v.j, c(8)), c(16)), 8, 11},
		{"truncmod", ir.Mod(v.x, c(8)), -7, 7},
		{"min", ir.Min(v.i, v.j), 0, 3},
		{"max", ir.Max(v.i, c(20)), 20, 20},
		{"product", ir.Mul(v.i, v.j), 0, 45},
		{"square", ir.Mul(v.x, v.x), -1 << 31, 1<<31 - 1},
		{"select", ir.NewSelect(ir.LT(v.x, v.y), v.i, c(-2)), -2, 15},
		{"compare", ir.LT(v.x, v.y), 0, 1},
		{"cast narrow", &ir.Cast{Type: ir.Int8, Value: ir.Mul(v.i, c(10))}, -128, 127},
		{"cast fits", &ir.Cast{Type: ir.Int8, Value: ir.Mul(v.i, c(2))}, 0, 30},
		{"symbolic range", v.k, 0, 1<<20 - 1},
		{"uint8", &ir.Cast{Type: ir.Uint8, Value: v.x}, 0, 255},
		{"ramp", ir.NewRamp(ir.Mul(v.j, c(4)), c(1), 4), 0, 15},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lo, hi := a.ConstIntBound(tc.e)
			check.Equal(t, [2]int64{lo, hi}, [2]int64{tc.lo, tc.hi}, tc.e)
		})
	}
}

func TestCanProve(t *testing.T) {
	a, v := newTestAnalyzer()
	c := ir.I32
	tests := []struct {
		name string
		cond ir.Expr
		want bool
	}{
		{"in range", ir.LT(v.i, c(16)), true},
		{"not in range", ir.LT(v.i, c(15)), false},
		{"symbolic", ir.LT(v.k, v.n), true},
		{"symbolic shifted", ir.LE(ir.Add(v.k, c(1)), v.n), true},
		{"symbolic too far", ir.LT(ir.Add(v.k, c(1)), v.n), false},
		{"split fits", ir.LT(ir.Add(ir.Mul(v.i, c(4)), v.j), c(64)), true},
		{"and", ir.And(ir.GE(v.i, c(0)), ir.LT(v.j, c(4))), true},
		{"unknown", ir.LT(v.x, v.y), false},
		{"wrap blocks", ir.LT(v.x, ir.Add(v.x, c(1))), false},
		{"int64 assumed", ir.LT(v.v, ir.Add(v.v, ir.I64(1))), true},
		{"not bool", v.x, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			check.Equal(t, a.CanProve(tc.cond), tc.want, tc.cond)
		})
	}
}

func TestCanProveEqualAndDivisible(t *testing.T) {
	a, v := newTestAnalyzer()
	c := ir.I32
	check.True(t, a.CanProveEqual(ir.Add(v.x, v.y), ir.Add(v.y, v.x)))
	check.True(t, a.CanProveEqual(ir.Mul(ir.Add(v.x, c(1)), c(2)), ir.Add(ir.Add(v.x, v.x), c(2))))
	check.True(t, a.CanProveEqual(ir.FloorDiv(ir.Add(ir.Mul(v.i, c(4)), v.j), c(4)), v.i))
	check.True(t, !a.CanProveEqual(v.x, v.y))
	check.True(t, a.CanProveDivisible(ir.Add(ir.Mul(v.x, c(8)), ir.Mul(v.y, c(4))), 4))
	check.True(t, !a.CanProveDivisible(ir.Add(ir.Mul(v.x, c(8)), v.y), 4))
	check.True(t, a.CanProveDivisible(ir.Mul(ir.Mul(v.i, c(3)), c(2)), 6))
	check.True(t, !a.CanProveDivisible(ir.Mul(v.x, c(3)), 3), "int32 x*3 may wrap to a non-multiple")
	check.True(t, a.CanProveDivisible(ir.Mul(v.i, c(3)), 3))
}

func TestBindScopes(t *testing.T) {
	a := NewAnalyzer()
	x := ir.NewVar("x", ir.Int32)
	a.Bind(x, ir.RangeFromExtent(ir.I32(4)))
	restore := a.scope(x)
	a.BindValue(x, ir.I32(2))
	check.Equal(t, a.Simplify(ir.Add(x, ir.I32(1))).String(), "3")
	restore()
	lo, hi := a.ConstIntBound(x)
	check.Equal(t, [2]int64{lo, hi}, [2]int64{0, 3})
	a.Unbind(x)
	lo, hi = a.ConstIntBound(x)
	check.Equal(t, [2]int64{lo, hi}, [2]int64{-1 << 31, 1<<31 - 1})
}
