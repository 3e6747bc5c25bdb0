// Package globals owns the global functions a kiln session serves beside
// its modules' own: the names Apache TVM's RPC servers define (its testing
// globals "rpc.test.*", "testing.*", "ffi.Shape", and MetaSchedule's
// "tvm.contrib.random.random_fill_for_measure" and
// "cache_flush_cpu_non_first_arg"), and the functions of a board's plugins
// (shared objects of kiln's packed ABI, loaded by LoadPlugin).
//
// Register installs them in packedfunc's registry; the device daemon's
// worker and libkiln's local session call it. globals imports the runtime
// only (ndarray, packedfunc, devices, devices/cpu), never the compiler or
// the wire protocol.
package globals

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// The names of the globals Register installs.
const (
	Echo            = "testing.echo"
	RaiseError      = "testing.test_raise_error"
	AddOne          = "rpc.test.addone"
	StrCat          = "rpc.test.strcat"
	Except          = "rpc.test.except"
	StrConcat       = "rpc.test.runtime_str_concat"
	RemoteTensor    = "rpc.test.remote_tensor_func"
	AddToLHS        = "rpc.test.add_to_lhs"
	RemoteReturnND  = "rpc.test.remote_return_nd"
	MakeShape       = "ffi.Shape"
	ShapeSize       = "rpc.testing.GetShapeSize"
	ShapeElem       = "rpc.testing.GetShapeElem"
	RandomFill      = "tvm.contrib.random.random_fill"
	RandomFillMeas  = "tvm.contrib.random.random_fill_for_measure"
	CacheFlushNonFA = "cache_flush_cpu_non_first_arg"
	DeviceSync      = "runtime.DeviceSync"
)

// ErrRaised is the error testing.test_raise_error and rpc.test.except
// return: the failure the caller asked for.
var ErrRaised = errors.New("raised on request")

var once sync.Once

// Register installs the globals (once per process; later calls do
// nothing). A name already registered keeps its function.
func Register() {
	once.Do(func() {
		for name, impl := range table() {
			packedfunc.Register(name, packedfunc.New(name, impl), false)
		}
	})
}

func table() map[string]packedfunc.Impl {
	return map[string]packedfunc.Impl{
		Echo: func(args []packedfunc.Value) (packedfunc.Value, error) {
			if len(args) == 0 {
				return packedfunc.Nil, nil
			}
			return args[0], nil
		},
		RaiseError: func(args []packedfunc.Value) (packedfunc.Value, error) {
			kind, msg := strArg(args, 0), strArg(args, 1)
			return packedfunc.Nil, fmt.Errorf("%s: %s: %w", kind, msg, ErrRaised)
		},
		AddOne: func(args []packedfunc.Value) (packedfunc.Value, error) {
			if err := arity(AddOne, args, 1); err != nil {
				return packedfunc.Nil, err
			}
			return add(AddOne, args[0], packedfunc.Int(1))
		},
		StrCat: func(args []packedfunc.Value) (packedfunc.Value, error) {
			if err := arity(StrCat, args, 2); err != nil {
				return packedfunc.Nil, err
			}
			return packedfunc.String(text(args[0]) + ":" + text(args[1])), nil
		},
		Except: func(args []packedfunc.Value) (packedfunc.Value, error) {
			return packedfunc.Nil, fmt.Errorf("ValueError: %s: %w", strArg(args, 0), ErrRaised)
		},
		StrConcat: func(args []packedfunc.Value) (packedfunc.Value, error) {
			if err := arity(StrConcat, args, 2); err != nil {
				return packedfunc.Nil, err
			}
			a, err := args[0].AsString()
			if err != nil {
				return packedfunc.Nil, packedfunc.ArgError(StrConcat, 0, "%w", err)
			}
			b, err := args[1].AsString()
			if err != nil {
				return packedfunc.Nil, packedfunc.ArgError(StrConcat, 1, "%w", err)
			}
			return packedfunc.String(a + b), nil
		},
		RemoteTensor: remoteTensor,
		AddToLHS: func(args []packedfunc.Value) (packedfunc.Value, error) {
			if err := arity(AddToLHS, args, 1); err != nil {
				return packedfunc.Nil, err
			}
			x := args[0]
			name := AddToLHS + ".closure"
			return packedfunc.FuncValue(packedfunc.New(name, func(a []packedfunc.Value) (packedfunc.Value, error) {
				if err := arity(name, a, 1); err != nil {
					return packedfunc.Nil, err
				}
				return add(name, x, a[0])
			})), nil
		},
		RemoteReturnND: remoteReturnND,
		MakeShape: func(args []packedfunc.Value) (packedfunc.Value, error) {
			s := make(ndarray.Shape, len(args))
			for i, a := range args {
				n, err := a.AsInt()
				if err != nil {
					return packedfunc.Nil, packedfunc.ArgError(MakeShape, i, "%w", err)
				}
				s[i] = n
			}
			return packedfunc.ShapeValue(s), nil
		},
		ShapeSize: func(args []packedfunc.Value) (packedfunc.Value, error) {
			s, err := shapeArg(ShapeSize, args, 1)
			if err != nil {
				return packedfunc.Nil, err
			}
			return packedfunc.Int(int64(len(s))), nil
		},
		ShapeElem: func(args []packedfunc.Value) (packedfunc.Value, error) {
			s, err := shapeArg(ShapeElem, args, 2)
			if err != nil {
				return packedfunc.Nil, err
			}
			i, err := args[1].AsInt()
			if err != nil {
				return packedfunc.Nil, packedfunc.ArgError(ShapeElem, 1, "%w", err)
			}
			if i < 0 || i >= int64(len(s)) {
				return packedfunc.Nil, packedfunc.ArgError(ShapeElem, 1, "index %d out of a shape of %d dimensions", i, len(s))
			}
			return packedfunc.Int(s[i]), nil
		},
		RandomFill:      fillFunc(RandomFill),
		RandomFillMeas:  fillFunc(RandomFillMeas),
		CacheFlushNonFA: cacheFlush,
		DeviceSync:      deviceSync,
	}
}

func arity(name string, args []packedfunc.Value, n int) error {
	if len(args) != n {
		return fmt.Errorf("%s: takes %d arguments, got %d: %w", name, n, len(args), packedfunc.ErrArity)
	}
	return nil
}

func strArg(args []packedfunc.Value, i int) string {
	if i >= len(args) {
		return ""
	}
	return text(args[i])
}

// text formats a value as Python's str() would for the scalar kinds.
func text(v packedfunc.Value) string {
	if s, err := v.AsString(); err == nil {
		return s
	}
	if b, err := v.AsBytes(); err == nil {
		return string(b)
	}
	return v.String()
}

// add adds two numbers: ints stay ints, a float makes a float.
func add(name string, a, b packedfunc.Value) (packedfunc.Value, error) {
	if a.Kind() == packedfunc.KindInt && b.Kind() == packedfunc.KindInt {
		x, _ := a.AsInt()
		y, _ := b.AsInt()
		return packedfunc.Int(x + y), nil
	}
	x, err := a.AsFloat()
	if err != nil {
		return packedfunc.Nil, packedfunc.ArgError(name, 0, "%w", err)
	}
	y, err := b.AsFloat()
	if err != nil {
		return packedfunc.Nil, packedfunc.ArgError(name, 1, "%w", err)
	}
	return packedfunc.Float(x + y), nil
}

func shapeArg(name string, args []packedfunc.Value, n int) (ndarray.Shape, error) {
	if err := arity(name, args, n); err != nil {
		return nil, err
	}
	s, err := args[0].AsShape()
	if err != nil {
		return nil, packedfunc.ArgError(name, 0, "%w", err)
	}
	return s, nil
}

func arrayArg(name string, args []packedfunc.Value, i int) (*ndarray.NDArray, error) {
	if i >= len(args) {
		return nil, fmt.Errorf("%s: takes an array as argument %d, got %d arguments: %w", name, i, len(args), packedfunc.ErrArity)
	}
	a, err := args[i].AsArray()
	if err != nil {
		return nil, packedfunc.ArgError(name, i, "%w", err)
	}
	return a, nil
}

// remoteTensor checks that its argument is the float64 array of ones of
// shape (3, 4), as TVM's test function does.
func remoteTensor(args []packedfunc.Value) (packedfunc.Value, error) {
	a, err := arrayArg(RemoteTensor, args, 0)
	if err != nil {
		return packedfunc.Nil, err
	}
	if !a.Shape().Equal(ndarray.Shape{3, 4}) || a.DType() != ndarray.Float64 {
		return packedfunc.Nil, packedfunc.ArgError(RemoteTensor, 0, "want a float64 array of shape (3, 4), got %s", a)
	}
	b, err := a.Bytes()
	if err != nil {
		return packedfunc.Nil, err
	}
	for i := range 12 {
		if v := math.Float64frombits(le64(b[8*i:])); v != 1 {
			return packedfunc.Nil, fmt.Errorf("%s: element %d is %g, want 1", RemoteTensor, i, v)
		}
	}
	return packedfunc.Nil, nil
}

func le64(b []byte) uint64 {
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// remoteReturnND returns, by name, a function over an array of ten float32
// zeros that the closure holds: "get_arr" returns the array, "get_elem"
// one of its elements, "get_arr_elem" an element of the array passed.
func remoteReturnND(args []packedfunc.Value) (packedfunc.Value, error) {
	if err := arity(RemoteReturnND, args, 1); err != nil {
		return packedfunc.Nil, err
	}
	name, err := args[0].AsString()
	if err != nil {
		return packedfunc.Nil, packedfunc.ArgError(RemoteReturnND, 0, "%w", err)
	}
	nd, err := ndarray.Zeros(ndarray.Shape{10}, ndarray.Float32, devices.CPUDevice)
	if err != nil {
		return packedfunc.Nil, err
	}
	fn := RemoteReturnND + "." + name
	elem := func(a *ndarray.NDArray, iv packedfunc.Value) (packedfunc.Value, error) {
		i, err := iv.AsInt()
		if err != nil {
			return packedfunc.Nil, fmt.Errorf("%s: index: %w", fn, err)
		}
		v, err := element(a, i)
		if err != nil {
			return packedfunc.Nil, fmt.Errorf("%s: %w", fn, err)
		}
		return packedfunc.Float(v), nil
	}
	switch name {
	case "get_arr":
		return packedfunc.FuncValue(packedfunc.New(fn, func([]packedfunc.Value) (packedfunc.Value, error) {
			return packedfunc.Array(nd), nil
		})), nil
	case "get_elem":
		return packedfunc.FuncValue(packedfunc.New(fn, func(a []packedfunc.Value) (packedfunc.Value, error) {
			if err := arity(fn, a, 1); err != nil {
				return packedfunc.Nil, err
			}
			return elem(nd, a[0])
		})), nil
	case "get_arr_elem":
		return packedfunc.FuncValue(packedfunc.New(fn, func(a []packedfunc.Value) (packedfunc.Value, error) {
			if err := arity(fn, a, 2); err != nil {
				return packedfunc.Nil, err
			}
			arr, err := arrayArg(fn, a, 0)
			if err != nil {
				return packedfunc.Nil, err
			}
			return elem(arr, a[1])
		})), nil
	}
	return packedfunc.Nil, fmt.Errorf("%s: unknown name %q (want get_arr, get_elem or get_arr_elem)", RemoteReturnND, name)
}

// element reads element i of a float32 or float64 vector.
func element(a *ndarray.NDArray, i int64) (float64, error) {
	if i < 0 || i >= a.NumElements() {
		return 0, fmt.Errorf("index %d out of %s", i, a)
	}
	b, err := a.Bytes()
	if err != nil {
		return 0, err
	}
	switch a.DType() {
	case ndarray.Float32:
		u := uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24
		return float64(math.Float32frombits(u)), nil
	case ndarray.Float64:
		return math.Float64frombits(le64(b[8*i:])), nil
	}
	return 0, fmt.Errorf("%s: want float32 or float64", a)
}

// fillFunc is random_fill: it fills an array, on whatever device it is,
// with values drawn uniformly from [1, 10) as TVM's does (so that int8
// data is never all zeros): floats as floats, integers as integers from 1
// to 9, booleans true. A device array is filled through a host buffer the
// device daemon's process copies to it; the client sends nothing.
func fillFunc(name string) packedfunc.Impl {
	return func(args []packedfunc.Value) (packedfunc.Value, error) {
		if err := arity(name, args, 1); err != nil {
			return packedfunc.Nil, err
		}
		a, err := arrayArg(name, args, 0)
		if err != nil {
			return packedfunc.Nil, err
		}
		if err := Fill(a, rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))); err != nil {
			return packedfunc.Nil, fmt.Errorf("%s: %w", name, err)
		}
		return packedfunc.Nil, nil
	}
}

// Fill fills a with values from r drawn uniformly from [1, 10) (see
// fillFunc).
func Fill(a *ndarray.NDArray, r *rand.Rand) error {
	dt := a.DType()
	if dt.Lanes != 1 {
		dt = dt.Scalar()
	}
	n := a.NumBytes()
	var buf []byte
	direct := a.Device().Type == devices.CPU && a.IsContiguous()
	if direct {
		hb, err := a.HostBytes()
		if err != nil {
			direct = false
		} else {
			buf = hb
		}
	}
	if !direct {
		buf = make([]byte, n)
	}
	size := dt.Size()
	if size <= 0 {
		return fmt.Errorf("cannot fill %s", a)
	}
	for off := 0; off+size <= len(buf); off += size {
		x := 1 + 9*r.Float64()
		var bits uint64
		switch {
		case dt.Code == ndarray.Bool:
			bits = 1
		case dt.IsInt():
			bits = uint64(int64(x))
		case dt == ndarray.Float64:
			bits = math.Float64bits(x)
		case dt == ndarray.Float32:
			bits = uint64(math.Float32bits(float32(x)))
		case dt == ndarray.Float16:
			bits = uint64(half(float32(x)))
		case dt == ndarray.BFloat16:
			bits = uint64(math.Float32bits(float32(x)) >> 16)
		default:
			return fmt.Errorf("cannot fill %s: dtype %s", a, dt)
		}
		for k := range size {
			buf[off+k] = byte(bits >> (8 * k))
		}
	}
	if direct {
		return nil
	}
	return a.CopyFromBytes(buf)
}

// half converts a float32 in [1, 10) (a normal number) to IEEE half
// precision, truncating the mantissa.
func half(f float32) uint16 {
	b := math.Float32bits(f)
	exp := int((b>>23)&0xff) - 127 + 15
	return uint16(b>>31)<<15 | uint16(exp)<<10 | uint16((b>>13)&0x3ff)
}

// cacheFlush is TVM's cache_flush_cpu_non_first_arg, the time evaluator's
// f_preproc of MetaSchedule's runners: it evicts every argument but the
// first (the outputs stay warm, the inputs come cold from memory) by
// writing through a buffer larger than the caches.
func cacheFlush(args []packedfunc.Value) (packedfunc.Value, error) {
	var total int64
	for i := 1; i < len(args); i++ {
		if a, err := args[i].AsArray(); err == nil {
			total += a.NumBytes()
		}
	}
	if total == 0 {
		return packedfunc.Nil, nil
	}
	flushMu.Lock()
	defer flushMu.Unlock()
	n := max(2*total, flushMin)
	if int64(len(flushBuf)) < n {
		flushBuf = make([]byte, n)
	}
	for i := int64(0); i < n; i += 64 {
		flushBuf[i]++
	}
	return packedfunc.Nil, nil
}

// flushMin is the smallest eviction buffer: larger than the last-level
// cache of the CPUs kiln runs on.
const flushMin = 64 << 20

var (
	flushMu  sync.Mutex
	flushBuf []byte
)

// deviceSync(device_type, device_id) waits for the work queued on the
// device's default stream (TVM's Device.sync).
func deviceSync(args []packedfunc.Value) (packedfunc.Value, error) {
	if err := arity(DeviceSync, args, 2); err != nil {
		return packedfunc.Nil, err
	}
	t, err := args[0].AsInt()
	if err != nil {
		return packedfunc.Nil, packedfunc.ArgError(DeviceSync, 0, "%w", err)
	}
	id, err := args[1].AsInt()
	if err != nil {
		return packedfunc.Nil, packedfunc.ArgError(DeviceSync, 1, "%w", err)
	}
	dev := devices.Device{Type: devices.Type(t), ID: int32(id)}
	api, err := devices.For(dev)
	if err != nil {
		return packedfunc.Nil, fmt.Errorf("%s: %w", DeviceSync, err)
	}
	if err := api.StreamSync(dev, 0); err != nil {
		return packedfunc.Nil, fmt.Errorf("%s: %s: %w", DeviceSync, dev, err)
	}
	return packedfunc.Nil, nil
}

// LoadPlugin loads a shared object of kiln's packed ABI (one that exports
// kiln_module_metadata, as every kiln module does) and registers each of
// its functions as a global under its own name, so that every session
// serves it. It returns the names. A name another global already has is
// refused, and nothing of the plugin is registered then.
func LoadPlugin(path string) ([]string, error) {
	mod, err := cpu.Load(path)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w", path, err)
	}
	names := mod.Functions()
	have := map[string]bool{}
	for _, n := range packedfunc.List() {
		have[n] = true
	}
	var clash []string
	for _, n := range names {
		if have[n] {
			clash = append(clash, fmt.Sprintf("%q", n))
		}
	}
	if len(clash) > 0 {
		return nil, fmt.Errorf("plugin %s: functions %s are already registered: %w", path, strings.Join(clash, ", "), packedfunc.ErrExists)
	}
	for _, n := range names {
		f, err := mod.GetFunction(n)
		if err != nil {
			return nil, fmt.Errorf("plugin %s: %w", path, err)
		}
		if err := packedfunc.Register(n, f, false); err != nil {
			return nil, fmt.Errorf("plugin %s: %w", path, err)
		}
	}
	return names, nil
}
