package auto

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestMmaRule: the tensor-core rule is made of schedule primitives only:
// its trace replays to its function, which computes what the unscheduled
// one does (odd numbers of 16×8 tiles, an epilogue inlined into the copy
// back), and a C of the operands' dtype accumulates in a float32 cache
// (B stored (n, k)).
func TestMmaRule(t *testing.T) {
	for _, c := range []struct {
		name  string
		src   string
		exact bool     // compare the outputs (float32 sums of exact products)
		trace []string // lines the trace holds
	}{
		{"bias_relu", `
@T.prim_func(private=True)
def mm(A: T.Buffer((48, 32), "bfloat16"), B: T.Buffer((32, 40), "bfloat16"), bias: T.Buffer((40,), "float32"), D: T.Buffer((48, 40), "float32")):
    C = T.alloc_buffer((48, 40))
    for i, j, k in T.grid(48, 40, 32):
        with T.block("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + T.Cast("float32", A[vi, vk]) * T.Cast("float32", B[vk, vj])
    for i, j in T.grid(48, 40):
        with T.block("D"):
            vi, vj = T.axis.remap("SS", [i, j])
            D[vi, vj] = T.max(C[vi, vj] + bias[vj], T.float32(0))
`, true, []string{`sch.tensorize(i_3, "kiln.ptx_mma_frag_m16n8k16_bf16")`, `sch.reverse_compute_inline(D)`}},
		{"bf16_sum_nt", `
@T.prim_func(private=True)
def mm(A: T.Buffer((32, 32), "bfloat16"), B: T.Buffer((16, 32), "bfloat16"), C: T.Buffer((32, 16), "bfloat16")):
    for i, j, k in T.grid(32, 16, 32):
        with T.block("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.bfloat16(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vj, vk]
`, false, []string{`C_local = sch.cache_write(C, 0, "local", dtype="float32")`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := parseFunc(t, c.src)
			a, err := ApplyGPU(f, GPUOptions{})
			check.NoError(t, err)
			check.Equal(t, a.Rule, "tensor-core matmul")
			for _, l := range c.trace {
				check.True(t, strings.Contains(strings.Join(a.Trace, "\n"), l), "no", l, "in\n", strings.Join(a.Trace, "\n"))
			}
			r, err := schedule.Replay(f, a.Trace)
			check.NoError(t, err)
			check.Equal(t, script.Print(r.Func()), script.Print(a.Func))
			check.NoError(t, ir.Verify(a.Func))
			if c.exact {
				check.Equal(t, bf16Output(t, a.Func), bf16Output(t, f))
			}
		})
	}
}
