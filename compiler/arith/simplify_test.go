package arith

import (
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

// vars used by the table tests: x, y, z unbounded int32; i in [0, 16),
// j in [0, 4), k in [0, n); n >= 1 (int32); w, v int64 with w in [0, 8).
type testVars struct {
	x, y, z, i, j, k, n, w, v *ir.Var
	f                         *ir.Var
}

func newTestAnalyzer() (*Analyzer, testVars) {
	tv := testVars{
		x: ir.NewVar("x", ir.Int32), y: ir.NewVar("y", ir.Int32), z: ir.NewVar("z", ir.Int32),
		i: ir.NewVar("i", ir.Int32), j: ir.NewVar("j", ir.Int32), k: ir.NewVar("k", ir.Int32),
		n: ir.NewVar("n", ir.Int32), w: ir.NewVar("w", ir.Int64), v: ir.NewVar("v", ir.Int64),
		f: ir.NewVar("f", ir.Float32),
	}
	a := NewAnalyzer()
	a.Bind(tv.i, ir.RangeFromExtent(ir.I32(16)))
	a.Bind(tv.j, ir.RangeFromExtent(ir.I32(4)))
	a.BindBound(tv.n, 1, 1<<20)
	a.Bind(tv.k, ir.RangeFromExtent(tv.n))
	a.Bind(tv.w, ir.RangeFromExtent(ir.I64(8)))
	return a, tv
}

func TestSimplify(t *testing.T) {
	a, v := newTestAnalyzer()
	x, y, z, i, j, k, n, w, f := v.x, v.y, v.z, v.i, v.j, v.k, v.n, v.w, v.f
	c := ir.I32
	tests := []struct {
		name string
		in   ir.Expr
		want string
	}{
		{"fold", ir.Add(c(2), ir.Mul(c(3), c(4))), "14"},
		{"fold wraps int32", ir.Mul(c(1<<30), c(4)), "0"},
		{"fold int8", ir.NewBinary(ir.OpAdd, ir.NewIntImm(ir.Int8, 100), ir.NewIntImm(ir.Int8, 100)), "T.int8(-56)"},
		{"x+0", ir.Add(x, c(0)), "x"},
		{"x*1", ir.Mul(x, c(1)), "x"},
		{"x*0", ir.Mul(x, c(0)), "0"},
		{"x-x", ir.Sub(x, x), "0"},
		{"float x*0 kept", ir.Mul(f, ir.F32(0)), "f * T.float32(0.0)"},
		{"float x*1", ir.Mul(f, ir.F32(1)), "f"},
		{"float fold rounds", ir.Add(ir.F32(0.1), ir.F32(0.2)), "T.float32(0.30000001192092896)"},
		{"order sum", ir.Add(ir.Add(y, c(3)), ir.Add(x, c(4))), "x + y + 7"},
		{"combine terms", ir.Add(ir.Mul(x, c(2)), ir.Sub(x, y)), "x * 3 - y"},
		{"(x*c1)*c2", ir.Mul(ir.Mul(x, c(3)), c(4)), "x * 12"},
		{"(x+c1)+c2", ir.Add(ir.Add(x, c(3)), c(4)), "x + 7"},
		{"cancel", ir.Sub(ir.Add(x, y), x), "y"},
		{"const minus var", ir.Sub(c(3), x), "3 - x"},
		{"neg", ir.Sub(c(0), x), "x * -1"},
		{"distribute", ir.Mul(ir.Add(x, c(2)), c(3)), "x * 3 + 6"},
		{"product order", ir.Mul(y, x), "x * y"},
		{"floordiv split", ir.FloorDiv(ir.Add(ir.Mul(i, c(4)), j), c(4)), "i"},
		{"floormod split", ir.FloorMod(ir.Add(ir.Mul(i, c(4)), j), c(4)), "j"},
		{"floordiv partial", ir.FloorDiv(ir.Add(ir.Mul(i, c(8)), ir.Add(j, c(5))), c(4)), "i * 2 + (j + 1) // 4 + 1"},
		{"floormod partial", ir.FloorMod(ir.Add(ir.Mul(i, c(8)), ir.Mul(j, c(3))), c(4)), "j * 3 % 4"},
		{"floormod unbounded kept", ir.FloorMod(ir.Add(ir.Mul(i, c(8)), ir.Mul(x, c(3))), c(4)), "(i * 8 + x * 3) % 4"},
		{"floordiv unbounded kept", ir.FloorDiv(ir.Add(ir.Mul(x, c(4)), y), c(4)), "(x * 4 + y) // 4"},
		{"floordiv int64 index", ir.FloorDiv(ir.Add(ir.Mul(v.v, ir.I64(4)), w), ir.I64(4)), "v + w // T.int64(4)"},
		{"floormod of small", ir.FloorMod(j, c(4)), "j"},
		{"floormod shifted", ir.FloorMod(ir.Add(j, c(4)), c(4)), "j"},
		{"floordiv of small", ir.FloorDiv(j, c(4)), "0"},
		{"floordiv by 1", ir.FloorDiv(x, c(1)), "x"},
		{"floormod by 1", ir.FloorMod(x, c(1)), "0"},
		{"nested floordiv", ir.FloorDiv(ir.FloorDiv(i, c(2)), c(4)), "i // 8"},
		{"nested floormod", ir.FloorMod(ir.FloorMod(x, c(8)), c(4)), "x % 4"},
		{"div mod fuse", ir.Add(ir.Mul(ir.FloorDiv(x, c(4)), c(4)), ir.FloorMod(x, c(4))), "x"},
		{"truncdiv nonneg", ir.Div(ir.Add(ir.Mul(i, c(4)), j), c(4)), "i"},
		{"truncdiv maybe negative kept", ir.Div(x, c(4)), "T.truncdiv(x, 4)"},
		{"min provable", ir.Min(i, c(20)), "i"},
		{"max provable", ir.Max(i, c(20)), "20"},
		{"min symbolic", ir.Min(v.v, ir.Add(v.v, ir.I64(1))), "v"},
		{"min int32 may wrap kept", ir.Min(x, ir.Add(x, c(1))), "T.min(x, x + 1)"},
		{"max symbolic", ir.Max(ir.Sub(ir.Add(i, j), c(1)), ir.Add(j, i)), "i + j"},
		{"min unknown", ir.Min(x, y), "T.min(x, y)"},
		{"min nested consts", ir.Min(ir.Min(x, c(3)), c(5)), "T.min(x, 3)"},
		{"lt bound", ir.LT(i, c(16)), "T.bool(True)"},
		{"lt bound false", ir.LT(i, c(0)), "T.bool(False)"},
		{"lt symbolic", ir.LT(k, n), "T.bool(True)"},
		{"ge symbolic", ir.GE(k, n), "T.bool(False)"},
		{"le fused index", ir.LT(ir.Add(ir.Mul(i, c(4)), j), c(64)), "T.bool(True)"},
		{"lt normalized", ir.LT(ir.Add(i, c(2)), c(5)), "i < 3"},
		{"lt unknown int32 wrap kept", ir.LT(ir.Add(x, c(1)), x), "x + 1 < x"},
		{"eq ring", ir.EQ(ir.Add(x, c(1)), ir.Add(c(1), x)), "T.bool(True)"},
		{"ne ring", ir.NE(ir.Add(x, c(1)), x), "T.bool(True)"},
		{"eq bound", ir.EQ(j, c(9)), "T.bool(False)"},
		{"and const", ir.And(ir.LT(x, y), ir.BoolImm(true)), "x < y"},
		{"or const", ir.Or(ir.LT(x, y), ir.BoolImm(true)), "T.bool(True)"},
		{"and decided", ir.And(ir.LT(i, c(16)), ir.GE(j, c(0))), "T.bool(True)"},
		{"not compare", ir.LogicalNot(ir.LT(x, y)), "x >= y"},
		{"not not", ir.LogicalNot(ir.LogicalNot(ir.LT(f, ir.F32(1)))), "f < T.float32(1.0)"},
		{"select const", ir.NewSelect(ir.LT(i, c(16)), x, y), "x"},
		{"select same", ir.NewSelect(ir.LT(x, y), z, z), "z"},
		{"if_then_else const", ir.NewIfThenElse(ir.GE(j, c(4)), x, y), "y"},
		{"cast const", ir.NewCast(ir.Float32, ir.Add(c(1), c(2))), "T.float32(3.0)"},
		{"cast wrap", &ir.Cast{Type: ir.Int8, Value: c(300)}, "T.int8(44)"},
		{"let const", ir.NewLet(ir.NewVar("t", ir.Int32), c(3), ir.Add(x, c(1))), "x + 1"},
		{"ramp stride 0", ir.NewRamp(x, c(0), 4), "T.Broadcast(x, 4)"},
		{"ramp plus broadcast", ir.Add(ir.NewRamp(x, c(1), 4), ir.NewBroadcast(c(2), 4)), "T.Ramp(x + 2, 1, 4)"},
		{"ramp times broadcast", ir.Mul(ir.NewRamp(x, c(1), 4), ir.NewBroadcast(c(2), 4)), "T.Ramp(x * 2, 2, 4)"},
		{"broadcast op", ir.Add(ir.NewBroadcast(x, 4), ir.NewBroadcast(c(0), 4)), "T.Broadcast(x, 4)"},
		{"ramp floordiv", ir.FloorDiv(ir.NewRamp(ir.Mul(i, c(4)), c(1), 4), ir.NewBroadcast(c(4), 4)), "T.Broadcast(i, 4)"},
		{"ramp floormod", ir.FloorMod(ir.NewRamp(ir.Mul(i, c(4)), c(1), 4), ir.NewBroadcast(c(4), 4)), "T.Ramp(0, 1, 4)"},
		{"div by zero kept", ir.Div(x, c(0)), "T.truncdiv(x, 0)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := a.Simplify(tc.in)
			check.Equal(t, script.Print(got), tc.want, script.Print(tc.in))
		})
	}
}
