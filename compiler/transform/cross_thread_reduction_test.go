package transform

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// crossThreadSum is a row sum whose reduction loop is bound to threadIdx.x
// (of threads threads, reduction of n values, op "+" or "max").
func crossThreadSum(threads, n int, op string) string {
	update := "S[vi] + A[vi, vk]"
	if op == "max" {
		update = "T.max(S[vi], A[vi, vk])"
	}
	return fmt.Sprintf(`
@T.prim_func(private=True)
def f(A: T.Buffer((4, %[2]d), "float32"), S: T.Buffer((4,), "float32")):
    for i in T.thread_binding(4, thread="blockIdx.x"):
        for k in T.thread_binding(%[1]d, thread="threadIdx.x"):
            with T.block("S"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    S[vi] = T.float32(-1)
                S[vi] = %[3]s
`, threads, n, update)
}

// TestLowerCrossThreadReduction: a reduction over a threadIdx.x loop
// becomes a tree through shared memory ending in warp shuffles, with the
// init combined into the total, and gives what the serial reduction
// gives; forms it cannot lower are errors naming the block.
func TestLowerCrossThreadReduction(t *testing.T) {
	for _, c := range []struct {
		threads  int
		op       string
		shuffles int
	}{{32, "+", 5}, {128, "+", 5}, {64, "max", 5}} {
		f := parsePrim(t, crossThreadSum(c.threads, c.threads, c.op))
		g, err := LowerCrossThreadReduction(f)
		check.NoError(t, err)
		text := script.Print(g)
		check.Equal(t, strings.Count(text, "tvm_warp_shuffle_down"), c.shuffles, text)
		check.True(t, strings.Contains(text, `scope="shared"`), text)
		// The serial reduction (the interpreter runs the threads one after
		// another) and the lowered one agree.
		lowered, err := Lower(f, Options{StopAfter: "storage_rewrite", Verify: true})
		check.NoError(t, err)
		rng := rand.New(rand.NewPCG(5, 6))
		args := randomArgs(t, rng, f)
		want, got := copyArgs(t, args), copyArgs(t, args)
		check.NoError(t, interp.Run(f, want...))
		check.NoError(t, interp.Run(lowered, got...))
		w, err := ndarray.ToSlice[float32](want[1].(*ndarray.NDArray))
		check.NoError(t, err)
		h, err := ndarray.ToSlice[float32](got[1].(*ndarray.NDArray))
		check.NoError(t, err)
		for i := range w {
			d := w[i] - h[i]
			check.True(t, d < 1e-4 && d > -1e-4, "element", i, "serial", w[i], "lowered", h[i])
		}
	}
	for _, c := range []struct{ src, want string }{
		{crossThreadSum(48, 48, "+"), `lower_cross_thread_reduction: block "S" over threadIdx loop "k": want a threadIdx.x loop of a power of two from 32 to 1024 threads, have threadIdx.x of 48`},
		{strings.Replace(crossThreadSum(32, 32, "+"), "S[vi] + A[vi, vk]", "S[vi] * A[vi, vk]", 1), `lower_cross_thread_reduction: block "S" over threadIdx loop "k": want y = y + E, max(y, E) or min(y, E)`},
	} {
		_, err := LowerCrossThreadReduction(parsePrim(t, c.src))
		check.Error(t, err, c.want)
	}
}

// parsePrim parses the one function of src.
func parsePrim(t *testing.T, src string) *ir.PrimFunc {
	t.Helper()
	m, err := script.Parse("f.py", src)
	check.NoError(t, err)
	for _, f := range m.PrimFuncs() {
		return f
	}
	t.Fatal("no function in", src)
	return nil
}
