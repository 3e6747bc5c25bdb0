package vm_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/vm"
)

// mlpExecutable is what the VM code generator makes of the IRModule tutorial's MLP
// after the zero pipeline and static memory planning: two transposes, a
// fused matmul+add+relu and a fused matmul+add; storage 0 holds the first
// transpose and, once that is dead, the second.
func mlpExecutable(t testing.TB, in, hidden, out int64) *vm.Executable {
	t.Helper()
	b := vm.NewBuilder()
	f32t := b.DType(ndarray.Float32)
	global := b.String("global")
	f := b.Function("main",
		vm.TensorParam("x", ndarray.Float32, vm.Static(1), vm.Static(in)),
		vm.TensorParam("fc1_weight", ndarray.Float32, vm.Static(hidden), vm.Static(in)),
		vm.TensorParam("fc1_bias", ndarray.Float32, vm.Static(hidden)),
		vm.TensorParam("fc2_weight", ndarray.Float32, vm.Static(out), vm.Static(hidden)),
		vm.TensorParam("fc2_bias", ndarray.Float32, vm.Static(out)),
	)
	x, w1, b1, w2, b2 := f.Param(0), f.Param(1), f.Param(2), f.Param(3), f.Param(4)
	st0 := f.Call(vm.BuiltinAllocStorage, b.Shape(in*hidden), vm.Imm(0), f32t, global)
	lv := f.Call(vm.BuiltinAllocTensor, st0, vm.Imm(0), b.Shape(in, hidden), f32t)
	f.CallTo(vm.NoReg, "transpose", w1, lv)
	st1 := f.Call(vm.BuiltinAllocStorage, b.Shape(hidden), vm.Imm(0), f32t, global)
	lv3 := f.Call(vm.BuiltinAllocTensor, st1, vm.Imm(0), b.Shape(1, hidden), f32t)
	f.CallTo(vm.NoReg, "fused_matmul_add_relu", x, lv, b1, lv3)
	lv4 := f.Call(vm.BuiltinAllocTensor, st0, vm.Imm(0), b.Shape(hidden, out), f32t)
	f.CallTo(vm.NoReg, "transpose", w2, lv4)
	st2 := f.Call(vm.BuiltinAllocStorage, b.Shape(out), vm.Imm(0), f32t, global)
	gv := f.Call(vm.BuiltinAllocTensor, st2, vm.Imm(0), b.Shape(1, out), f32t)
	f.CallTo(vm.NoReg, "fused_matmul1_add1", lv3, lv4, b2, gv)
	f.Ret(gv)
	exe, err := b.Build()
	check.NoError(t, err)
	return exe
}

type mlpParams struct {
	x, w1, b1, w2, b2 []float32
	in, hidden, out   int64
}

func newMLPParams(in, hidden, out int64) *mlpParams {
	r := rand.New(rand.NewPCG(1, 2))
	fill := func(n int64) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = r.Float32()*2 - 1
		}
		return s
	}
	return &mlpParams{x: fill(in), w1: fill(hidden * in), b1: fill(hidden), w2: fill(out * hidden), b2: fill(out), in: in, hidden: hidden, out: out}
}

func (p *mlpParams) args(t testing.TB) []packedfunc.Value {
	return []packedfunc.Value{
		arr(f32(t, p.x, 1, p.in)), arr(f32(t, p.w1, p.hidden, p.in)), arr(f32(t, p.b1, p.hidden)),
		arr(f32(t, p.w2, p.out, p.hidden)), arr(f32(t, p.b2, p.out)),
	}
}

// reference computes the MLP in float64: (relu(x W1^T + b1)) W2^T + b2.
func (p *mlpParams) reference() []float64 {
	h := make([]float64, p.hidden)
	for j := range p.hidden {
		s := float64(p.b1[j])
		for k := range p.in {
			s += float64(p.x[k]) * float64(p.w1[j*p.in+k])
		}
		h[j] = math.Max(s, 0)
	}
	o := make([]float64, p.out)
	for j := range p.out {
		s := float64(p.b2[j])
		for k := range p.hidden {
			s += h[k] * float64(p.w2[j*p.hidden+k])
		}
		o[j] = s
	}
	return o
}

func TestMLP(t *testing.T) {
	mod := kernels(t)
	exe := mlpExecutable(t, 784, 256, 10)
	checkGolden(t, "mlp", exe.String())
	p := newMLPParams(784, 256, 10)
	want := p.reference()
	for _, cfg := range memCfgs {
		t.Run(cfg, func(t *testing.T) {
			m, err := vm.New(exe, mod, devices.CPUDevice, vm.Options{MemoryCfg: cfg})
			check.NoError(t, err)
			defer m.Close()
			args := p.args(t)
			for range 3 {
				r, err := m.Invoke("main", args...)
				check.NoError(t, err)
				got := toF32(t, r)
				check.Equal(t, len(got), len(want))
				for i := range got {
					check.True(t, math.Abs(float64(got[i])-want[i]) <= 1e-4*math.Max(1, math.Abs(want[i])), "element", i, got[i], want[i])
				}
			}
		})
	}
}

// BenchmarkThreeKernels measures the VM's per-invocation cost around
// three tiny kernels (8 floats each): "direct" calls the kernels from Go
// with preallocated arrays (the floor), "dps" runs them through the VM
// with the output passed in (only pooled intermediates), and the memory
// configs run threeKernels, which also allocates the output each time.
func BenchmarkThreeKernels(b *testing.B) {
	mod := kernels(b)
	x := arr(f32(b, []float32{-1, 2, -3, 4, 5, -6, 7, 8}, 8))
	b.Run("direct", func(b *testing.B) {
		tmp := make([]packedfunc.Value, 3)
		for i := range tmp {
			tmp[i] = arr(f32(b, make([]float32, 8), 8))
		}
		fns := make([]*packedfunc.Func, 3)
		for i, n := range []string{"vadd", "vrelu", "vmul"} {
			f, err := mod.GetFunction(n)
			check.NoError(b, err)
			fns[i] = f
		}
		a1 := []packedfunc.Value{x, x, tmp[0]}
		a2 := []packedfunc.Value{tmp[0], tmp[1]}
		a3 := []packedfunc.Value{tmp[1], tmp[0], tmp[2]}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := fns[0].Call(a1...); err != nil {
				b.Fatal(err)
			}
			if _, err := fns[1].Call(a2...); err != nil {
				b.Fatal(err)
			}
			if _, err := fns[2].Call(a3...); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("dps-pooled", func(b *testing.B) {
		exe := threeKernelsDPS(b)
		m, err := vm.New(exe, mod, devices.CPUDevice, vm.Options{MemoryCfg: vm.MemoryPooled})
		check.NoError(b, err)
		out := arr(f32(b, make([]float32, 8), 8))
		args := []packedfunc.Value{x, out}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := m.Invoke("main", args...); err != nil {
				b.Fatal(err)
			}
		}
	})
	exe := threeKernels(b)
	for _, cfg := range memCfgs {
		for _, recycle := range []bool{false, true} {
			name := cfg
			if recycle {
				name += "-recycle"
			}
			b.Run(name, func(b *testing.B) {
				m, err := vm.New(exe, mod, devices.CPUDevice, vm.Options{MemoryCfg: cfg})
				check.NoError(b, err)
				args := []packedfunc.Value{x}
				b.ReportAllocs()
				for b.Loop() {
					r, err := m.Invoke("main", args...)
					if err != nil {
						b.Fatal(err)
					}
					if recycle {
						m.Recycle(r)
					}
				}
			})
		}
	}
}

// threeKernelsDPS is threeKernels writing into an output parameter.
func threeKernelsDPS(t testing.TB) *vm.Executable {
	t.Helper()
	b := vm.NewBuilder()
	f32t := b.DType(ndarray.Float32)
	f := b.Function("main", vm.TensorParam("x", ndarray.Float32, vm.Static(8)), vm.TensorParam("out", ndarray.Float32, vm.Static(8)))
	x, out := f.Param(0), f.Param(1)
	tmp := f.Call(vm.BuiltinAllocStorage, b.Shape(2, 8), vm.Imm(0), f32t, b.String("global"))
	s := f.Call(vm.BuiltinAllocTensor, tmp, vm.Imm(0), b.Shape(8), f32t)
	r := f.Call(vm.BuiltinAllocTensor, tmp, vm.Imm(32), b.Shape(8), f32t)
	f.CallTo(vm.NoReg, "vadd", x, x, s)
	f.CallTo(vm.NoReg, "vrelu", s, r)
	f.CallTo(vm.NoReg, "vmul", r, s, out)
	f.Ret(out)
	exe, err := b.Build()
	check.NoError(t, err)
	return exe
}

// BenchmarkMLP runs the IRModule tutorial's MLP shape (1x784 -> 256 -> 10) with the
// hand-written kernels of testdata/kernels.c, pooled against naive.
func BenchmarkMLP(b *testing.B) {
	mod := kernels(b)
	exe := mlpExecutable(b, 784, 256, 10)
	p := newMLPParams(784, 256, 10)
	args := p.args(b)
	for _, cfg := range memCfgs {
		for _, recycle := range []bool{false, true} {
			name := cfg
			if recycle {
				name += "-recycle"
			}
			b.Run(name, func(b *testing.B) {
				m, err := vm.New(exe, mod, devices.CPUDevice, vm.Options{MemoryCfg: cfg})
				check.NoError(b, err)
				b.ReportAllocs()
				for b.Loop() {
					r, err := m.Invoke("main", args...)
					if err != nil {
						b.Fatal(err)
					}
					if recycle {
						m.Recycle(r)
					}
				}
			})
		}
	}
}
