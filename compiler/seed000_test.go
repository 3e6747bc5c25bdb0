package compiler_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/vm"
)

// buildVM builds a graph-level module from TVMScript text and makes a VM
// for it with the given allocator.
func buildVM(t *testing.T, src, memoryCfg string) (*vm.VM, error) {
	t.Helper()
	mod, err := script.Parse("seed000.py", src)
	check.NoError(t, err)
	a, err := compiler.Build(context.Background(), mod, compiler.Target{Kind: "cpu"}, compiler.BuildOptions{NoCache: true})
	check.NoError(t, err)
	_, hasVM := a.Files[artifact.VMExec]
	check.True(t, hasVM, "artifact lacks", artifact.VMExec, a.Names())
	kernels, err := cpu.LoadArtifact(a, t.TempDir())
	check.NoError(t, err)
	exe, err := vm.Unmarshal(a.Files[artifact.VMExec])
	check.NoError(t, err)
	return vm.New(exe, kernels, devices.CPUDevice, vm.Options{MemoryCfg: memoryCfg})
}

// TestSeed000 runs the Relax VM storage-scope example as written: a storage allocated with scope
// "global", a tensor at offset 0 in it, the add kernel called in
// destination-passing style, under the naive allocator, through
// set_input / invoke_stateful / get_outputs; the result is arg0 + arg0.
func TestSeed000(t *testing.T) {
	src, err := os.ReadFile("script/testdata/000_module.py")
	check.NoError(t, err)
	for _, cfg := range []string{vm.MemoryNaive, vm.MemoryPooled} {
		t.Run(cfg, func(t *testing.T) {
			m, err := buildVM(t, string(src), cfg)
			check.NoError(t, err)
			arg0 := []float32{0.25, 0.5, -1, 3}
			x, err := ndarray.FromSlice(arg0, ndarray.Shape{2, 2})
			check.NoError(t, err)
			check.NoError(t, m.SetInput("main", packedfunc.Array(x)))
			check.NoError(t, m.InvokeStateful("main"))
			out, err := m.GetOutputs("main")
			check.NoError(t, err)
			oa, err := out.Array()
			check.NoError(t, err)
			got, err := ndarray.ToSlice[float32](oa)
			check.NoError(t, err)
			for i := range arg0 {
				check.Equal(t, got[i], arg0[i]+arg0[i])
			}
			// A wrong shape names the parameter and the shapes.
			bad, err := ndarray.FromSlice([]float32{1, 2, 3}, ndarray.Shape{3})
			check.NoError(t, err)
			_, err = m.Invoke("main", packedfunc.Array(bad))
			check.Error(t, err, `"x"`, "(3,)")
		})
	}
}

func TestSeed000BadStorage(t *testing.T) {
	src, err := os.ReadFile("script/testdata/000_module.py")
	check.NoError(t, err)
	x, err := ndarray.FromSlice([]float32{1, 2, 3, 4}, ndarray.Shape{2, 2})
	check.NoError(t, err)

	// A storage scope the CPU does not have.
	texture := strings.Replace(string(src), `dtype="float32", storage_scope="global"`, `dtype="float32", storage_scope="texture"`, 1)
	m, err := buildVM(t, texture, vm.MemoryNaive)
	check.NoError(t, err)
	_, err = m.Invoke("main", packedfunc.Array(x))
	check.ErrorIs(t, err, devices.ErrBadScope)
	check.Error(t, err, "texture")

	// A tensor placed past the end of its storage.
	past := strings.Replace(string(src), "offset=0", "offset=8", 1)
	m, err = buildVM(t, past, vm.MemoryNaive)
	check.NoError(t, err)
	_, err = m.Invoke("main", packedfunc.Array(x))
	check.Error(t, err, "alloc_tensor", "runs past storage")
}

const graphModule = `
@I.ir_module
class Module:
    @T.prim_func
    def add(A: T.Buffer((2, 2), "float32"), B: T.Buffer((2, 2), "float32"), C: T.Buffer((2, 2), "float32")):
        for i, j in T.grid(2, 2):
            with T.block("C"):
                vi, vj = T.axis.remap("SS", [i, j])
                T.reads(A[vi, vj], B[vi, vj])
                T.writes(C[vi, vj])
                C[vi, vj] = A[vi, vj] + B[vi, vj]

    @R.function
    def twice(a: R.Tensor((2, 2), dtype="float32")) -> R.Tensor((2, 2), dtype="float32"):
        cls = Module
        with R.dataflow():
            gv = R.call_tir(cls.add, (a, a), out_sinfo=R.Tensor((2, 2), dtype="float32"))
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor((2, 2), dtype="float32"), y: R.Tensor((2, 2), dtype="float32")) -> R.Tensor((2, 2), dtype="float32"):
        cls = Module
        with R.dataflow():
            lv = R.call_tir(cls.add, (x, y), out_sinfo=R.Tensor((2, 2), dtype="float32"))
            t = (lv, x)
            lv1 = t[0]
            gv = cls.twice(lv1)
            R.output(gv)
        return gv
`

// TestGraphCallTIR runs call_tir, tuples and a call between graph
// functions through the VM code generator.
func TestGraphCallTIR(t *testing.T) {
	m, err := buildVM(t, graphModule, vm.MemoryPooled)
	check.NoError(t, err)
	x, err := ndarray.FromSlice([]float32{1, 2, 3, 4}, ndarray.Shape{2, 2})
	check.NoError(t, err)
	y, err := ndarray.FromSlice([]float32{10, 20, 30, 40}, ndarray.Shape{2, 2})
	check.NoError(t, err)
	for range 3 { // repeated invocations reuse pooled storage
		out, err := m.Invoke("main", packedfunc.Array(x), packedfunc.Array(y))
		check.NoError(t, err)
		oa, err := out.Array()
		check.NoError(t, err)
		got, err := ndarray.ToSlice[float32](oa)
		check.NoError(t, err)
		check.Equal(t, got, []float32{22, 44, 66, 88})
	}
}

func TestGraphNotLegalized(t *testing.T) {
	src := strings.Replace(graphModule, `gv = R.call_tir(cls.add, (a, a), out_sinfo=R.Tensor((2, 2), dtype="float32"))`, `gv = R.add(a, a)`, 1)
	mod, err := script.Parse("m.py", src)
	check.NoError(t, err)
	_, err = compiler.Build(context.Background(), mod, compiler.Target{Kind: "cpu"}, compiler.BuildOptions{NoCache: true, Pipeline: "none"})
	check.Error(t, err, `function "twice"`, `binding "gv"`, "relax.add has not been legalized")

	// With the default pipeline the add is legalized and the module runs.
	m, err := buildVM(t, src, vm.MemoryPooled)
	check.NoError(t, err)
	x, err := ndarray.FromSlice([]float32{1, 2, 3, 4}, ndarray.Shape{2, 2})
	check.NoError(t, err)
	out, err := m.Invoke("main", packedfunc.Array(x), packedfunc.Array(x))
	check.NoError(t, err)
	oa, err := out.Array()
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](oa)
	check.NoError(t, err)
	check.Equal(t, got, []float32{4, 8, 12, 16})
}

// TestLibcNamedKernel builds kernels named like C library functions (TVM
// names legalized functions exp, tanh…): they are exported under another
// symbol and still found by name.
func TestLibcNamedKernel(t *testing.T) {
	src := strings.ReplaceAll(graphModule, "add", "tanh")
	m, err := buildVM(t, src, vm.MemoryPooled)
	check.NoError(t, err)
	x, err := ndarray.FromSlice([]float32{1, 2, 3, 4}, ndarray.Shape{2, 2})
	check.NoError(t, err)
	out, err := m.Invoke("main", packedfunc.Array(x), packedfunc.Array(x))
	check.NoError(t, err)
	oa, err := out.Array()
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](oa)
	check.NoError(t, err)
	check.Equal(t, got, []float32{4, 8, 12, 16})
}
