package vm_test

import (
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/vm"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// seed000 builds by hand what the VM code generator makes of the Relax VM storage-scope example's
// main: storage in scope "global", a tensor at offset 0, add(x, x, alloc).
func seed000(t testing.TB, scope string) *vm.Executable {
	t.Helper()
	b := vm.NewBuilder()
	f := b.Function("main", vm.TensorParam("x", ndarray.Float32, vm.Static(2), vm.Static(2)))
	x := f.Param(0)
	storage := f.Call(vm.BuiltinAllocStorage, b.Shape(2*2), vm.Imm(0), b.DType(ndarray.Float32), b.String(scope))
	alloc := f.Call(vm.BuiltinAllocTensor, storage, vm.Imm(0), b.Shape(2, 2), b.DType(ndarray.Float32))
	f.CallTo(vm.NoReg, "add", x, x, alloc)
	f.Ret(alloc)
	exe, err := b.Build()
	check.NoError(t, err)
	return exe
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		check.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	check.NoError(t, err, "run go test -update to create it")
	check.Equal(t, got, string(want))
}

func TestSeed000AllocStorageWithScopeGlobal(t *testing.T) {
	mod := kernels(t)
	exe := seed000(t, "global")
	checkGolden(t, "seed000", exe.String())
	for _, cfg := range memCfgs {
		t.Run(cfg, func(t *testing.T) {
			arg0 := make([]float32, 4)
			for i := range arg0 {
				arg0[i] = rand.Float32()
			}
			m, err := vm.New(exe, mod, devices.CPUDevice, vm.Options{MemoryCfg: cfg})
			check.NoError(t, err)
			defer m.Close()
			check.NoError(t, m.SetInput("main", arr(f32(t, arg0, 2, 2))))
			check.NoError(t, m.InvokeStateful("main"))
			out, err := m.GetOutputs("main")
			check.NoError(t, err)
			got := toF32(t, out)
			for i := range arg0 {
				check.Equal(t, got[i], arg0[i]+arg0[i], "element", i)
			}
			a, _ := out.Array()
			check.Equal(t, a.Shape(), ndarray.Shape{2, 2})
			check.Equal(t, a.Scope(), "global")

			// Direct call with parameters gives the same, and the first
			// output stays intact (it belongs to the caller now).
			direct, err := m.Invoke("main", arr(f32(t, []float32{1, 2, 3, 4}, 2, 2)))
			check.NoError(t, err)
			check.Equal(t, toF32(t, direct), []float32{2, 4, 6, 8})
			check.Equal(t, toF32(t, out), got)
		})
	}
}

func TestStatefulErrors(t *testing.T) {
	m, err := vm.New(seed000(t, "global"), kernels(t), devices.CPUDevice, vm.Options{})
	check.NoError(t, err)
	err = m.InvokeStateful("main")
	check.ErrorIs(t, err, vm.ErrNotReady)
	check.Error(t, err, "SetInput")
	_, err = m.GetOutputs("main")
	check.ErrorIs(t, err, vm.ErrNotReady)
	_, err = m.Invoke("nope")
	check.ErrorIs(t, err, vm.ErrNoFunction)
	check.Error(t, err, `"nope"`, "[main]")
	err = m.SetInput("main", arr(f32(t, []float32{1, 2, 3}, 3)))
	check.Error(t, err, "set_input", `parameter 0 "x"`, "shape (3,), want (2, 2)")
	check.NoError(t, m.Close())
	_, err = m.Invoke("main", arr(f32(t, []float32{1, 2, 3, 4}, 2, 2)))
	check.Error(t, err, "closed")
}

func TestUnsupportedScope(t *testing.T) {
	for _, cfg := range memCfgs {
		t.Run(cfg, func(t *testing.T) {
			m, err := vm.New(seed000(t, "shared"), kernels(t), devices.CPUDevice, vm.Options{MemoryCfg: cfg})
			check.NoError(t, err)
			_, err = m.Invoke("main", arr(f32(t, []float32{1, 2, 3, 4}, 2, 2)))
			check.ErrorIs(t, err, devices.ErrBadScope)
			check.Error(t, err, "main: instruction 0", vm.BuiltinAllocStorage, `scope "shared"`, "cpu has")
			check.Equal(t, m.Stats().LiveBytes, int64(0))
		})
	}
}

func TestAllocTensorPastEnd(t *testing.T) {
	b := vm.NewBuilder()
	f := b.Function("main")
	st := f.Call(vm.BuiltinAllocStorage, vm.Imm(40), vm.Imm(0), b.DType(ndarray.Uint8), b.String("global"))
	ok := f.Call(vm.BuiltinAllocTensor, st, vm.Imm(8), b.Shape(8), b.DType(ndarray.Float32))
	bad := f.Call(vm.BuiltinAllocTensor, st, vm.Imm(16), b.Shape(8), b.DType(ndarray.Float32))
	f.Ret(f.Call(vm.BuiltinMakeTuple, ok, bad))
	exe, err := b.Build()
	check.NoError(t, err)
	for _, cfg := range memCfgs {
		t.Run(cfg, func(t *testing.T) {
			m, err := vm.New(exe, nil, devices.CPUDevice, vm.Options{MemoryCfg: cfg})
			check.NoError(t, err)
			_, err = m.Invoke("main")
			check.Error(t, err, "main: instruction 2", vm.BuiltinAllocTensor,
				"alloc_tensor: offset 16 + 32 bytes runs past storage of 40 bytes")
			check.Equal(t, m.Stats().LiveBytes-m.Stats().PooledBytes, int64(0))
		})
	}
}

func TestKernelErrors(t *testing.T) {
	mod := kernels(t)
	b := vm.NewBuilder()
	f := b.Function("main")
	f.CallTo(vm.NoReg, "fail")
	f.Ret(f.Call(vm.BuiltinNullValue))
	g := b.Function("wrong_shape", vm.TensorParam("x", ndarray.Float32, vm.Sym("n")))
	g.CallTo(vm.NoReg, "add", g.Param(0), g.Param(0), g.Param(0))
	g.Ret(g.Param(0))
	exe, err := b.Build()
	check.NoError(t, err)
	m, err := vm.New(exe, mod, devices.CPUDevice, vm.Options{})
	check.NoError(t, err)
	_, err = m.Invoke("main")
	check.Error(t, err, `vm: main: instruction 0 (call "fail")`, "this kernel always fails")
	_, err = m.Invoke("wrong_shape", arr(f32(t, []float32{1, 2, 3}, 3)))
	check.Error(t, err, `wrong_shape: instruction 0 (call "add")`, `"arg0"`)

	// A kernel the module lacks is reported when the VM is made.
	b = vm.NewBuilder()
	f = b.Function("main")
	f.CallTo(vm.NoReg, "no_such_kernel")
	f.Ret(f.Call(vm.BuiltinNullValue))
	exe, err = b.Build()
	check.NoError(t, err)
	check.Equal(t, exe.Kernels(), []string{"no_such_kernel"})
	_, err = vm.New(exe, mod, devices.CPUDevice, vm.Options{})
	check.Error(t, err, `function "main" instruction 0`, `kernel "no_such_kernel"`)
	_, err = vm.New(exe, mod, devices.CPUDevice, vm.Options{MemoryCfg: "fancy"})
	check.Error(t, err, `unknown memory config "fancy"`)
	var nf error = err
	check.True(t, !errors.Is(nf, vm.ErrInvalid))
}
