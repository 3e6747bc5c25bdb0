package vm_test

import (
	"testing"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/vm"
)

// TestProfile: a profiling VM counts every kernel call by name, sums their
// time and its median call, sorts the most expensive first and forgets on ResetProfile; one not
// made to profile reports nothing. Tracing records each call's start and
// duration.
func TestProfile(t *testing.T) {
	mod := kernels(t)
	b := vm.NewBuilder()
	f32t := b.DType(ndarray.Float32)
	main := b.Function("main", vm.TensorParam("x", ndarray.Float32, vm.Sym("n")))
	shape := main.Call(vm.BuiltinShapeOf, main.Param(0))
	st := main.Call(vm.BuiltinAllocStorage, shape, vm.Imm(0), f32t)
	out := main.Call(vm.BuiltinAllocTensor, st, vm.Imm(0), shape, f32t)
	main.CallTo(vm.NoReg, "vadd", main.Param(0), main.Param(0), out)
	main.CallTo(vm.NoReg, "vadd", out, out, out)
	main.Ret(out)
	exe, err := b.Build()
	check.NoError(t, err)

	m, err := vm.New(exe, mod, devices.CPUDevice, vm.Options{Profile: true})
	check.NoError(t, err)
	defer m.Close()
	x := arr(f32(t, make([]float32, 1<<16), 1<<16))
	for range 3 {
		_, err := m.Invoke("main", x)
		check.NoError(t, err)
	}
	p := m.Profile()
	check.Equal(t, len(p), 1)
	check.Equal(t, p[0].Name, "vadd")
	check.Equal(t, p[0].Calls, int64(6))
	check.True(t, p[0].Total > 0)
	check.True(t, p[0].Median > 0 && p[0].Median <= p[0].Total)
	m.ResetProfile()
	check.Equal(t, len(m.Profile()), 0)

	// Traced, each call is recorded in order, one after the other; not
	// traced, none.
	check.Equal(t, len(m.Events()), 0, "events recorded without tracing")
	m.Trace(true)
	_, err = m.Invoke("main", x)
	check.NoError(t, err)
	m.Trace(false)
	_, err = m.Invoke("main", x)
	check.NoError(t, err)
	ev := m.Events()
	check.Equal(t, len(ev), 2)
	for _, e := range ev {
		check.Equal(t, e.Name, "vadd")
		check.True(t, !e.Start.IsZero() && e.Dur >= 0, e)
	}
	check.True(t, !ev[1].Start.Before(ev[0].Start.Add(ev[0].Dur)), "the second call began before the first ended:", ev)
	check.Equal(t, len(m.Events()), 0, "Events forgets what it returned")

	plain, err := vm.New(exe, mod, devices.CPUDevice, vm.Options{})
	check.NoError(t, err)
	defer plain.Close()
	_, err = plain.Invoke("main", x)
	check.NoError(t, err)
	check.True(t, plain.Profile() == nil)
	plain.Trace(true)
	_, err = plain.Invoke("main", x)
	check.NoError(t, err)
	check.True(t, plain.Events() == nil, "a VM not made to profile traced")
}
