package interp

import (
	"math/rand/v2"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

func kernelFunc(t *testing.T, src string) *ir.PrimFunc {
	t.Helper()
	return parseFunc(t, "k.py", "# from tvm.script import tir as T\n"+src, "k")
}

// TestSharedRaces runs kernels that stage data through shared memory: each
// thread reading back its own element is fine; reading a neighbour's
// element (written by another thread, with no barrier, or not yet), two
// threads writing one element, and reading what only an earlier block
// wrote are data races.
func TestSharedRaces(t *testing.T) {
	kernel := func(stage, read string) string {
		return `@T.prim_func
def k(A: T.Buffer((256,), "float32"), B: T.Buffer((256,), "float32")):
    T.func_attr({"global_symbol": "k"})
    S = T.alloc_buffer((64,), scope="shared")
    for bx in T.thread_binding(4, thread="blockIdx.x"):
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.block("S"):
                vi = T.axis.spatial(64, tx)
                S[` + stage + `] = A[bx * 64 + vi]
            with T.block("B"):
                vi = T.axis.spatial(64, tx)
                B[bx * 64 + vi] = S[` + read + `]
`
	}
	rng := rand.New(rand.NewPCG(1, 2))
	t.Run("own element", func(t *testing.T) {
		a, b := randArray(t, rng, 256), zeros(t, 256)
		check.NoError(t, Run(kernelFunc(t, kernel("vi", "vi")), a, b))
		check.Equal(t, f32s(t, b), f32s(t, a))
	})
	cases := []struct{ name, stage, read, want string }{
		{"previous neighbour", "vi", "T.max(vi - 1, 0)", `shared "S"[0]: thread (1, 0, 0) reads what thread (0, 0, 0) wrote, with no barrier between`},
		{"next neighbour", "vi", "(vi + 1) % 64", `shared "S"[1]: thread (0, 0, 0) reads what no thread of its block wrote`},
		{"two writers", "vi // 2", "vi // 2", `shared "S"[0]: thread (1, 0, 0) overwrites what thread (0, 0, 0) wrote, with no barrier between`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Run(kernelFunc(t, kernel(c.stage, c.read)), randArray(t, rng, 256), zeros(t, 256))
			check.ErrorIs(t, err, ErrDataRace)
			check.Error(t, err, c.want)
		})
	}
	// Sibling thread loops are separated by a barrier: reading a
	// neighbour's element in the second is fine.
	t.Run("after barrier", func(t *testing.T) {
		src := `@T.prim_func
def k(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
    T.func_attr({"global_symbol": "k"})
    S = T.alloc_buffer((64,), scope="shared")
    for bx in T.thread_binding(1, thread="blockIdx.x"):
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.block("S"):
                vi = T.axis.spatial(64, tx)
                S[vi] = A[vi]
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.block("B"):
                vi = T.axis.spatial(64, tx)
                B[vi] = S[63 - vi]
`
		a, b := randArray(t, rng, 64), zeros(t, 64)
		check.NoError(t, Run(kernelFunc(t, src), a, b))
		av, bv := f32s(t, a), f32s(t, b)
		for i := range 64 {
			check.Equal(t, bv[i], av[63-i])
		}
	})
	// A block starts with nothing written: what block 0 staged is not
	// there for block 1.
	t.Run("previous block", func(t *testing.T) {
		src := `@T.prim_func
def k(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
    T.func_attr({"global_symbol": "k"})
    S = T.alloc_buffer((64,), scope="shared")
    for bx in T.thread_binding(2, thread="blockIdx.x"):
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.block("S"):
                vb, vi = T.axis.remap("SS", [bx, tx])
                T.where(bx == 0)
                S[vi] = A[vi]
            with T.block("B"):
                vb, vi = T.axis.remap("SS", [bx, tx])
                T.where(bx == 1)
                B[vi] = S[vi]
`
		err := Run(kernelFunc(t, src), randArray(t, rng, 64), zeros(t, 64))
		check.ErrorIs(t, err, ErrDataRace)
		check.Error(t, err, `thread (0, 0, 0) reads what no thread of its block wrote`)
	})
}

// TestPerThreadLocal runs a kernel whose "local" accumulator is allocated
// outside the threadIdx loops and lives from one thread loop nest to the
// next: as in CUDA, each thread has its own copy.
func TestPerThreadLocal(t *testing.T) {
	src := `@T.prim_func
def k(A: T.Buffer((256,), "float32"), B: T.Buffer((64,), "float32")):
    T.func_attr({"global_symbol": "k"})
    for bx in T.thread_binding(1, thread="blockIdx.x"):
        with T.block("kernel"):
            acc = T.alloc_buffer((1,), scope="local")
            for tx in T.thread_binding(64, thread="threadIdx.x"):
                with T.block("init"):
                    vi = T.axis.spatial(64, tx)
                    acc[0] = T.float32(0)
            for r in range(4):
                for tx in T.thread_binding(64, thread="threadIdx.x"):
                    with T.block("sum"):
                        vi = T.axis.spatial(64, tx)
                        acc[0] = acc[0] + A[r * 64 + vi]
            for tx in T.thread_binding(64, thread="threadIdx.x"):
                with T.block("B"):
                    vi = T.axis.spatial(64, tx)
                    B[vi] = acc[0]
`
	rng := rand.New(rand.NewPCG(3, 4))
	a, b := randArray(t, rng, 4*64), zeros(t, 64)
	in := f32s(t, a)
	check.NoError(t, Run(kernelFunc(t, src), a, b))
	got := f32s(t, b)
	for i := range 64 {
		want := float32(0)
		for r := range 4 {
			want += in[r*64+i]
		}
		check.Equal(t, got[i], want, "thread", i)
	}
}

// TestDynamicSharedRaces checks shared.dyn buffers (dynamic shared
// memory) for races as shared ones are.
func TestDynamicSharedRaces(t *testing.T) {
	src := `@T.prim_func
def k(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
    T.func_attr({"global_symbol": "k"})
    S = T.alloc_buffer((64,), scope="shared.dyn")
    for tx in T.thread_binding(64, thread="threadIdx.x"):
        with T.block("S"):
            vi = T.axis.spatial(64, tx)
            S[vi] = A[vi]
        with T.block("B"):
            vi = T.axis.spatial(64, tx)
            B[vi] = S[63 - vi]
`
	rng := rand.New(rand.NewPCG(5, 6))
	err := Run(kernelFunc(t, src), randArray(t, rng, 64), zeros(t, 64))
	check.ErrorIs(t, err, ErrDataRace)
	check.Error(t, err, `shared "S"[63]: thread (0, 0, 0) reads what no thread of its block wrote`)
}
