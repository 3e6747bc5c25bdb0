package ndarray

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Shape is the extent of each dimension of a tensor.
type Shape []int64

// NumElements is the product of the extents (1 for a scalar).
func (s Shape) NumElements() int64 {
	n := int64(1)
	for _, d := range s {
		n *= d
	}
	return n
}

// Equal reports whether two shapes are the same.
func (s Shape) Equal(o Shape) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i] != o[i] {
			return false
		}
	}
	return true
}

// Clone returns a copy that does not share storage.
func (s Shape) Clone() Shape { return slices.Clone(s) }

// String prints the shape as (2, 3).
func (s Shape) String() string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = strconv.FormatInt(d, 10)
	}
	if len(s) == 1 {
		return "(" + parts[0] + ",)"
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// Validate checks that no extent is negative and the element count does not
// overflow.
func (s Shape) Validate() error {
	n := int64(1)
	for i, d := range s {
		if d < 0 {
			return fmt.Errorf("shape %v: dimension %d is negative", s, i)
		}
		if d != 0 && n > (1<<62)/d {
			return fmt.Errorf("shape %v: too many elements", s)
		}
		n *= d
	}
	return nil
}

// CompactStrides returns the row-major strides (in elements) of a shape.
func CompactStrides(s Shape) []int64 {
	st := make([]int64, len(s))
	acc := int64(1)
	for i := len(s) - 1; i >= 0; i-- {
		st[i] = acc
		acc *= s[i]
	}
	return st
}
