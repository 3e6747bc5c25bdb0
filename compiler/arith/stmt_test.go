package arith

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	_ "github.com/kiln-ml/kiln/devices/cpu" // host arrays for the tests
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// funcBody prints a function's body without its header lines.
func funcBody(f *ir.PrimFunc) string {
	lines := strings.Split(strings.TrimSpace(script.Print(f)), "\n")
	var out []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "#") || strings.HasPrefix(t, "@") || strings.HasPrefix(t, "def ") || strings.HasPrefix(t, "T.func_attr") || t == "" {
			continue
		}
		out = append(out, strings.TrimPrefix(l, "    "))
	}
	return strings.Join(out, "\n")
}

func TestSimplifyStmt(t *testing.T) {
	tests := []struct {
		name, src, want string
	}{
		{
			name: "split loops",
			src: `
@T.prim_func
def f(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
    for io in range(16):
        for ii in range(4):
            if io * 4 + ii < 64:
                B[(io * 4 + ii) // 4 * 4 + (io * 4 + ii) % 4] = A[io * 4 + ii] * T.float32(1.0)`,
			want: `
for io, ii in T.grid(16, 4):
    B[io * 4 + ii] = A[io * 4 + ii]`,
		},
		{
			name: "unit and empty loops",
			src: `
@T.prim_func
def f(A: T.Buffer((8,), "float32")):
    for i in range(1):
        for j in range(8):
            A[i * 8 + j] = T.float32(0.0)
    for k in range(0):
        A[k] = T.float32(1.0)
    T.evaluate(0)`,
			want: `
for j in range(8):
    A[j] = T.float32(0.0)`,
		},
		{
			name: "blocks and symbolic bounds",
			src: `
@T.prim_func
def f(a: T.handle, b: T.handle):
    n = T.int32()
    A = T.match_buffer(a, (n,), "float32")
    B = T.match_buffer(b, (n,), "float32")
    for i in range(n):
        with T.block("B"):
            vi = T.axis.spatial(n, i)
            T.reads(A[vi])
            T.writes(B[vi])
            B[vi] = T.if_then_else(vi < n, A[vi], T.float32(0.0))`,
			want: `
n = T.int32()
A = T.match_buffer(a, (n,))
B = T.match_buffer(b, (n,))
for i in range(n):
    with T.block("B"):
        vi = T.axis.remap("S", [i])
        T.reads(A[vi])
        T.writes(B[vi])
        B[vi] = A[vi]`,
		},
		{
			name: "asserts and lets",
			src: `
@T.prim_func
def f(A: T.Buffer((8,), "int32")):
    for i in range(8):
        with T.LetStmt(i * 2, T.int32) as t:
            assert t < 16, "in range"
            assert t < 14, "kept"
            A[i] = T.min(t, 20) + T.max(t // 2, i)`,
			want: `
for i in range(8):
    t: T.int32 = i * 2
    assert t < 14, "kept"
    A[i] = t + T.max(t // 2, i)`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mod, err := script.Parse(tc.name+".py", "# from tvm.script import tir as T\n"+strings.TrimPrefix(tc.src, "\n")+"\n")
			check.NoError(t, err)
			var f *ir.PrimFunc
			for _, g := range mod.PrimFuncs() {
				f = g
			}
			g := NewAnalyzer().SimplifyFunc(f)
			got := funcBody(g)
			check.Equal(t, got, strings.TrimPrefix(tc.want, "\n"))
			check.NoError(t, ir.Verify(g))
		})
	}
}

// TestSimplifyStmtKeepsMeaning runs a function before and after
// simplification in the interpreter and compares the outputs.
func TestSimplifyStmtKeepsMeaning(t *testing.T) {
	src := `# from tvm.script import tir as T
@T.prim_func
def f(A: T.Buffer((6, 8), "float32"), B: T.Buffer((48,), "float32")):
    for fused in range(48):
        for one in range(1):
            if fused // 8 < 6:
                B[fused // 8 * 8 + fused % 8 + one] = A[fused // 8, fused % 8] + T.float32(1.0) * T.float32(2.0)
`
	mod, err := script.Parse("f.py", src)
	check.NoError(t, err)
	f := mod.PrimFunc("f")
	g := NewAnalyzer().SimplifyFunc(f)
	check.True(t, g != f, "something simplified")
	rng := rand.New(rand.NewPCG(1, 1))
	data := make([]float32, 48)
	for i := range data {
		data[i] = rng.Float32()
	}
	run := func(fn *ir.PrimFunc) []float32 {
		a, err := ndarray.FromSlice(data, ndarray.Shape{6, 8})
		check.NoError(t, err)
		b, err := ndarray.FromSlice(make([]float32, 48), ndarray.Shape{48})
		check.NoError(t, err)
		check.NoError(t, interp.Run(fn, a, b))
		out, err := ndarray.ToSlice[float32](b)
		check.NoError(t, err)
		return out
	}
	check.Equal(t, run(g), run(f))
	check.True(t, !strings.Contains(script.Print(g), "if "), script.Print(g))
}
