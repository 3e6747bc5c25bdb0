package vm_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/vm"
)

var kernelLib struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if kernelLib.dir != "" {
		os.RemoveAll(kernelLib.dir)
	}
	os.Exit(code)
}

// kernels compiles testdata/kernels.c once per test binary and loads it.
func kernels(t testing.TB) *cpu.Module {
	t.Helper()
	kernelLib.once.Do(func() {
		cc, err := exec.LookPath("cc")
		if err != nil {
			kernelLib.err = err
			return
		}
		dir, err := os.MkdirTemp("", "kiln-vm-test-")
		if err != nil {
			kernelLib.err = err
			return
		}
		kernelLib.dir = dir
		if err := os.WriteFile(filepath.Join(dir, abi.HeaderName), []byte(abi.Header), 0o644); err != nil {
			kernelLib.err = err
			return
		}
		src, _ := filepath.Abs(filepath.Join("testdata", "kernels.c"))
		out := filepath.Join(dir, "kernels.so")
		cmd := exec.Command(cc, "-O2", "-shared", "-fPIC", "-I", dir, "-o", out, src)
		if b, err := cmd.CombinedOutput(); err != nil {
			kernelLib.err = fmt.Errorf("cc: %v\n%s", err, b)
			return
		}
		kernelLib.path = out
	})
	if kernelLib.err != nil {
		if _, err := exec.LookPath("cc"); err != nil {
			t.Skip("no C compiler (cc) on PATH")
		}
		t.Fatal(kernelLib.err)
	}
	mod, err := cpu.LoadModule(kernelLib.path)
	check.NoError(t, err)
	return mod
}

func f32(t testing.TB, data []float32, shape ...int64) *ndarray.NDArray {
	t.Helper()
	a, err := ndarray.FromSlice(data, ndarray.Shape(shape))
	check.NoError(t, err)
	return a
}

func toF32(t testing.TB, v vm.Value) []float32 {
	t.Helper()
	a, err := v.Array()
	check.NoError(t, err)
	out, err := ndarray.ToSlice[float32](a)
	check.NoError(t, err)
	return out
}

func arr(a *ndarray.NDArray) packedfunc.Value { return packedfunc.Array(a) }

var memCfgs = []string{vm.MemoryNaive, vm.MemoryPooled}
