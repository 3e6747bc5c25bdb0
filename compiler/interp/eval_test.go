package interp

import (
	"math"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

func TestEval(t *testing.T) {
	x := ir.NewVar("x", ir.Int32)
	y := ir.NewVar("y", ir.Int32)
	f := ir.NewVar("f", ir.Float32)
	u8 := ir.NewVar("u", ir.Uint8)
	env := Vars{x: Int(ir.Int32, 7), y: Int(ir.Int32, -3), f: Float(ir.Float32, 2.5), u8: Int(ir.Uint8, 250)}
	i8 := ir.Int8
	tests := []struct {
		name string
		e    ir.Expr
		want string
	}{
		{"add", ir.Add(x, y), "int32(4)"},
		{"sub", ir.Sub(y, x), "int32(-10)"},
		{"mul", ir.Mul(x, y), "int32(-21)"},
		{"div truncates", ir.Div(x, y), "int32(-2)"},
		{"mod truncates", ir.Mod(x, y), "int32(1)"},
		{"floordiv", ir.FloorDiv(x, y), "int32(-3)"},
		{"floormod", ir.FloorMod(x, y), "int32(-2)"},
		{"floordiv neg dividend", ir.FloorDiv(ir.I32(-7), ir.I32(2)), "int32(-4)"},
		{"floormod neg dividend", ir.FloorMod(ir.I32(-7), ir.I32(2)), "int32(1)"},
		{"min", ir.Min(x, y), "int32(-3)"},
		{"max", ir.Max(x, y), "int32(7)"},
		{"lt", ir.LT(y, x), "bool(true)"},
		{"ge", ir.GE(y, x), "bool(false)"},
		{"and or not", ir.Or(ir.And(ir.LT(x, y), ir.BoolImm(true)), ir.LogicalNot(ir.EQ(x, y))), "bool(true)"},
		{"int32 wraps", ir.Mul(ir.I32(math.MaxInt32), ir.I32(2)), "int32(-2)"},
		{"int8 wraps", ir.NewBinary(ir.OpAdd, ir.NewIntImm(i8, 127), ir.NewIntImm(i8, 1)), "int8(-128)"},
		{"uint8 wraps", ir.NewBinary(ir.OpAdd, u8, ir.NewIntImm(ir.Uint8, 10)), "uint8(4)"},
		{"uint8 compare unsigned", ir.NewBinary(ir.OpGT, u8, ir.NewIntImm(ir.Uint8, 3)), "bool(true)"},
		{"uint64 div", ir.NewBinary(ir.OpDiv, ir.NewIntImm(ir.Uint64, -1), ir.NewIntImm(ir.Uint64, 2)), "uint64(9223372036854775807)"},
		{"float32 rounds", ir.Add(ir.F32(0.1), ir.F32(0.2)), "float32(0.30000001192092896)"},
		{"float64", ir.Add(ir.F64(0.1), ir.F64(0.2)), "float64(0.30000000000000004)"},
		{"float div by zero", ir.Div(f, ir.F32(0)), "float32(+Inf)"},
		{"float floordiv", ir.FloorDiv(ir.F32(-7), ir.F32(2)), "float32(-4)"},
		{"float floormod", ir.FloorMod(ir.F32(-7), ir.F32(2)), "float32(1)"},
		{"float max", ir.Max(f, ir.F32(0)), "float32(2.5)"},
		{"cast float to int truncates", ir.NewCast(ir.Int32, ir.Mul(f, ir.F32(-1))), "int32(-2)"},
		{"cast int to int8 wraps", ir.NewCast(i8, ir.I32(300)), "int8(44)"},
		{"cast var to int8 wraps", &ir.Cast{Type: i8, Value: ir.Mul(x, ir.I32(40))}, "int8(24)"},
		{"cast to uint8", &ir.Cast{Type: ir.Uint8, Value: y}, "uint8(253)"},
		{"cast to bool", &ir.Cast{Type: ir.Bool, Value: f}, "bool(true)"},
		{"cast to float16", &ir.Cast{Type: ir.Float16, Value: ir.F32(0.1)}, "float16(0.0999755859375)"},
		{"cast to bfloat16", &ir.Cast{Type: ir.DType{Code: 4, Bits: 16, Lanes: 1}, Value: ir.F32(0.1)}, "bfloat16(0.10009765625)"},
		{"float16 add", ir.NewBinary(ir.OpAdd, ir.NewFloatImm(ir.Float16, 2048), ir.NewFloatImm(ir.Float16, 1)), "float16(2048)"},
		{"select", ir.NewSelect(ir.LT(x, y), x, y), "int32(-3)"},
		{"if_then_else is lazy", ir.NewIfThenElse(ir.NE(y, ir.I32(0)), ir.Div(x, y), ir.Div(x, ir.I32(0))), "int32(-2)"},
		{"let", ir.NewLet(ir.NewVar("z", ir.Int32), ir.I32(5), ir.I32(1)), "int32(1)"},
		{"ramp", ir.NewRamp(x, ir.I32(2), 4), "int32x4[7, 9, 11, 13]"},
		{"broadcast add", ir.Add(ir.NewRamp(ir.I32(0), ir.I32(1), 3), ir.NewBroadcast(x, 3)), "int32x3[7, 8, 9]"},
		{"vector compare", ir.LT(ir.NewRamp(ir.I32(0), ir.I32(1), 3), ir.NewBroadcast(ir.I32(1), 3)), "boolx3[true, false, false]"},
		{"exp", ir.Exp(ir.F64(1)), "float64(2.718281828459045)"},
		{"sqrt float32", ir.Sqrt(ir.F32(2)), "float32(1.4142135381698608)"},
		{"rsqrt", ir.Rsqrt(ir.F64(4)), "float64(0.5)"},
		{"sigmoid", ir.Sigmoid(ir.F64(0)), "float64(0.5)"},
		{"round half even", ir.Round(ir.F32(2.5)), "float32(2)"},
		{"round half even up", ir.Round(ir.F32(3.5)), "float32(4)"},
		{"floor ceil", ir.Add(ir.Floor(ir.F32(-1.5)), ir.Ceil(ir.F32(1.2))), "float32(0)"},
		{"pow", ir.Pow(ir.F64(2), ir.F64(10)), "float64(1024)"},
		{"fabs", ir.Fabs(ir.F32(-3)), "float32(3)"},
		{"erf", ir.Erf(ir.F64(0)), "float64(0)"},
		{"tanh", ir.Tanh(ir.F64(0)), "float64(0)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Eval(tc.e, env)
			check.NoError(t, err, tc.e)
			check.Equal(t, v.String(), tc.want, tc.e)
		})
	}
}

func TestEvalErrors(t *testing.T) {
	x := ir.NewVar("x", ir.Int32)
	b := ir.NewBuffer("A", ir.Float32, []ir.Expr{ir.I32(4)}, "")
	tests := []struct {
		name string
		e    ir.Expr
		want string
	}{
		{"unbound", ir.Add(x, ir.I32(1)), `unbound variable "x"`},
		{"div by zero", ir.Div(ir.I32(1), ir.I32(0)), "division by zero"},
		{"floormod by zero", ir.FloorMod(ir.I64(1), ir.I64(0)), "division by zero"},
		{"select evaluates both", ir.NewSelect(ir.BoolImm(true), ir.I32(1), ir.Div(ir.I32(1), ir.I32(0))), "division by zero"},
		{"no buffers", b.Load(ir.I32(0)), `load from "A"`},
		{"extern", ir.NewCallExtern(ir.Int32, "f"), "external calls"},
		{"mixed dtypes", ir.NewBinary(ir.OpAdd, ir.I32(1), ir.I64(1)), "dtypes differ"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Eval(tc.e, Vars{})
			check.Error(t, err, tc.want)
		})
	}
	_, err := Eval(ir.Div(ir.I32(1), ir.I32(0)), Vars{})
	check.ErrorIs(t, err, ErrDivisionByZero)
}

func TestFloorDivMod(t *testing.T) {
	for a := int64(-9); a <= 9; a++ {
		for b := int64(-4); b <= 4; b++ {
			if b == 0 {
				continue
			}
			want := int64(math.Floor(float64(a) / float64(b)))
			check.Equal(t, FloorDiv(a, b), want, a, "//", b)
			check.Equal(t, FloorMod(a, b), a-want*b, a, "%", b)
		}
	}
	check.Equal(t, FloorDiv(math.MinInt64, -1), int64(math.MinInt64))
}

func TestHalf(t *testing.T) {
	tests := []struct {
		in   float32
		want uint16
	}{
		{0, 0}, {1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {65520, 0x7c00}, {1e-8, 0},
		{float32(math.Inf(1)), 0x7c00}, {5.960464477539063e-08, 1}, {6.103515625e-05, 0x0400},
		{1.0009765625, 0x3c01}, {1.00048828125, 0x3c00} /* tie to even */, {1.00146484375, 0x3c02},
	}
	for _, tc := range tests {
		t.Run(Float(ir.Float32, float64(tc.in)).String(), func(t *testing.T) {
			h := float32ToHalf(tc.in)
			check.Equal(t, h, tc.want)
			if tc.in < 65520 && tc.in > 1e-7 && tc.in != 1.00048828125 && tc.in != 1.00146484375 {
				check.Equal(t, halfToFloat32(h), tc.in)
			}
		})
	}
	check.True(t, math.IsNaN(float64(halfToFloat32(float32ToHalf(float32(math.NaN()))))))
}
