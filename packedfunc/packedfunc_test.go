package packedfunc_test

import (
	"errors"
	"testing"

	"github.com/kiln-ml/kiln/devices"
	_ "github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

func TestValueRoundTrip(t *testing.T) {
	arr, err := ndarray.FromSlice([]int32{1, 2}, ndarray.Shape{2})
	check.NoError(t, err)
	f := packedfunc.New("f", func([]packedfunc.Value) (packedfunc.Value, error) { return packedfunc.Nil, nil })
	dev := devices.Device{Type: devices.CUDA, ID: 3}
	dt := ndarray.MustParseDType("float16x8")

	i, err := packedfunc.Int(-42).AsInt()
	check.NoError(t, err)
	check.Equal(t, i, int64(-42))
	fl, err := packedfunc.Float(2.5).AsFloat()
	check.NoError(t, err)
	check.Equal(t, fl, 2.5)
	fl, err = packedfunc.Int(3).AsFloat()
	check.NoError(t, err)
	check.Equal(t, fl, 3.0)
	s, err := packedfunc.String("x").AsString()
	check.NoError(t, err)
	check.Equal(t, s, "x")
	b, err := packedfunc.Bytes([]byte{1}).AsBytes()
	check.NoError(t, err)
	check.Equal(t, b, []byte{1})
	a, err := packedfunc.Array(arr).AsArray()
	check.NoError(t, err)
	check.True(t, a == arr)
	d, err := packedfunc.DeviceValue(dev).AsDevice()
	check.NoError(t, err)
	check.Equal(t, d, dev)
	gdt, err := packedfunc.DTypeValue(dt).AsDType()
	check.NoError(t, err)
	check.Equal(t, gdt, dt)
	sh, err := packedfunc.ShapeValue(ndarray.Shape{2, 3}).AsShape()
	check.NoError(t, err)
	check.Equal(t, sh, ndarray.Shape{2, 3})
	gf, err := packedfunc.FuncValue(f).AsFunc()
	check.NoError(t, err)
	check.True(t, gf == f)
	check.True(t, packedfunc.Array(nil).IsNil())
	check.Equal(t, packedfunc.DeviceValue(dev).String(), "cuda:3")
	check.Equal(t, packedfunc.DTypeValue(dt).String(), "float16x8")

	_, err = packedfunc.String("x").AsInt()
	check.ErrorIs(t, err, packedfunc.ErrType)
	check.Error(t, err, "want int, got string")
	_, err = packedfunc.Nil.AsArray()
	check.Error(t, err, "want ndarray, got nil")
}

func TestRegistry(t *testing.T) {
	name := "test.registry.echo"
	f, err := packedfunc.Wrap(name, func(s string) string { return s + "!" })
	check.NoError(t, err)
	check.NoError(t, packedfunc.Register(name, f, false))
	t.Cleanup(func() { packedfunc.Unregister(name) })
	err = packedfunc.Register(name, f, false)
	check.ErrorIs(t, err, packedfunc.ErrExists)
	check.Error(t, err, name, "override")
	g, err := packedfunc.Wrap(name, func(s string) string { return s + "?" })
	check.NoError(t, err)
	check.NoError(t, packedfunc.Register(name, g, true))
	got, err := packedfunc.Get(name)
	check.NoError(t, err)
	v, err := got.Call(packedfunc.String("hi"))
	check.NoError(t, err)
	check.Equal(t, v.String(), `"hi?"`)
	found := false
	for _, n := range packedfunc.List() {
		found = found || n == name
	}
	check.True(t, found, "List includes", name)
	_, err = packedfunc.Get("test.registry.none")
	check.ErrorIs(t, err, packedfunc.ErrNotFound)
	check.Error(t, packedfunc.Register("", f, false), "empty")
}

func TestWrap(t *testing.T) {
	sum, err := packedfunc.Wrap("sum", func(a int32, b float64, rest ...packedfunc.Value) (float64, error) {
		s := float64(a) + b
		for _, r := range rest {
			x, err := r.AsFloat()
			if err != nil {
				return 0, err
			}
			s += x
		}
		return s, nil
	})
	check.NoError(t, err)
	v, err := sum.Call(packedfunc.Int(1), packedfunc.Float(2), packedfunc.Int(3), packedfunc.Float(0.5))
	check.NoError(t, err)
	check.Equal(t, v.String(), "6.5")

	_, err = sum.Call(packedfunc.Int(1))
	check.ErrorIs(t, err, packedfunc.ErrArity)
	check.Error(t, err, "sum", "want at least 2, got 1")
	_, err = sum.Call(packedfunc.String("1"), packedfunc.Float(2))
	check.ErrorIs(t, err, packedfunc.ErrType)
	check.Error(t, err, "sum: argument 0")
	_, err = sum.Call(packedfunc.Int(1<<40), packedfunc.Float(2))
	check.Error(t, err, "overflows int32")
	_, err = sum.Call(packedfunc.Int(1), packedfunc.Float(2), packedfunc.String("z"))
	check.ErrorIs(t, err, packedfunc.ErrType)

	boom := errors.New("boom")
	fail, err := packedfunc.Wrap("fail", func(*ndarray.NDArray, ndarray.Shape, ndarray.DType, devices.Device) error { return boom })
	check.NoError(t, err)
	_, err = fail.Call(packedfunc.Nil, packedfunc.ShapeValue(nil), packedfunc.DTypeValue(ndarray.Int8), packedfunc.DeviceValue(devices.CPUDevice))
	check.ErrorIs(t, err, packedfunc.ErrType) // nil is not an ndarray
	arr, err := ndarray.Zeros(ndarray.Shape{1}, ndarray.Int8, devices.CPUDevice)
	check.NoError(t, err)
	_, err = fail.Call(packedfunc.Array(arr), packedfunc.ShapeValue(nil), packedfunc.DTypeValue(ndarray.Int8), packedfunc.DeviceValue(devices.CPUDevice))
	check.ErrorIs(t, err, boom)

	u, err := packedfunc.Wrap("u", func(x uint8, ok bool) (uint8, error) {
		if ok {
			return x + 1, nil
		}
		return x, nil
	})
	check.NoError(t, err)
	_, err = u.Call(packedfunc.Int(-1), packedfunc.Int(1))
	check.Error(t, err, "does not fit uint8")
	v, err = u.Call(packedfunc.Int(254), packedfunc.Int(1))
	check.NoError(t, err)
	check.Equal(t, v.String(), "255")

	for name, fn := range map[string]any{
		"not a func":  42,
		"chan param":  func(chan int) {},
		"three outs":  func() (int, int, error) { return 0, 0, nil },
		"bad second":  func() (int, int) { return 0, 0 },
		"bad varargs": func(...int) {},
	} {
		_, err := packedfunc.Wrap(name, fn)
		check.Error(t, err, name)
	}
}

type fakeModule struct {
	packedfunc.ImportList
	name  string
	funcs map[string]*packedfunc.Func
}

func (m *fakeModule) Type() string { return m.name }
func (m *fakeModule) GetFunction(n string) (*packedfunc.Func, error) {
	if f, ok := m.funcs[n]; ok {
		return f, nil
	}
	return m.Lookup(n)
}
func (m *fakeModule) Functions() []string { return nil }
func (m *fakeModule) Close() error        { return nil }

func TestModuleImports(t *testing.T) {
	inner := &fakeModule{name: "inner", funcs: map[string]*packedfunc.Func{"g": packedfunc.New("g", nil)}}
	outer := &fakeModule{name: "outer"}
	_, err := outer.GetFunction("g")
	check.ErrorIs(t, err, packedfunc.ErrNotFound)
	outer.Import(inner)
	g, err := outer.GetFunction("g")
	check.NoError(t, err)
	check.Equal(t, g.Name(), "g")
	check.Equal(t, len(outer.Imports()), 1)
	v := packedfunc.ModuleValue(outer)
	check.Equal(t, v.String(), `module "outer"`)
}
