package globals_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/rpcserver/globals"
)

func TestFillDrawsFromOneToTen(t *testing.T) {
	for _, dt := range []ndarray.DType{ndarray.Float32, ndarray.Float64, ndarray.Int8, ndarray.Int32, ndarray.Uint8, ndarray.Float16} {
		t.Run(dt.String(), func(t *testing.T) {
			a, err := ndarray.Zeros(ndarray.Shape{257}, dt, devices.CPUDevice)
			check.NoError(t, err)
			check.NoError(t, globals.Fill(a, rand.New(rand.NewPCG(1, 2))))
			b, err := a.Bytes()
			check.NoError(t, err)
			// A float16 in [1, 10) has exponent bits 15..18; an integer
			// is 1..9; a wider float is nonzero in its top bytes.
			size := dt.Size()
			for i := 0; i+size <= len(b); i += size {
				switch {
				case dt.IsInt():
					check.True(t, b[i] >= 1 && b[i] <= 9, "element", i/size, b[i])
				case dt == ndarray.Float16:
					exp := (uint16(b[i+1])<<8 | uint16(b[i])) >> 10 & 0x1f
					check.True(t, exp >= 15 && exp <= 18, "float16 exponent", exp)
				default:
					check.True(t, b[i+size-1] != 0, "element", i/size)
				}
			}
		})
	}
}

func TestRegisteredGlobals(t *testing.T) {
	globals.Register()
	get := func(name string) *packedfunc.Func {
		f, err := packedfunc.Get(name)
		check.NoError(t, err, name)
		return f
	}
	v, err := get(globals.AddOne).Call(packedfunc.Float(1.5))
	check.NoError(t, err)
	check.Equal(t, v.String(), "2.5")
	_, err = get(globals.RaiseError).Call(packedfunc.String("RuntimeError"), packedfunc.String("msg"))
	check.ErrorIs(t, err, globals.ErrRaised)
	check.Error(t, err, "RuntimeError: msg")
	v, err = get(globals.StrConcat).Call(packedfunc.String("abc"), packedfunc.String("def"))
	check.NoError(t, err)
	s, _ := v.AsString()
	check.Equal(t, s, "abcdef")
	f, err := get(globals.RemoteReturnND).Call(packedfunc.String("get_elem"))
	check.NoError(t, err)
	fn, err := f.AsFunc()
	check.NoError(t, err)
	v, err = fn.Call(packedfunc.Int(3))
	check.NoError(t, err)
	check.Equal(t, v.String(), "0")
	_, err = fn.Call(packedfunc.Int(10))
	check.Error(t, err, "index 10")
	_, err = get(globals.RemoteReturnND).Call(packedfunc.String("nope"))
	check.Error(t, err, "unknown name")
	ones, err := ndarray.Zeros(ndarray.Shape{3, 4}, ndarray.Float64, devices.CPUDevice)
	check.NoError(t, err)
	_, err = get(globals.RemoteTensor).Call(packedfunc.Array(ones))
	check.Error(t, err, "element 0 is 0")
}
