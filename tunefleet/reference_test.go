package tunefleet

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/ndarray"
)

func f32bytes(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// TestCheckerSplitWrites streams an output in pieces that split
// elements and checks the verdict is what a comparison of the whole
// says.
func TestCheckerSplitWrites(t *testing.T) {
	nan := float32(math.NaN())
	ref := param{dtype: ndarray.Float32, data: f32bytes(1, 2, 3, nan, 5, 6, 7, 8), out: true}
	for _, tc := range []struct {
		name string
		got  []byte
		want string // a part of the message; "" when it matches
	}{
		{"same", f32bytes(1, 2, 3, nan, 5, 6, 7, 8), ""},
		{"within tolerance", f32bytes(1, 2, 3.002, nan, 5, 6, 7, 8.001), ""},
		{"one element off", f32bytes(1, 2, 3, nan, 5, 6.5, 7, 8), "element 5 is 6.5"},
		{"an element left poisoned", append(f32bytes(1, 2, 3, nan, 5, 6, 7), 0xff, 0xff, 0xff, 0xff), "element 7 is NaN"},
		{"NaN where the reference has none", f32bytes(nan, 2, 3, nan, 5, 6, 7, 8), "element 0"},
		{"short", f32bytes(1, 2, 3, nan, 5, 6, 7), "28 bytes, want 32"},
		{"long", f32bytes(1, 2, 3, nan, 5, 6, 7, 8, 9), "36 bytes, want 32"},
	} {
		for _, piece := range []int{1, 3, 4, 5, 7, 64} {
			c := newChecker(ref)
			for b := tc.got; len(b) > 0; {
				k := min(piece, len(b))
				if n, err := c.Write(b[:k]); n != k || err != nil {
					t.Fatalf("%s, pieces of %d: Write = %d, %v", tc.name, piece, n, err)
				}
				b = b[k:]
			}
			got := c.Result()
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("%s, pieces of %d: %q, want %q", tc.name, piece, got, tc.want)
			}
		}
	}
}

// TestCheckerIntegers compares integer outputs byte for byte.
func TestCheckerIntegers(t *testing.T) {
	ref := param{dtype: ndarray.Int32, data: []byte{1, 0, 0, 0, 2, 0, 0, 0}, out: true}
	c := newChecker(ref)
	c.Write([]byte{1, 0, 0})
	c.Write([]byte{0, 2, 0, 1, 0})
	if got := c.Result(); !strings.Contains(got, "byte 6 differs") {
		t.Errorf("got %q, want byte 6 to differ", got)
	}
}
