package ndarray

import (
	"math"
	"testing"
)

// TestFloat8 checks the 8-bit float codecs: every code decodes and
// encodes back to itself (NaNs to the canonical NaN), the largest finite
// values and the smallest subnormals are OCP's, halfway values round to
// even, and values past the largest finite saturate.
func TestFloat8(t *testing.T) {
	for _, c := range []Code{Float8E4M3, Float8E5M2} {
		for b := 0; b < 256; b++ {
			v := Float8Value(c, uint8(b))
			got := Float8Bits(c, v)
			switch {
			case math.IsNaN(v):
				if got&0x7f != 0x7f {
					t.Errorf("code %d: NaN %#x encodes as %#x", c, b, got)
				}
			case math.IsInf(v, 0):
				// Saturates to the largest finite value.
				if Float8Value(c, got) != math.Copysign(57344, v) {
					t.Errorf("code %d: %g encodes as %#x", c, v, got)
				}
			case got != uint8(b):
				t.Errorf("code %d: %#x decodes to %g, which encodes as %#x", c, b, v, got)
			}
		}
	}
	cases := []struct {
		c    Code
		f    float64
		bits uint8
	}{
		{Float8E4M3, 448, 0x7e},
		{Float8E4M3, 1000, 0x7e},
		{Float8E4M3, -1e9, 0xfe},
		{Float8E4M3, math.Ldexp(1, -9), 0x01},
		{Float8E4M3, 1.0625, 0x38}, // halfway between 1 and 1.125: to even (1)
		{Float8E4M3, 1.1875, 0x3a}, // halfway between 1.125 and 1.25: to even (1.25)
		{Float8E5M2, 57344, 0x7b},
		{Float8E5M2, math.Inf(-1), 0xfb},
		{Float8E5M2, math.Ldexp(1, -16), 0x01},
		{Float8E5M2, 1.125, 0x3c}, // halfway between 1 and 1.25: to even (1)
	}
	for _, tc := range cases {
		if got := Float8Bits(tc.c, tc.f); got != tc.bits {
			t.Errorf("code %d: %g encodes as %#x, want %#x", tc.c, tc.f, got, tc.bits)
		}
	}
	for _, s := range []string{"float8_e4m3", "float8_e5m2", "float8_e4m3x4"} {
		d, err := ParseDType(s)
		if err != nil || d.String() != s || !d.IsFloat8() || d.Scalar().Size() != 1 {
			t.Errorf("ParseDType(%q) = %v, %v", s, d, err)
		}
	}
	if d, err := ParseDType("float8_e4m3fn"); err != nil || d != Float8_E4M3 {
		t.Errorf("ParseDType(float8_e4m3fn) = %v, %v", d, err)
	}
}
