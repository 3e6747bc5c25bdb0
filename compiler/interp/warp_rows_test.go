package interp

import (
	"math/rand/v2"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// TestWarpRows: inside a threadIdx.y loop, a warp is the 32 threadIdx.x
// lanes of one row of the block: a shuffle reads within the row. A
// threadIdx.x loop of a row that does not hold whole warps is an error.
func TestWarpRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const rows = `@T.prim_func
def k(A: T.Buffer((128,), "float32"), B: T.Buffer((128,), "float32")):
    T.func_attr({"global_symbol": "k"})
    for bx in T.thread_binding(2, thread="blockIdx.x"):
        for ty in T.thread_binding(2, thread="threadIdx.y"):
            for tx in T.thread_binding(32, thread="threadIdx.x"):
                B[bx * 64 + ty * 32 + tx] = T.sqrt(A[bx * 64 + ty * 32 + tx])
`
	a, b := randArray(t, rng, 128), zeros(t, 128)
	check.NoError(t, Run(shuffleKernel(t, rows, 3), a, b))
	av, err := ndarray.ToSlice[float32](a)
	check.NoError(t, err)
	bv, err := ndarray.ToSlice[float32](b)
	check.NoError(t, err)
	for i := range bv {
		want := av[i]
		if i%32+3 < 32 {
			want = av[i+3]
		}
		check.Equal(t, bv[i], want, "element", i)
	}

	const half = `@T.prim_func
def k(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
    T.func_attr({"global_symbol": "k"})
    for bx in T.thread_binding(2, thread="blockIdx.x"):
        for ty in T.thread_binding(2, thread="threadIdx.y"):
            for tx in T.thread_binding(16, thread="threadIdx.x"):
                B[bx * 32 + ty * 16 + tx] = T.sqrt(A[bx * 32 + ty * 16 + tx])
`
	err = Run(shuffleKernel(t, half, 1), randArray(t, rng, 64), zeros(t, 64))
	check.Error(t, err, `for "tx": a warp-wide operation in a threadIdx.x loop of 16 threads inside a threadIdx.y or z loop: its warps would span rows of the block`)
}
