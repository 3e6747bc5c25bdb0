package arith

import (
	"math"
	"math/bits"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/ndarray"
)

// Infinite bounds: an interval end at NegInf or PosInf is unbounded.
const (
	// NegInf is the lower end of an interval without a lower bound.
	NegInf = math.MinInt64
	// PosInf is the upper end of an interval without an upper bound.
	PosInf = math.MaxInt64
)

// interval is the closed range [lo, hi] of mathematical integers; NegInf
// and PosInf are infinite ends.
type interval struct{ lo, hi int64 }

var everything = interval{NegInf, PosInf}

func point(v int64) interval { return interval{v, v} }

func (i interval) isPoint() bool { return i.lo == i.hi && i.lo != NegInf && i.lo != PosInf }

// within reports i ⊆ o.
func (i interval) within(o interval) bool { return i.lo >= o.lo && i.hi <= o.hi }

func (i interval) union(o interval) interval { return interval{min(i.lo, o.lo), max(i.hi, o.hi)} }

func (i interval) intersect(o interval) interval {
	return interval{max(i.lo, o.lo), min(i.hi, o.hi)}
}

// typeRange is the range of values of scalar type t, or everything when t
// has no bounded value-dependent reasoning (int64 behaves as unbounded,
// uint64 and floats are unknown).
func typeRange(t ir.DType) interval {
	switch {
	case ir.IsBool(t):
		return interval{0, 1}
	case t.Code == ndarray.Int && t.Bits < 64:
		return interval{-(int64(1) << (t.Bits - 1)), int64(1)<<(t.Bits-1) - 1}
	case t.Code == ndarray.UInt && t.Bits < 64:
		return interval{0, int64(1)<<t.Bits - 1}
	}
	return everything
}

// boundedType reports types whose values the interval analysis reasons
// about: bool and the integers except uint64, all scalar.
func boundedType(t ir.DType) bool {
	if t.Lanes > 1 {
		return false
	}
	return ir.IsBool(t) || (t.Code == ndarray.Int) || (t.Code == ndarray.UInt && t.Bits < 64)
}

// fit returns i when it lies within t's range and t's whole range
// otherwise (the value may have wrapped); ok reports the first case.
func fit(t ir.DType, i interval, overflow bool) (interval, bool) {
	r := typeRange(t)
	if overflow || !i.within(r) {
		return r, false
	}
	return i, true
}

// The arithmetic below is on extended integers: NegInf and PosInf absorb
// finite values. Each returns overflow=true when finite operands gave a
// result outside int64 (the result is then clamped).

func isInf(v int64) bool { return v == NegInf || v == PosInf }

func addExt(a, b int64) (int64, bool) {
	switch {
	case isInf(a) && isInf(b):
		if a != b {
			return 0, true // inf - inf: unknown
		}
		return a, false
	case isInf(a):
		return a, false
	case isInf(b):
		return b, false
	}
	s := a + b
	if (a > 0 && b > 0 && s <= 0) || (a < 0 && b < 0 && s >= 0) || s == NegInf || s == PosInf {
		if a > 0 {
			return PosInf, true
		}
		return NegInf, true
	}
	return s, false
}

func negExt(a int64) (int64, bool) {
	switch a {
	case NegInf:
		return PosInf, false
	case PosInf:
		return NegInf, false
	}
	return -a, false
}

func mulExt(a, b int64) (int64, bool) {
	if a == 0 || b == 0 {
		return 0, false
	}
	neg := (a < 0) != (b < 0)
	if isInf(a) || isInf(b) {
		if neg {
			return NegInf, false
		}
		return PosInf, false
	}
	ua, ub := absU(a), absU(b)
	hi, lo := bits.Mul64(ua, ub)
	if hi != 0 || lo >= 1<<63 {
		if neg {
			return NegInf, true
		}
		return PosInf, true
	}
	if neg {
		return -int64(lo), false
	}
	return int64(lo), false
}

func absU(a int64) uint64 {
	if a < 0 {
		return uint64(-a)
	}
	return uint64(a)
}

func (i interval) add(o interval) (interval, bool) {
	lo, o1 := addExt(i.lo, o.lo)
	hi, o2 := addExt(i.hi, o.hi)
	if i.lo == PosInf || o.lo == PosInf || i.hi == NegInf || o.hi == NegInf {
		return everything, true
	}
	return interval{lo, hi}, o1 || o2
}

func (i interval) neg() interval {
	lo, _ := negExt(i.hi)
	hi, _ := negExt(i.lo)
	return interval{lo, hi}
}

// scale multiplies by a finite constant.
func (i interval) scale(c int64) (interval, bool) {
	a, o1 := mulExt(i.lo, c)
	b, o2 := mulExt(i.hi, c)
	if a > b {
		a, b = b, a
	}
	return interval{a, b}, o1 || o2
}

func (i interval) mul(o interval) (interval, bool) {
	c := [4][2]int64{{i.lo, o.lo}, {i.lo, o.hi}, {i.hi, o.lo}, {i.hi, o.hi}}
	r := interval{PosInf, NegInf}
	over := false
	for _, p := range c {
		v, of := mulExt(p[0], p[1])
		over = over || of
		r.lo, r.hi = min(r.lo, v), max(r.hi, v)
	}
	return r, over
}

// divExt divides extended integers, b finite and non-zero, rounding down
// (floor) or toward zero.
func divExt(a, b int64, floor bool) int64 {
	if isInf(a) {
		if (a > 0) == (b > 0) {
			return PosInf
		}
		return NegInf
	}
	if b == -1 {
		if a == NegInf+1 {
			return PosInf
		}
		return -a
	}
	q := a / b
	if floor && a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// div bounds a / o for a divisor that does not contain 0 and has finite
// ends.
func (i interval) div(o interval, floor bool) interval {
	if o.lo <= 0 && o.hi >= 0 || isInf(o.lo) || isInf(o.hi) {
		return everything
	}
	r := interval{PosInf, NegInf}
	for _, a := range []int64{i.lo, i.hi} {
		for _, b := range []int64{o.lo, o.hi} {
			v := divExt(a, b, floor)
			r.lo, r.hi = min(r.lo, v), max(r.hi, v)
		}
	}
	return r
}
