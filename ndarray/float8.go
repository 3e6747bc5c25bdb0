package ndarray

import "math"

// float8Format describes an 8-bit float encoding.
type float8Format struct {
	man, bias int     // mantissa bits, exponent bias
	max       float64 // the largest finite value
	inf       bool    // has infinities (exponent all ones is inf/NaN)
}

func float8Of(c Code) float8Format {
	if c == Float8E5M2 {
		return float8Format{man: 2, bias: 15, max: 57344, inf: true}
	}
	return float8Format{man: 3, bias: 7, max: 448}
}

// Float8Bits encodes f as 8-bit float code c (Float8E4M3 or Float8E5M2),
// rounding to nearest even and saturating to the largest finite value
// (infinities too), as CUDA's conversions (cvt.rn.satfinite) do; NaN stays
// NaN.
func Float8Bits(c Code, f float64) uint8 {
	ff := float8Of(c)
	var sign uint8
	if math.Signbit(f) {
		sign = 0x80
	}
	a := math.Abs(f)
	switch {
	case math.IsNaN(f):
		return sign | 0x7f
	case a == 0:
		return sign
	case a > ff.max:
		a = ff.max // saturate (infinities too)
	}
	minExp := 1 - ff.bias // the exponent of the smallest normal
	e := max(math.Ilogb(a), minExp)
	quantum := math.Ldexp(1, e-ff.man)
	v := math.RoundToEven(a/quantum) * quantum
	if v > ff.max {
		v = ff.max
	}
	if v == 0 {
		return sign
	}
	if v < math.Ldexp(1, minExp) {
		return sign | uint8(v/math.Ldexp(1, minExp-ff.man))
	}
	e = math.Ilogb(v)
	mant := uint8(v/math.Ldexp(1, e-ff.man)) - 1<<ff.man
	return sign | uint8(e+ff.bias)<<ff.man | mant
}

// Float8Value decodes 8-bit float bits b of code c.
func Float8Value(c Code, b uint8) float64 {
	ff := float8Of(c)
	sign := 1.0
	if b&0x80 != 0 {
		sign = -1
	}
	exp := int(b&0x7f) >> ff.man
	mant := int(b) & (1<<ff.man - 1)
	allOnes := 1<<(7-ff.man) - 1
	switch {
	case ff.inf && exp == allOnes && mant == 0:
		return sign * math.Inf(1)
	case ff.inf && exp == allOnes, !ff.inf && exp == allOnes && mant == 1<<ff.man-1:
		return math.NaN()
	case exp == 0:
		return sign * math.Ldexp(float64(mant), 1-ff.bias-ff.man)
	}
	return sign * math.Ldexp(float64(mant+1<<ff.man), exp-ff.bias-ff.man)
}
