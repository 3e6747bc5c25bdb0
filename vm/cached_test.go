package vm_test

import (
	"testing"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/vm"
)

// cachedExe is main(x, w) = x + transform(w) with transform(w) = 2·w
// called through vm.builtin.call_cached; when direct is set main returns
// the transformed weight itself.
func cachedExe(t *testing.T, direct bool) *vm.Executable {
	t.Helper()
	b := vm.NewBuilder()
	shape, dt := b.Shape(4), b.DType(ndarray.Float32)
	tp := b.Function("transform", vm.TensorParam("w", ndarray.Float32, vm.Static(4)))
	st := tp.Call(vm.BuiltinAllocStorage, shape, vm.Imm(0), dt)
	out := tp.Call(vm.BuiltinAllocTensor, st, vm.Imm(0), shape, dt)
	tp.CallTo(vm.NoReg, "test.vm.double", tp.Param(0), out)
	tp.Ret(out)

	f := b.Function("main", vm.TensorParam("x", ndarray.Float32, vm.Static(4)), vm.TensorParam("w", ndarray.Float32, vm.Static(4)))
	w2 := f.Call(vm.BuiltinCallCached, b.String("transform"), f.Param(1))
	if direct {
		f.Ret(w2)
		// fill(x) = 2·x in a new tensor of the same size.
		g := b.Function("fill", vm.TensorParam("x", ndarray.Float32, vm.Static(4)))
		st := g.Call(vm.BuiltinAllocStorage, shape, vm.Imm(0), dt)
		out := g.Call(vm.BuiltinAllocTensor, st, vm.Imm(0), shape, dt)
		g.CallTo(vm.NoReg, "test.vm.double", g.Param(0), out)
		g.Ret(out)
	} else {
		st := f.Call(vm.BuiltinAllocStorage, shape, vm.Imm(0), dt)
		y := f.Call(vm.BuiltinAllocTensor, st, vm.Imm(0), shape, dt)
		f.CallTo(vm.NoReg, "test.vm.add4", f.Param(0), w2, y)
		f.Ret(y)
	}
	exe, err := b.Build()
	check.NoError(t, err)
	return exe
}

func TestCallCached(t *testing.T) {
	calls := 0
	register(t, "test.vm.double", func(w, out *ndarray.NDArray) error {
		calls++
		ws, _ := ndarray.ToSlice[float32](w)
		vs := make([]float32, len(ws))
		for i, v := range ws {
			vs[i] = 2 * v
		}
		return out.CopyFrom(f32(t, vs, 4))
	})
	register(t, "test.vm.add4", func(x, w, out *ndarray.NDArray) error {
		xs, _ := ndarray.ToSlice[float32](x)
		ws, _ := ndarray.ToSlice[float32](w)
		vs := make([]float32, len(xs))
		for i := range xs {
			vs[i] = xs[i] + ws[i]
		}
		return out.CopyFrom(f32(t, vs, 4))
	})
	x := arr(f32(t, []float32{1, 2, 3, 4}, 4))
	w := f32(t, []float32{10, 20, 30, 40}, 4)
	w2 := f32(t, []float32{1, 1, 1, 1}, 4)

	for _, cfg := range memCfgs {
		t.Run(cfg, func(t *testing.T) {
			m, err := vm.New(cachedExe(t, false), nil, devices.CPUDevice, vm.Options{MemoryCfg: cfg})
			check.NoError(t, err)
			calls = 0
			for range 3 {
				r, err := m.Invoke("main", x, arr(w))
				check.NoError(t, err)
				check.Equal(t, toF32(t, r), []float32{21, 42, 63, 84})
				m.Recycle(r)
			}
			check.Equal(t, calls, 1, "transform runs once for the same weights")

			r, err := m.Invoke("main", x, arr(w2))
			check.NoError(t, err)
			check.Equal(t, toF32(t, r), []float32{3, 4, 5, 6})
			check.Equal(t, calls, 2, "other weights: recomputed")

			// Same array, new contents: stale until ClearCache (the contract).
			check.NoError(t, w2.CopyFrom(f32(t, []float32{2, 2, 2, 2}, 4)))
			r, err = m.Invoke("main", x, arr(w2))
			check.NoError(t, err)
			check.Equal(t, toF32(t, r), []float32{3, 4, 5, 6})
			m.ClearCache()
			r, err = m.Invoke("main", x, arr(w2))
			check.NoError(t, err)
			check.Equal(t, toF32(t, r), []float32{5, 6, 7, 8})
			check.Equal(t, calls, 3)
			check.NoError(t, w2.CopyFrom(f32(t, []float32{1, 1, 1, 1}, 4)))
		})
	}

	t.Run("no cache", func(t *testing.T) {
		m, err := vm.New(cachedExe(t, false), nil, devices.CPUDevice, vm.Options{NoCallCache: true})
		check.NoError(t, err)
		calls = 0
		for range 3 {
			r, err := m.Invoke("main", x, arr(w))
			check.NoError(t, err)
			check.Equal(t, toF32(t, r), []float32{21, 42, 63, 84})
		}
		check.Equal(t, calls, 3)
	})

	t.Run("recycled result stays pinned", func(t *testing.T) {
		m, err := vm.New(cachedExe(t, true), nil, devices.CPUDevice, vm.Options{MemoryCfg: vm.MemoryPooled})
		check.NoError(t, err)
		calls = 0
		r1, err := m.Invoke("main", x, arr(w))
		check.NoError(t, err)
		m.Recycle(r1) // must not hand the cached tensor to the pool
		r2, err := m.Invoke("fill", x)
		check.NoError(t, err)
		check.Equal(t, toF32(t, r2), []float32{2, 4, 6, 8})
		r3, err := m.Invoke("main", x, arr(w))
		check.NoError(t, err)
		check.Equal(t, toF32(t, r3), []float32{20, 40, 60, 80})
		check.Equal(t, calls, 2)
	})

	t.Run("unknown callee", func(t *testing.T) {
		b := vm.NewBuilder()
		f := b.Function("main", vm.AnyParam("w"))
		f.Ret(f.Call(vm.BuiltinCallCached, b.String("nope"), f.Param(0)))
		exe, err := b.Build()
		check.NoError(t, err)
		m, err := vm.New(exe, nil, devices.CPUDevice, vm.Options{})
		check.NoError(t, err)
		_, err = m.Invoke("main", packedfunc.Int(1))
		check.Error(t, err, "call_cached", `"nope"`)
		check.ErrorIs(t, err, vm.ErrNoFunction)
	})

	t.Run("not arrays: not cached", func(t *testing.T) {
		register(t, "test.vm.inc", func(n int64) int64 { calls++; return n + 1 })
		b := vm.NewBuilder()
		g := b.Function("g", vm.KindParam("n", vm.ParamInt))
		g.Ret(g.Call("test.vm.inc", g.Param(0)))
		f := b.Function("main", vm.KindParam("n", vm.ParamInt))
		f.Ret(f.Call(vm.BuiltinCallCached, b.String("g"), f.Param(0)))
		exe, err := b.Build()
		check.NoError(t, err)
		m, err := vm.New(exe, nil, devices.CPUDevice, vm.Options{})
		check.NoError(t, err)
		calls = 0
		for n := range int64(2) {
			r, err := m.Invoke("main", packedfunc.Int(n))
			check.NoError(t, err)
			p, err := r.Packed()
			check.NoError(t, err)
			got, _ := p.AsInt()
			check.Equal(t, got, n+1)
		}
		check.Equal(t, calls, 2)
	})
}
