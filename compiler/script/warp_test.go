package script

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestWarpShuffle reads TVM's T.tvm_warp_shuffle_down(mask, value, delta,
// width, warp_size), prints it back the same, and refuses a float where
// an integer argument belongs.
func TestWarpShuffle(t *testing.T) {
	const src = `# from tvm.script import tir as T
@T.prim_func
def k(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
    T.func_attr({"global_symbol": "k"})
    for tx in T.thread_binding(64, thread="threadIdx.x"):
        B[tx] = T.tvm_warp_shuffle_down(T.uint32(4294967295), A[tx], 16, 32, 32)
`
	roundTrip(t, src)
	m, err := Parse("k.py", src)
	check.NoError(t, err)
	found := false
	ir.Visit(m.PrimFunc("k").Body, func(n ir.Node) bool {
		if c, ok := n.(*ir.Call); ok && c.Op == ir.OpWarpShuffleDown {
			found = c.Type == ir.Float32 && len(c.Args) == 5
		}
		return true
	})
	check.True(t, found, "a float32 tvm_warp_shuffle_down call")
	check.True(t, strings.Contains(Print(m), "T.tvm_warp_shuffle_down("), Print(m))

	_, err = Parse("k.py", `# from tvm.script import tir as T
@T.prim_func
def k(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
    for tx in T.thread_binding(64, thread="threadIdx.x"):
        B[tx] = T.tvm_warp_shuffle_down(T.uint32(4294967295), A[tx], T.float32(1), 32, 32)
`)
	check.Error(t, err, "argument 3 is float32, want a scalar integer")
}
