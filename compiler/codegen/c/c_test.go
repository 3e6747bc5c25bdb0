package c

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/internal/check"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// lowered parses testdata/kernels.py and lowers it, verifying after every
// pass.
func lowered(t *testing.T) *ir.IRModule {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", "kernels.py"))
	check.NoError(t, err)
	m, err := script.Parse("kernels.py", string(src))
	check.NoError(t, err)
	l, err := transform.LowerModule(m, transform.Options{Verify: true})
	check.NoError(t, err)
	return l
}

// TestGolden compares each function's generated C (with the vector types
// it uses) with testdata/NAME.golden.
func TestGolden(t *testing.T) {
	m := lowered(t)
	for name, f := range m.PrimFuncs() {
		t.Run(name, func(t *testing.T) {
			r := NewRenderer(C())
			check.NoError(t, r.Func(name, f))
			got := r.vectorDecls() + r.funcs.String()
			path := filepath.Join("testdata", name+".golden")
			if *update {
				check.NoError(t, os.WriteFile(path, []byte(got), 0o644))
			}
			want, err := os.ReadFile(path)
			check.NoError(t, err, "run go test -update")
			check.Equal(t, got, string(want))
		})
	}
}

func TestGenerateErrors(t *testing.T) {
	src := `# from tvm.script import tir as T
@T.prim_func
def f(A: T.Buffer((4,), "float32")):
    T.func_attr({"global_symbol": "f"})
    for i in T.thread_binding(4, thread="threadIdx.x"):
        A[i] = T.float32(1)
`
	m, err := script.Parse("f.py", src)
	check.NoError(t, err)
	t.Run("not lowered", func(t *testing.T) {
		_, _, err := Generate(m, Options{})
		check.Error(t, err, `function "f"`, "no packed API")
	})
	t.Run("thread binding", func(t *testing.T) {
		l, err := transform.LowerModule(m, transform.Options{Verify: true})
		check.NoError(t, err)
		_, _, err = Generate(l, Options{})
		check.Error(t, err, `function "f"`, `loop "i"`, "threadIdx.x", `target "c"`)
	})
	t.Run("warp shuffle", func(t *testing.T) {
		// A GPU's instruction: the CUDA dialect prints it, C refuses it.
		src := `# from tvm.script import tir as T
@T.prim_func
def g(A: T.Buffer((4,), "float32")):
    T.func_attr({"global_symbol": "g"})
    for i in range(4):
        A[i] = T.tvm_warp_shuffle_down(T.uint32(4294967295), A[i], 1, 32, 32)
`
		m, err := script.Parse("g.py", src)
		check.NoError(t, err)
		l, err := transform.LowerModule(m, transform.Options{Verify: true})
		check.NoError(t, err)
		_, _, err = Generate(l, Options{})
		check.Error(t, err, `function "g"`, "tvm_warp_shuffle_down", `the c dialect does not print`)
	})
	t.Run("bad name", func(t *testing.T) {
		l, err := transform.LowerModule(m, transform.Options{})
		check.NoError(t, err)
		f := l.PrimFunc("f").WithAttr(ir.AttrGlobalSymbol, "my-func")
		_, _, err = Generate(ir.NewIRModule().With("f", f), Options{})
		check.Error(t, err, `"my-func"`, "not a C identifier")
	})
}

func TestCString(t *testing.T) {
	tests := []struct{ in, want string }{
		{"plain", `"plain"`},
		{`a "q" \ b`, `"a \"q\" \\ b"`},
		{"nl\n?\x01", `"nl\n\?\001"`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			check.Equal(t, cString(tt.in), tt.want)
		})
	}
}
