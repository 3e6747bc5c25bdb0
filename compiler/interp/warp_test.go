package interp

import (
	"math/rand/v2"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// shuffleKernel parses src and replaces each T.sqrt(x) in it with
// tvm_warp_shuffle_down(x, delta) (the script parser does not read
// shuffles).
func shuffleKernel(t *testing.T, src string, delta int64) *ir.PrimFunc {
	t.Helper()
	f := kernelFunc(t, src)
	r := &ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
		if c, ok := e.(*ir.Call); ok && c.Op == "sqrt" {
			return ir.WarpShuffleDown(c.Args[0], delta)
		}
		return e
	}}
	return r.RewriteFunc(f)
}

// TestWarpShuffle runs warp shuffles: each lane gets the value of the lane
// delta above it in its warp (its own at the top of the warp), in every
// block; a sum over a warp by five shuffles gives the warp's total in lane
// 0; a shuffle that only some lanes of a warp reach, or one outside a
// thread loop, is an error.
func TestWarpShuffle(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const down = `@T.prim_func
def k(A: T.Buffer((192,), "float32"), B: T.Buffer((192,), "float32")):
    T.func_attr({"global_symbol": "k"})
    for bx in T.thread_binding(3, thread="blockIdx.x"):
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            B[bx * 64 + tx] = T.sqrt(A[bx * 64 + tx])
`
	for _, delta := range []int64{1, 5, 16} {
		a, b := randArray(t, rng, 192), zeros(t, 192)
		check.NoError(t, Run(shuffleKernel(t, down, delta), a, b))
		av, err := ndarray.ToSlice[float32](a)
		check.NoError(t, err)
		bv, err := ndarray.ToSlice[float32](b)
		check.NoError(t, err)
		for i := range bv {
			want := av[i]
			if int64(i%32)+delta < 32 {
				want = av[i+int(delta)]
			}
			check.Equal(t, bv[i], want, "delta", delta, "element", i)
		}
	}

	t.Run("warp sum", func(t *testing.T) {
		const sum = `@T.prim_func
def k(A: T.Buffer((64,), "float32"), B: T.Buffer((2,), "float32")):
    T.func_attr({"global_symbol": "k"})
    for tx in T.thread_binding(64, thread="threadIdx.x"):
        v0: T.float32 = A[tx]
        v1: T.float32 = v0 + T.sqrt(v0)
        v2: T.float32 = v1 + T.sqrt(v1)
        v3: T.float32 = v2 + T.sqrt(v2)
        v4: T.float32 = v3 + T.sqrt(v3)
        v5: T.float32 = v4 + T.sqrt(v4)
        if tx % 32 == 0:
            B[tx // 32] = v5
`
		// Deltas 16, 8, 4, 2, 1 in turn: replace the sqrt calls in order.
		f := kernelFunc(t, sum)
		d := int64(32)
		f = (&ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
			if c, ok := e.(*ir.Call); ok && c.Op == "sqrt" {
				d /= 2
				return ir.WarpShuffleDown(c.Args[0], d)
			}
			return e
		}}).RewriteFunc(f)
		vals := make([]float32, 64)
		for i := range vals {
			vals[i] = float32(i % 7)
		}
		a, err := ndarray.FromSlice(vals, ndarray.Shape{64})
		check.NoError(t, err)
		b := zeros(t, 2)
		check.NoError(t, Run(f, a, b))
		got, err := ndarray.ToSlice[float32](b)
		check.NoError(t, err)
		var w0, w1 float32
		for i, v := range vals {
			if i < 32 {
				w0 += v
			} else {
				w1 += v
			}
		}
		check.Equal(t, got, []float32{w0, w1})
	})

	t.Run("divergent", func(t *testing.T) {
		const div = `@T.prim_func
def k(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
    T.func_attr({"global_symbol": "k"})
    for tx in T.thread_binding(64, thread="threadIdx.x"):
        if tx < 40:
            B[tx] = T.sqrt(A[tx])
`
		err := Run(shuffleKernel(t, div, 1), randArray(t, rng, 64), zeros(t, 64))
		check.Error(t, err, "thread (32, 0, 0) shuffles but thread (40, 0, 0) of its warp does not reach the same shuffle")
	})

	t.Run("outside a thread loop", func(t *testing.T) {
		const serial = `@T.prim_func
def k(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
    T.func_attr({"global_symbol": "k"})
    for i in range(4):
        B[i] = T.sqrt(A[i])
`
		err := Run(shuffleKernel(t, serial, 1), randArray(t, rng, 4), zeros(t, 4))
		check.Error(t, err, "a warp shuffle outside a threadIdx.x loop")
	})
}
