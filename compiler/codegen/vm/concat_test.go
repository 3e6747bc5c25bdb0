package vm

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/transform"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	rt "github.com/kiln-ml/kiln/vm"
)

// interpKernels runs a module's PrimFuncs with the reference
// interpreter, as the VM's kernels.
type interpKernels struct {
	packedfunc.ImportList
	mod *ir.IRModule
}

func (k *interpKernels) Type() string { return "interp" }

func (k *interpKernels) GetFunction(name string) (*packedfunc.Func, error) {
	f := k.mod.PrimFunc(name)
	if f == nil {
		return k.Lookup(name)
	}
	return packedfunc.New(name, func(args []packedfunc.Value) (packedfunc.Value, error) {
		in := make([]any, len(args))
		for i, a := range args {
			in[i] = a
		}
		return packedfunc.Value{}, interp.Run(f, in...)
	}), nil
}

func (k *interpKernels) Functions() []string { return nil }

func (k *interpKernels) Close() error { return nil }

// TestConcatInPlaceVM runs, in the VM, a module whose concatenation of
// two channel blocks (and of two blocks of rows, the output of the first reused
// for the second) is written in place, by ConcatInPlace and by
// StaticPlanBlockMemory, and compares with the module whose call_tirs
// allocate their own outputs.
func TestConcatInPlaceVM(t *testing.T) {
	mod, err := script.Parse("concat.py", `# from tvm.script import ir as I
# from tvm.script import relax as R
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 4, 4, 4), dtype="float32"), z: R.Tensor((1, 2, 4, 4), dtype="float32")) -> R.Tensor((1, 1, 8, 4), dtype="float32"):
        with R.dataflow():
            a = R.nn.relu(x)
            b = R.exp(z)
            c = R.concat((a, b), axis=1)
            s = R.sum(c, axis=[1], keepdims=True)
            p = R.nn.relu(s)
            q = R.exp(s)
            d = R.concat((p, q), axis=2)
            e = R.add(d, d)
            R.output(e)
        return e
`)
	check.NoError(t, err)
	legal, err := transform.Run(mod, []string{"LegalizeOps"})
	check.NoError(t, err)
	xs := make([]float32, 64)
	zs := make([]float32, 32)
	for i := range xs {
		xs[i] = float32(i%7)*0.25 - 0.8
	}
	for i := range zs {
		zs[i] = float32(i%5)*0.125 - 0.3
	}
	x, err := ndarray.FromSlice(xs, ndarray.Shape{1, 4, 4, 4})
	check.NoError(t, err)
	z, err := ndarray.FromSlice(zs, ndarray.Shape{1, 2, 4, 4})
	check.NoError(t, err)
	run := func(m *ir.IRModule, cfg string) []float32 {
		t.Helper()
		exe, err := Generate(m)
		check.NoError(t, err)
		machine, err := rt.New(exe, &interpKernels{mod: m}, devices.CPUDevice, rt.Options{MemoryCfg: cfg})
		check.NoError(t, err)
		defer machine.Close()
		var got []float32
		for range 2 { // the second call gets the pooled storage back
			out, err := machine.Invoke("main", packedfunc.Array(x), packedfunc.Array(z))
			check.NoError(t, err)
			a, err := out.Array()
			check.NoError(t, err)
			got, err = ndarray.ToSlice[float32](a)
			check.NoError(t, err)
		}
		return got
	}
	want := run(legal, rt.MemoryPooled)
	for _, pass := range []string{"ConcatInPlace", "StaticPlanBlockMemory"} {
		planned, err := transform.Run(legal, []string{pass})
		check.NoError(t, err)
		exe, err := Generate(planned)
		check.NoError(t, err)
		check.True(t, !strings.Contains(exe.String(), "concatenate"), pass, exe.String())
		for _, cfg := range []string{rt.MemoryNaive, rt.MemoryPooled} {
			check.Equal(t, run(planned, cfg), want, pass, cfg)
		}
	}
}
