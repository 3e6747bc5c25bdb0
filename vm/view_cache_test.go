package vm_test

import (
	"testing"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/vm"
)

// TestPooledViewsReused checks that a pooled storage block hands the same
// tensor views back on the next invocation for as many views as a block
// that memory planning shares among concatenations written in place
// holds (twelve for squeezenet1_1), instead of making new ones.
func TestPooledViewsReused(t *testing.T) {
	const views = 12
	var seen []*ndarray.NDArray
	register(t, "test.vm.record", func(a *ndarray.NDArray) error {
		seen = append(seen, a)
		return nil
	})
	b := vm.NewBuilder()
	dt := b.DType(ndarray.Float32)
	f := b.Function("main", vm.TensorParam("x", ndarray.Float32, vm.Static(4)))
	st := f.Call(vm.BuiltinAllocStorage, b.Shape(16*views), vm.Imm(0), dt)
	for i := range views {
		v := f.Call(vm.BuiltinAllocTensor, st, vm.Imm(int64(64*i)), b.Shape(1, 16), dt)
		f.CallTo(vm.NoReg, "test.vm.record", v)
	}
	f.Ret(f.Param(0))
	exe, err := b.Build()
	check.NoError(t, err)
	m, err := vm.New(exe, nil, devices.CPUDevice, vm.Options{MemoryCfg: vm.MemoryPooled})
	check.NoError(t, err)
	defer m.Close()
	x := arr(f32(t, []float32{1, 2, 3, 4}, 4))
	for range 2 {
		_, err := m.Invoke("main", x)
		check.NoError(t, err)
	}
	check.Equal(t, len(seen), 2*views)
	for i := range views {
		check.True(t, seen[i] == seen[views+i], "view", i, "made again")
	}
}
