package transform

import (
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestVectorizeNativeWidth checks that vectorize makes vectors no wider
// than the native width (AttrVectorBytes, default 64 bytes): a 32-lane
// float32 loop becomes pieces of 16 lanes by default.
func TestVectorizeNativeWidth(t *testing.T) {
	const src = `# from tvm.script import tir as T
@T.prim_func
def f(A: T.Buffer((32,), "float32"), B: T.Buffer((32,), "float32")):
    for i in T.vectorized(32):
        B[i] = A[i] + T.float32(1)
`
	m, err := script.Parse("f.py", src)
	check.NoError(t, err)
	f := m.PrimFunc("f")
	tests := []struct {
		name   string
		bytes  any // AttrVectorBytes, nil for none
		stores int
		lanes  int
	}{
		{"default", nil, 2, 16},
		{"avx2", int64(32), 4, 8},
		{"wide", int64(128), 1, 32},
		{"bad attribute ignored", "64", 2, 16},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := f
			if tt.bytes != nil {
				g = f.WithAttr(AttrVectorBytes, tt.bytes)
			}
			g, err := Run(g, []string{"lower_init", "lower_blocks", "flatten_buffers", "vectorize", "unroll", "simplify"}, Options{Verify: true})
			check.NoError(t, err)
			var lanes []int
			ir.Visit(g.Body, func(n ir.Node) bool {
				if s, ok := n.(*ir.BufferStore); ok {
					lanes = append(lanes, int(s.Value.DType().Lanes))
				}
				return true
			})
			check.Equal(t, len(lanes), tt.stores, script.Print(g))
			for _, l := range lanes {
				check.Equal(t, l, tt.lanes, script.Print(g))
			}
		})
	}
}

// TestVectorizeLeavesBoolCastsScalar checks that a loop casting booleans
// (which the code generators cannot do on vectors) stays scalar.
func TestVectorizeLeavesBoolCastsScalar(t *testing.T) {
	const src = `# from tvm.script import tir as T
@T.prim_func
def f(A: T.Buffer((16,), "bool"), B: T.Buffer((16,), "int64")):
    for i in T.vectorized(16):
        B[i] = T.Cast("int64", A[i])
`
	m, err := script.Parse("f.py", src)
	check.NoError(t, err)
	g, err := Run(m.PrimFunc("f"), []string{"lower_init", "lower_blocks", "flatten_buffers", "vectorize", "unroll", "simplify"}, Options{Verify: true})
	check.NoError(t, err)
	ir.Visit(g.Body, func(n ir.Node) bool {
		if s, ok := n.(*ir.BufferStore); ok {
			check.Equal(t, int(s.Value.DType().Lanes), 1, script.Print(g))
		}
		return true
	})
}
