package vm

import (
	"fmt"
	"math"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// builtinFn is the body of a builtin: it runs inside the VM with the
// call's arguments (a scratch slice it must not keep).
type builtinFn func(m *VM, args []Value) (Value, error)

type builtin struct {
	name    string
	minArgs int
	maxArgs int // -1: any number
	fn      builtinFn
	doc     string
}

func (b *builtin) checkArity(n int) error {
	if n < b.minArgs || (b.maxArgs >= 0 && n > b.maxArgs) {
		want := fmt.Sprint(b.minArgs)
		switch {
		case b.maxArgs < 0:
			want = fmt.Sprintf("at least %d", b.minArgs)
		case b.maxArgs != b.minArgs:
			want = fmt.Sprintf("%d to %d", b.minArgs, b.maxArgs)
		}
		return fmt.Errorf("calls %s with %d arguments, it takes %s", b.name, n, want)
	}
	return nil
}

// Builtin names, as calls in executables spell them.
const (
	BuiltinAllocStorage    = "vm.builtin.alloc_storage"
	BuiltinAllocTensor     = "vm.builtin.alloc_tensor"
	BuiltinNullValue       = "vm.builtin.null_value"
	BuiltinMakeTuple       = "vm.builtin.make_tuple"
	BuiltinTupleGetItem    = "vm.builtin.tuple_getitem"
	BuiltinShapeOf         = "vm.builtin.shape_of"
	BuiltinReshape         = "vm.builtin.reshape"
	BuiltinCopy            = "vm.builtin.copy"
	BuiltinCopyInto        = "vm.builtin.copy_into"
	BuiltinToDevice        = "vm.builtin.to_device"
	BuiltinReadIfCond      = "vm.builtin.read_if_cond"
	BuiltinCheckTensorInfo = "vm.builtin.check_tensor_info"
)

var builtins = []builtin{
	{BuiltinAllocStorage, 3, 4, biAllocStorage, "(size shape|int bytes, device_index int, dtype, [scope string]) -> storage; a shape's size is its element count times the dtype's size"},
	{BuiltinAllocTensor, 4, 4, biAllocTensor, "(storage, offset int, shape, dtype) -> tensor viewing the storage at byte offset"},
	{BuiltinNullValue, 0, 0, biNullValue, "() -> nil"},
	{BuiltinMakeTuple, 0, -1, biMakeTuple, "(fields...) -> tuple"},
	{BuiltinTupleGetItem, 2, 2, biTupleGetItem, "(tuple, index int) -> field"},
	{BuiltinShapeOf, 1, 1, biShapeOf, "(tensor) -> shape"},
	{BuiltinReshape, 2, 2, biReshape, "(tensor, shape) -> view of the same elements in another shape"},
	{BuiltinCopy, 1, 1, biCopy, "(x) -> x (a register move; data is not copied)"},
	{BuiltinCopyInto, 2, 2, biCopyInto, "(src tensor, dst tensor) -> dst after copying src's elements into it"},
	{BuiltinToDevice, 2, 2, biToDevice, "(tensor, device_index int) -> a copy on that device"},
	{BuiltinReadIfCond, 1, 1, biReadIfCond, "(int or scalar bool/int tensor) -> int for if"},
	{BuiltinCallCached, 1, -1, biCallCached, "(function name string, args...) -> the VM function's result, computed once while the same NDArrays are passed"},
	{BuiltinCheckTensorInfo, 4, 4, biCheckTensorInfo, "(x, ndim int (-1 any), dtype (or \"\"), context string) -> nil; fails naming context"},
}

// Builtins lists the builtins the VM provides with their signatures.
func Builtins() map[string]string {
	out := make(map[string]string, len(builtins))
	for _, b := range builtins {
		out[b.name] = b.doc
	}
	return out
}

func builtinIndex(name string) (int, bool) {
	for i := range builtins {
		if builtins[i].name == name {
			return i, true
		}
	}
	return 0, false
}

func argInt(args []Value, i int, what string) (int64, error) {
	n, err := args[i].v.AsInt()
	if err != nil || args[i].tup != nil {
		return 0, fmt.Errorf("%s: %w: want int, got %s", what, packedfunc.ErrType, args[i].kindName())
	}
	return n, nil
}

func argShape(args []Value, i int, what string) (ndarray.Shape, error) {
	s, err := args[i].v.AsShape()
	if err != nil || args[i].tup != nil {
		return nil, fmt.Errorf("%s: %w: want shape, got %s", what, packedfunc.ErrType, args[i].kindName())
	}
	return s, nil
}

func argDType(args []Value, i int, what string) (ndarray.DType, error) {
	v := args[i].v
	switch v.Kind() {
	case packedfunc.KindDType:
		return v.AsDType()
	case packedfunc.KindString:
		s, _ := v.AsString()
		dt, err := ndarray.ParseDType(s)
		if err != nil {
			return dt, fmt.Errorf("%s: %w", what, err)
		}
		return dt, nil
	}
	return ndarray.DType{}, fmt.Errorf("%s: %w: want dtype, got %s", what, packedfunc.ErrType, args[i].kindName())
}

func argArray(args []Value, i int, what string) (*ndarray.NDArray, error) {
	a, err := args[i].Array()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if a == nil {
		return nil, fmt.Errorf("%s: nil array", what)
	}
	return a, nil
}

func (m *VM) device(index int64, what string) (devices.Device, error) {
	if index < 0 || index >= int64(len(m.devs)) {
		return devices.Device{}, fmt.Errorf("%s: device index %d out of range (the VM has %d devices)", what, index, len(m.devs))
	}
	return m.devs[index], nil
}

func biAllocStorage(m *VM, args []Value) (Value, error) {
	nbytes, dev, scope, err := m.storageArgs(args)
	if err != nil {
		return Value{}, err
	}
	return m.allocStorage(nbytes, dev, scope)
}

// storageArgs decodes alloc_storage's operands.
func (m *VM) storageArgs(args []Value) (nbytes int64, dev devices.Device, scope string, err error) {
	const what = "alloc_storage"
	dt, err := argDType(args, 2, what+": dtype")
	if err != nil {
		return 0, dev, "", err
	}
	switch args[0].v.Kind() {
	case packedfunc.KindShape:
		s, _ := args[0].v.AsShape()
		if err := s.Validate(); err != nil {
			return 0, dev, "", fmt.Errorf("%s: size: %w", what, err)
		}
		n, sz := s.NumElements(), int64(dt.Size())
		if sz > 0 && n > math.MaxInt64/sz {
			return 0, dev, "", fmt.Errorf("%s: size %s of %s overflows", what, s, dt)
		}
		nbytes = n * sz
	case packedfunc.KindInt:
		nbytes, _ = args[0].v.AsInt()
		if nbytes < 0 {
			return 0, dev, "", fmt.Errorf("%s: negative size %d", what, nbytes)
		}
	default:
		return 0, dev, "", fmt.Errorf("%s: size: %w: want shape or int, got %s", what, packedfunc.ErrType, args[0].kindName())
	}
	idx, err := argInt(args, 1, what+": device index")
	if err != nil {
		return 0, dev, "", err
	}
	dev, err = m.device(idx, what)
	if err != nil {
		return 0, dev, "", err
	}
	scope = "global"
	if len(args) > 3 {
		s, err := args[3].v.AsString()
		if err != nil || args[3].tup != nil {
			return 0, dev, "", fmt.Errorf("%s: scope: %w: want string, got %s", what, packedfunc.ErrType, args[3].kindName())
		}
		scope = s
	}
	return nbytes, dev, scope, nil
}

func (m *VM) allocStorage(nbytes int64, dev devices.Device, scope string) (Value, error) {
	if lim := m.opts.MaxAllocBytes; lim > 0 && nbytes > lim {
		return Value{}, fmt.Errorf("alloc_storage: %d bytes is over the VM's limit of %d", nbytes, lim)
	}
	st, err := m.alloc.alloc(dev, nbytes, scope)
	if err != nil {
		return Value{}, err
	}
	m.owned = append(m.owned, st)
	return Value{st: st}, nil
}

func biAllocTensor(m *VM, args []Value) (Value, error) {
	const what = "alloc_tensor"
	offset, err := argInt(args, 1, what+": offset")
	if err != nil {
		return Value{}, err
	}
	shape, err := argShape(args, 2, what+": shape")
	if err != nil {
		return Value{}, err
	}
	dt, err := argDType(args, 3, what+": dtype")
	if err != nil {
		return Value{}, err
	}
	return m.allocTensor(&args[0], offset, shape, dt)
}

func (m *VM) allocTensor(storage *Value, offset int64, shape ndarray.Shape, dt ndarray.DType) (Value, error) {
	if !storage.IsStorage() {
		return Value{}, fmt.Errorf("alloc_tensor: %w: want storage, got %s", packedfunc.ErrType, storage.kindName())
	}
	st := storage.st
	arr, err := st.view(offset, shape, dt, m.alloc.cachesViews() && !st.escaped)
	if err != nil {
		return Value{}, err
	}
	return Value{v: packedfunc.Array(arr), st: st}, nil
}

func biNullValue(m *VM, args []Value) (Value, error) { return Value{}, nil }

func biMakeTuple(m *VM, args []Value) (Value, error) { return TupleOf(args...), nil }

func biTupleGetItem(m *VM, args []Value) (Value, error) {
	if args[0].tup == nil {
		return Value{}, fmt.Errorf("tuple_getitem: %w: want tuple, got %s", packedfunc.ErrType, args[0].kindName())
	}
	i, err := argInt(args, 1, "tuple_getitem: index")
	if err != nil {
		return Value{}, err
	}
	f := args[0].tup.fields
	if i < 0 || i >= int64(len(f)) {
		return Value{}, fmt.Errorf("tuple_getitem: index %d out of range for a tuple of %d", i, len(f))
	}
	return f[i], nil
}

func biShapeOf(m *VM, args []Value) (Value, error) {
	a, err := argArray(args, 0, "shape_of")
	if err != nil {
		return Value{}, err
	}
	return Value{v: packedfunc.ShapeValue(a.Shape())}, nil
}

func biReshape(m *VM, args []Value) (Value, error) {
	a, err := argArray(args, 0, "reshape")
	if err != nil {
		return Value{}, err
	}
	s, err := argShape(args, 1, "reshape: shape")
	if err != nil {
		return Value{}, err
	}
	if err := s.Validate(); err != nil {
		return Value{}, fmt.Errorf("reshape: %w", err)
	}
	if s.NumElements() != a.NumElements() {
		return Value{}, fmt.Errorf("reshape: %s has %d elements, shape %s has %d", a.Shape(), a.NumElements(), s, s.NumElements())
	}
	v, err := a.View(s, a.DType())
	if err != nil {
		return Value{}, fmt.Errorf("reshape: %w", err)
	}
	return Value{v: packedfunc.Array(v), st: args[0].st}, nil
}

func biCopy(m *VM, args []Value) (Value, error) { return args[0], nil }

func biCopyInto(m *VM, args []Value) (Value, error) {
	src, err := argArray(args, 0, "copy_into: source")
	if err != nil {
		return Value{}, err
	}
	dst, err := argArray(args, 1, "copy_into: destination")
	if err != nil {
		return Value{}, err
	}
	if err := dst.CopyFrom(src); err != nil {
		return Value{}, fmt.Errorf("copy_into: %w", err)
	}
	return args[1], nil
}

func biToDevice(m *VM, args []Value) (Value, error) {
	a, err := argArray(args, 0, "to_device")
	if err != nil {
		return Value{}, err
	}
	idx, err := argInt(args, 1, "to_device: device index")
	if err != nil {
		return Value{}, err
	}
	dev, err := m.device(idx, "to_device")
	if err != nil {
		return Value{}, err
	}
	out, err := a.CopyTo(dev)
	if err != nil {
		return Value{}, fmt.Errorf("to_device: %w", err)
	}
	return ArrayValue(out), nil
}

func biReadIfCond(m *VM, args []Value) (Value, error) {
	v := args[0]
	if v.v.Kind() == packedfunc.KindInt && v.tup == nil {
		return v, nil
	}
	a, err := argArray(args, 0, "read_if_cond")
	if err != nil {
		return Value{}, err
	}
	if a.NumElements() != 1 || a.DType().Lanes != 1 || !(a.DType().IsInt() || a.DType().Code == ndarray.Bool) {
		return Value{}, fmt.Errorf("read_if_cond: want one bool or int element, got %s %s", a.Shape(), a.DType())
	}
	b, err := a.Bytes()
	if err != nil {
		return Value{}, fmt.Errorf("read_if_cond: %w", err)
	}
	for _, x := range b {
		if x != 0 {
			return Value{v: packedfunc.Int(1)}, nil
		}
	}
	return Value{v: packedfunc.Int(0)}, nil
}

func biCheckTensorInfo(m *VM, args []Value) (Value, error) {
	ctx, _ := args[3].v.AsString()
	a, err := args[0].Array()
	if err != nil || a == nil {
		return Value{}, fmt.Errorf("%s: want a tensor, got %s", ctx, args[0].kindName())
	}
	ndim, err := argInt(args, 1, ctx+": ndim")
	if err != nil {
		return Value{}, err
	}
	if ndim >= 0 && int64(a.NDim()) != ndim {
		return Value{}, fmt.Errorf("%s: want %d dimensions, got shape %s", ctx, ndim, a.Shape())
	}
	if s, err := args[2].v.AsString(); err == nil && s == "" {
		return Value{}, nil
	}
	dt, err := argDType(args, 2, ctx+": dtype")
	if err != nil {
		return Value{}, err
	}
	if a.DType() != dt {
		return Value{}, fmt.Errorf("%s: want dtype %s, got %s %s", ctx, dt, a.Shape(), a.DType())
	}
	return Value{}, nil
}
