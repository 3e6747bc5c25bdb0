package vm_test

import (
	"fmt"
	"testing"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/vm"
)

// register installs a global function for the duration of a test.
func register(t *testing.T, name string, fn any) {
	t.Helper()
	f, err := packedfunc.Wrap(name, fn)
	check.NoError(t, err)
	check.NoError(t, packedfunc.Register(name, f, true))
	t.Cleanup(func() { packedfunc.Unregister(name) })
}

func TestArgumentChecks(t *testing.T) {
	b := vm.NewBuilder()
	f := b.Function("main",
		vm.TensorParam("x", ndarray.Float32, vm.Sym("n"), vm.Static(2)),
		vm.TensorParam("y", ndarray.Float32, vm.Sym("n")),
		vm.KindParam("k", vm.ParamInt),
		vm.Param{Name: "z", Kind: vm.ParamTensor, NDim: 1},
	)
	f.Ret(f.Param(0))
	exe, err := b.Build()
	check.NoError(t, err)
	m, err := vm.New(exe, nil, devices.CPUDevice, vm.Options{})
	check.NoError(t, err)

	x := arr(f32(t, make([]float32, 6), 3, 2))
	y := arr(f32(t, make([]float32, 3), 3))
	z := arr(f32(t, make([]float32, 5), 5))
	x64, err := ndarray.Zeros(ndarray.Shape{3, 2}, ndarray.Float64, devices.CPUDevice)
	check.NoError(t, err)
	k := packedfunc.Int(1)

	for _, tc := range []struct {
		name string
		args []packedfunc.Value
		want []string // nil: no error
	}{
		{"ok", []packedfunc.Value{x, y, k, z}, nil},
		{"too few", []packedfunc.Value{x, y}, []string{"vm: main", "wrong number of arguments", "want 4 (x, y, k, z), got 2"}},
		{"too many", []packedfunc.Value{x, y, k, z, z}, []string{"want 4", "got 5"}},
		{"static dim", []packedfunc.Value{arr(f32(t, make([]float32, 9), 3, 3)), y, k, z}, []string{`main: parameter 0 "x"`, "shape (3, 3), want (n, 2)"}},
		{"rank", []packedfunc.Value{y, y, k, z}, []string{`parameter 0 "x"`, "shape (3,), want (n, 2)"}},
		{"dtype", []packedfunc.Value{arr(x64), y, k, z}, []string{`parameter 0 "x"`, "got (3, 2) float64, want Tensor((n, 2), float32)"}},
		{"symbolic", []packedfunc.Value{x, z, k, z}, []string{`parameter 1 "y"`, "shape (5,), want (n,)", `n is 5 here but 3 in parameter 0 "x"`}},
		{"not a tensor", []packedfunc.Value{k, y, k, z}, []string{`parameter 0 "x"`, "want Tensor((n, 2), float32), got int"}},
		{"int", []packedfunc.Value{x, y, packedfunc.Float(1), z}, []string{`parameter 2 "k"`, "want int, got float"}},
		{"any-shape rank", []packedfunc.Value{x, y, k, x}, []string{`parameter 3 "z"`, "shape (3, 2) has 2 dimensions, want 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.Invoke("main", tc.args...)
			if tc.want == nil {
				check.NoError(t, err)
				return
			}
			check.Error(t, err, tc.want...)
		})
	}
}

// TestControlFlow counts down a loop built from If and Goto.
func TestControlFlow(t *testing.T) {
	register(t, "test.vm.positive", func(n int64) int64 {
		if n > 0 {
			return 1
		}
		return 0
	})
	register(t, "test.vm.add", func(a, b int64) int64 { return a + b })
	b := vm.NewBuilder()
	f := b.Function("count", vm.KindParam("n", vm.ParamInt))
	n := f.Param(0)
	acc := f.NewReg()
	f.CallTo(acc, vm.BuiltinCopy, b.Int(0))
	loop, done := f.NewLabel(), f.NewLabel()
	f.Bind(loop)
	c := f.Call("test.vm.positive", n)
	f.If(c, done)
	f.CallTo(n, "test.vm.add", n, vm.Imm(-1))
	f.CallTo(acc, "test.vm.add", acc, vm.Imm(10))
	f.Goto(loop)
	f.Bind(done)
	f.Ret(acc)

	// forever loops without end.
	g := b.Function("forever")
	top := g.NewLabel()
	g.Bind(top)
	g.Goto(top)
	g.Ret(g.Call(vm.BuiltinNullValue))

	// cond takes an if on a scalar bool tensor via read_if_cond.
	h := b.Function("cond", vm.TensorParam("flag", ndarray.BoolT))
	els := h.NewLabel()
	h.If(h.Call(vm.BuiltinReadIfCond, h.Param(0)), els)
	h.Ret(h.Call(vm.BuiltinCopy, b.String("then")))
	h.Bind(els)
	h.Ret(h.Call(vm.BuiltinCopy, b.String("else")))
	exe, err := b.Build()
	check.NoError(t, err)
	checkGolden(t, "control", exe.String())

	m, err := vm.New(exe, nil, devices.CPUDevice, vm.Options{MaxSteps: 1000})
	check.NoError(t, err)
	for _, tc := range []struct{ n, want int64 }{{0, 0}, {1, 10}, {5, 50}, {-3, 0}} {
		t.Run(fmt.Sprint(tc.n), func(t *testing.T) {
			r, err := m.Invoke("count", packedfunc.Int(tc.n))
			check.NoError(t, err)
			p, err := r.Packed()
			check.NoError(t, err)
			got, err := p.AsInt()
			check.NoError(t, err)
			check.Equal(t, got, tc.want)
		})
	}
	_, err = m.Invoke("forever")
	check.ErrorIs(t, err, vm.ErrStepLimit)
	check.Error(t, err, "forever: instruction 0")
	for _, tc := range []struct {
		flag bool
		want string
	}{{true, `"then"`}, {false, `"else"`}} {
		flag, err := ndarray.FromSlice([]bool{tc.flag}, ndarray.Shape{})
		check.NoError(t, err)
		r, err := m.Invoke("cond", arr(flag))
		check.NoError(t, err)
		check.Equal(t, r.String(), tc.want)
	}
}

func TestIfNeedsInt(t *testing.T) {
	b := vm.NewBuilder()
	f := b.Function("main", vm.AnyParam("c"))
	l := f.NewLabel()
	f.If(f.Param(0), l)
	f.Bind(l)
	f.Ret(f.Param(0))
	exe, err := b.Build()
	check.NoError(t, err)
	m, err := vm.New(exe, nil, devices.CPUDevice, vm.Options{})
	check.NoError(t, err)
	_, err = m.Invoke("main", packedfunc.String("yes"))
	check.Error(t, err, "main: instruction 0: if: condition %0 holds string, want int")
}

// TestVMCalls calls between VM functions: main -> double (which allocates
// and runs a kernel) twice, and a recursive function with a depth bound.
func TestVMCalls(t *testing.T) {
	mod := kernels(t)
	register(t, "test.vm.add", func(a, b int64) int64 { return a + b })
	register(t, "test.vm.positive", func(n int64) int64 {
		if n > 0 {
			return 1
		}
		return 0
	})
	b := vm.NewBuilder()
	f32t := b.DType(ndarray.Float32)
	main := b.Function("main", vm.TensorParam("x", ndarray.Float32, vm.Sym("n")))
	once := main.Call("double", main.Param(0))
	twice := main.Call("double", once)
	main.Ret(main.Call(vm.BuiltinMakeTuple, once, twice))

	d := b.Function("double", vm.TensorParam("x", ndarray.Float32, vm.Sym("n")))
	shape := d.Call(vm.BuiltinShapeOf, d.Param(0))
	st := d.Call(vm.BuiltinAllocStorage, shape, vm.Imm(0), f32t)
	out := d.Call(vm.BuiltinAllocTensor, st, vm.Imm(0), shape, f32t)
	d.CallTo(vm.NoReg, "vadd", d.Param(0), d.Param(0), out)
	d.Ret(out)

	// depth(n) recurses n times and returns n.
	r := b.Function("depth", vm.KindParam("n", vm.ParamInt))
	base := r.NewLabel()
	r.If(r.Call("test.vm.positive", r.Param(0)), base)
	sub := r.Call("depth", r.Call("test.vm.add", r.Param(0), vm.Imm(-1)))
	r.Ret(r.Call("test.vm.add", sub, vm.Imm(1)))
	r.Bind(base)
	r.Ret(r.Param(0))
	exe, err := b.Build()
	check.NoError(t, err)
	check.Equal(t, exe.Kernels(), []string{"test.vm.add", "test.vm.positive", "vadd"})

	for _, cfg := range memCfgs {
		t.Run(cfg, func(t *testing.T) {
			m, err := vm.New(exe, mod, devices.CPUDevice, vm.Options{MemoryCfg: cfg, MaxDepth: 64})
			check.NoError(t, err)
			res, err := m.Invoke("main", arr(f32(t, []float32{1, 2, 3}, 3)))
			check.NoError(t, err)
			check.True(t, res.IsTuple())
			fields := res.Fields()
			check.Equal(t, len(fields), 2)
			check.Equal(t, toF32(t, fields[0]), []float32{2, 4, 6})
			check.Equal(t, toF32(t, fields[1]), []float32{4, 8, 12})
			arrays, err := res.Arrays()
			check.NoError(t, err)
			check.Equal(t, len(arrays), 2)
			check.Equal(t, m.Stats().LiveBytes-m.Stats().PooledBytes, int64(0))

			got, err := m.Invoke("depth", packedfunc.Int(40))
			check.NoError(t, err)
			check.Equal(t, got.String(), "40")
			_, err = m.Invoke("depth", packedfunc.Int(100))
			check.Error(t, err, `vm: depth: instruction 3 (call "depth"): call depth exceeds 64; called from depth instruction 3, depth instruction 3`, "and 57 more")
			// The VM is usable after an error.
			got, err = m.Invoke("depth", packedfunc.Int(3))
			check.NoError(t, err)
			check.Equal(t, got.String(), "3")
		})
	}
}

func TestBuiltins(t *testing.T) {
	b := vm.NewBuilder()
	f32t := b.DType(ndarray.Float32)
	f := b.Function("main", vm.TensorParam("x", ndarray.Float32, vm.Static(2), vm.Static(3)))
	xr := f.Param(0)
	shape := f.Call(vm.BuiltinShapeOf, xr)
	flat := f.Call(vm.BuiltinReshape, xr, b.Shape(6))
	st := f.Call(vm.BuiltinAllocStorage, b.Shape(6), vm.Imm(0), f32t, b.String(""))
	dst := f.Call(vm.BuiltinAllocTensor, st, vm.Imm(0), b.Shape(6), f32t)
	cp := f.Call(vm.BuiltinCopyInto, flat, dst)
	moved := f.Call(vm.BuiltinToDevice, cp, vm.Imm(0))
	null := f.Call(vm.BuiltinNullValue)
	f.CallTo(vm.NoReg, vm.BuiltinCheckTensorInfo, moved, vm.Imm(1), f32t, b.String("moved"))
	tr := f.Call(vm.BuiltinMakeTuple, shape, flat, null, moved, b.Float(0.5))
	inner := f.Call(vm.BuiltinMakeTuple, tr, vm.Imm(7))
	second := f.Call(vm.BuiltinTupleGetItem, f.Call(vm.BuiltinTupleGetItem, inner, vm.Imm(0)), vm.Imm(1))
	f.Ret(f.Call(vm.BuiltinMakeTuple, tr, second))

	g := b.Function("bad_reshape", vm.TensorParam("x", ndarray.Float32, vm.Static(2), vm.Static(3)))
	g.Ret(g.Call(vm.BuiltinReshape, g.Param(0), b.Shape(5)))
	h := b.Function("bad_index", vm.AnyParam("t"))
	h.Ret(h.Call(vm.BuiltinTupleGetItem, h.Param(0), vm.Imm(3)))
	k := b.Function("bad_check", vm.AnyParam("x"))
	k.Ret(k.Call(vm.BuiltinCheckTensorInfo, k.Param(0), vm.Imm(2), b.DType(ndarray.Int32), b.String("argument x of k")))
	d := b.Function("bad_device")
	d.Ret(d.Call(vm.BuiltinAllocStorage, vm.Imm(8), vm.Imm(3), f32t))
	exe, err := b.Build()
	check.NoError(t, err)

	m, err := vm.New(exe, nil, devices.CPUDevice, vm.Options{})
	check.NoError(t, err)
	x := f32(t, []float32{1, 2, 3, 4, 5, 6}, 2, 3)
	r, err := m.Invoke("main", arr(x))
	check.NoError(t, err)
	check.Equal(t, r.String(), "(((2, 3), NDArray((6,), float32, cpu:0), nil, NDArray((6,), float32, cpu:0), 0.5), NDArray((6,), float32, cpu:0))")
	tup := r.Fields()[0].Fields()
	check.Equal(t, toF32(t, tup[3]), []float32{1, 2, 3, 4, 5, 6})
	check.True(t, tup[2].IsNil())
	_, err = r.Array()
	check.ErrorIs(t, err, packedfunc.ErrType)
	p, err := r.Packed()
	check.NoError(t, err)
	outer, err := p.AsTuple()
	check.NoError(t, err)
	check.Equal(t, len(outer), 2)
	fields, err := outer[0].AsTuple()
	check.NoError(t, err)
	check.Equal(t, len(fields), 5)
	check.True(t, fields[2].IsNil())

	_, err = m.Invoke("bad_reshape", arr(x))
	check.Error(t, err, "reshape: (2, 3) has 6 elements, shape (5,) has 5")
	_, err = m.InvokeValues("bad_index", vm.TupleOf(vm.ValueOf(packedfunc.Int(1))))
	check.Error(t, err, "tuple_getitem: index 3 out of range for a tuple of 1")
	_, err = m.Invoke("bad_check", arr(x))
	check.Error(t, err, "argument x of k: want dtype int32, got (2, 3) float32")
	_, err = m.Invoke("bad_device")
	check.Error(t, err, "alloc_storage: device index 3 out of range (the VM has 1 devices)")

	// The VM is a packedfunc.Module.
	var mod packedfunc.Module = m
	check.Equal(t, mod.Type(), "vm")
	check.Equal(t, mod.Functions(), []string{"main", "bad_reshape", "bad_index", "bad_check", "bad_device"})
	fn, err := mod.GetFunction("bad_check")
	check.NoError(t, err)
	_, err = fn.Call(arr(f32(t, []float32{1}, 1)))
	check.Error(t, err, "want 2 dimensions")
	fn, err = mod.GetFunction("main")
	check.NoError(t, err)
	res, err := fn.Call(arr(x))
	check.NoError(t, err)
	check.Equal(t, res.Kind(), packedfunc.KindTuple)
	_, err = mod.GetFunction("missing")
	check.ErrorIs(t, err, packedfunc.ErrNotFound)
}

// TestNoLeak runs 1,000 invocations and checks that the allocator holds
// the same bytes after each one, and that the pooled allocator stops going
// to the device for intermediates.
func TestNoLeak(t *testing.T) {
	mod := kernels(t)
	exe := threeKernels(t)
	for _, cfg := range memCfgs {
		t.Run(cfg, func(t *testing.T) {
			m, err := vm.New(exe, mod, devices.CPUDevice, vm.Options{MemoryCfg: cfg})
			check.NoError(t, err)
			defer m.Close()
			x := arr(f32(t, []float32{-1, 2, -3, 4, 5, -6, 7, 8}, 8))
			var live, allocs int64
			for i := range 1000 {
				r, err := m.Invoke("main", x)
				check.NoError(t, err)
				if i == 0 {
					check.Equal(t, toF32(t, r), []float32{0, 16, 0, 64, 100, 0, 196, 256})
				}
				s := m.Stats()
				check.Equal(t, s.LiveBytes-s.PooledBytes, int64(0), "bytes in use after invocation", i)
				if i == 1 {
					live, allocs = s.LiveBytes, s.DeviceAllocs
				}
				if i > 1 {
					check.Equal(t, s.LiveBytes, live, "live bytes after invocation", i)
					if cfg == vm.MemoryPooled {
						// One device allocation per invocation: the output,
						// which the caller owns.
						check.Equal(t, s.DeviceAllocs, allocs+int64(i-1), "device allocations after invocation", i)
					}
				}
			}
			s := m.Stats()
			if cfg == vm.MemoryPooled {
				check.True(t, s.LiveBytes > 0 && s.Reuses >= 999, "pool reused", s)
			} else {
				check.Equal(t, s.LiveBytes, int64(0))
				check.Equal(t, s.DeviceAllocs, int64(2000))
			}
			check.NoError(t, m.Close())
			check.Equal(t, m.Stats().LiveBytes, int64(0))
		})
	}
}

// threeKernels is main(x: (n,)) = relu(x + x) * (x + x) with the two
// intermediates in one storage of the pool and the result in its own.
func threeKernels(t testing.TB) *vm.Executable {
	t.Helper()
	b := vm.NewBuilder()
	f32t := b.DType(ndarray.Float32)
	f := b.Function("main", vm.TensorParam("x", ndarray.Float32, vm.Sym("n")))
	x := f.Param(0)
	shape := f.Call(vm.BuiltinShapeOf, x)
	tmp := f.Call(vm.BuiltinAllocStorage, b.Shape(2, 8), vm.Imm(0), f32t, b.String("global"))
	s := f.Call(vm.BuiltinAllocTensor, tmp, vm.Imm(0), shape, f32t)
	r := f.Call(vm.BuiltinAllocTensor, tmp, vm.Imm(32), shape, f32t)
	outSt := f.Call(vm.BuiltinAllocStorage, shape, vm.Imm(0), f32t, b.String("global"))
	out := f.Call(vm.BuiltinAllocTensor, outSt, vm.Imm(0), shape, f32t)
	f.CallTo(vm.NoReg, "vadd", x, x, s)
	f.CallTo(vm.NoReg, "vrelu", s, r)
	f.CallTo(vm.NoReg, "vmul", r, s, out)
	f.Ret(out)
	exe, err := b.Build()
	check.NoError(t, err)
	return exe
}

func TestRecycle(t *testing.T) {
	mod := kernels(t)
	exe := threeKernels(t)
	x := arr(f32(t, []float32{-1, 2, -3, 4, 5, -6, 7, 8}, 8))
	want := []float32{0, 16, 0, 64, 100, 0, 196, 256}
	for _, cfg := range memCfgs {
		t.Run(cfg, func(t *testing.T) {
			m, err := vm.New(exe, mod, devices.CPUDevice, vm.Options{MemoryCfg: cfg})
			check.NoError(t, err)
			defer m.Close()
			for i := range 100 {
				r, err := m.Invoke("main", x)
				check.NoError(t, err)
				check.Equal(t, toF32(t, r), want)
				m.Recycle(r)
				m.Recycle(r) // twice is harmless
				a, _ := r.Array()
				if cfg == vm.MemoryNaive {
					check.True(t, a.Released(), "recycled array released", i)
				}
			}
			s := m.Stats()
			if cfg == vm.MemoryPooled {
				check.Equal(t, s.DeviceAllocs, int64(2), "pooled device allocations")
				check.Equal(t, s.LiveBytes, s.PooledBytes)
				check.Equal(t, s.LiveBytes, int64(128))
			} else {
				check.Equal(t, s.LiveBytes, int64(0))
			}
			// Values the VM did not make are left alone.
			m.Recycle(vm.ValueOf(x))
		})
	}
}
