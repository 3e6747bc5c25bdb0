package interp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// ErrOutOfBounds reports a buffer access outside the buffer's shape or
// outside the memory behind it.
var ErrOutOfBounds = errors.New("out of bounds")

// ErrAssert reports a failed AssertStmt; the error's message carries the
// assertion's message.
var ErrAssert = errors.New("assertion failed")

// maxAlloc bounds one allocation made by the interpreter, in bytes.
const maxAlloc = 1 << 31

// Options tunes Run.
type Options struct {
	// Poison fills memory that Allocate and alloc_buffers create with 0xFF
	// bytes (NaN for floats, -1 for integers) instead of zeros, so that
	// reading memory before writing it shows.
	Poison bool
	// MaxSteps, when positive, bounds the number of loop iterations and
	// block executions; a run that needs more fails.
	MaxSteps int64
}

// Run executes f with one argument per parameter, in order: a host
// *ndarray.NDArray (or a packedfunc.Value holding one) for each buffer
// parameter, and an integer, float or bool (Go value or packedfunc.Value)
// for each scalar parameter. Buffers read and write the arrays' memory
// directly. Symbolic shapes, strides and offsets of the parameter buffers
// are bound from the arrays.
func Run(f *ir.PrimFunc, args ...any) error { return RunOptions(f, Options{}, args...) }

// RunOptions is Run with options.
func RunOptions(f *ir.PrimFunc, opts Options, args ...any) error {
	_, _, err := RunResult(f, opts, args...)
	return err
}

// errReturned ends a run at a `return value` (ir.OpRet); machine.ret
// holds the value.
var errReturned = errors.New("returned")

// RunResult is RunOptions for a function with a result (ir.PrimFunc's
// RetType, TVMScript's -> T.int64): it returns the value of the `return`
// that ended the run, of the RetType, or ok=false when the run ended
// without one (TVM's None).
func RunResult(f *ir.PrimFunc, opts Options, args ...any) (ret Value, ok bool, err error) {
	name, _ := f.Attrs[ir.AttrGlobalSymbol].(string)
	if name == "" {
		name = "prim_func"
	}
	m := &machine{
		vars:    map[*ir.Var]Value{},
		mem:     map[*ir.Var]*memory{},
		layouts: map[*ir.Buffer]*layout{},
		opts:    opts,
	}
	if err := m.bindParams(f, args); err != nil {
		return Value{}, false, fmt.Errorf("run %q: %w", name, err)
	}
	if err := m.exec(f.Body); err != nil {
		if errors.Is(err, errReturned) && m.ret != nil {
			return *m.ret, true, nil
		}
		return Value{}, false, fmt.Errorf("run %q: %w", name, err)
	}
	return Value{}, false, nil
}

// memory is a block of host bytes that buffers view.
type memory struct {
	name   string
	data   []byte
	shared bool // GPU shared memory: accesses are checked for races
	// threads holds each thread's copy of a per-thread buffer (see
	// machine.perThread), keyed by threadIdx; nil for other memory.
	threads map[[3]int64]*memory
	// arr is the array whose memory data aliases, held so that the
	// garbage collector does not free that memory while the function
	// runs (the caller may drop its last reference to the array once it
	// has passed it in).
	arr *ndarray.NDArray
}

// layout is a buffer's shape, strides and offset, in elements, evaluated.
type layout struct {
	shape, strides []int64
	offset         int64
}

type machine struct {
	vars    map[*ir.Var]Value
	mem     map[*ir.Var]*memory
	layouts map[*ir.Buffer]*layout
	opts    Options
	steps   int64
	gpu     gpu
	ret     *Value // set by a `return value`
}

// Var returns the value bound to v.
func (m *machine) Var(v *ir.Var) (Value, bool) {
	x, ok := m.vars[v]
	return x, ok
}

func (m *machine) eval(e ir.Expr) (Value, error) {
	ev := evaluator{env: m}
	return ev.eval(e)
}

func (m *machine) evalInt(e ir.Expr, what string) (int64, error) {
	v, err := m.eval(e)
	if err != nil {
		return 0, err
	}
	if v.Lanes() != 1 || v.IsFloat() {
		return 0, fmt.Errorf("%s %s: want a scalar integer, got %s", what, e, v.Type)
	}
	return v.AsInt(), nil
}

func (m *machine) step() error {
	m.steps++
	if m.opts.MaxSteps > 0 && m.steps > m.opts.MaxSteps {
		return fmt.Errorf("more than %d steps", m.opts.MaxSteps)
	}
	return nil
}

// bind sets v to x and returns a function restoring v's previous binding.
func (m *machine) bind(v *ir.Var, x Value) func() {
	old, had := m.vars[v]
	m.vars[v] = x
	return func() {
		if had {
			m.vars[v] = old
		} else {
			delete(m.vars, v)
		}
	}
}

func (m *machine) bindMem(v *ir.Var, mem *memory) func() {
	old, had := m.mem[v]
	m.mem[v] = mem
	return func() {
		if had {
			m.mem[v] = old
		} else {
			delete(m.mem, v)
		}
	}
}

// bindParams binds scalar parameters and the parameter buffers' memory and
// symbolic dimensions.
func (m *machine) bindParams(f *ir.PrimFunc, args []any) error {
	if len(args) != len(f.Params) {
		return fmt.Errorf("%d arguments for %d parameters", len(args), len(f.Params))
	}
	type pending struct {
		b   *ir.Buffer
		arr *ndarray.NDArray
	}
	var bufs []pending
	for i, p := range f.Params {
		arg := args[i]
		if pv, ok := arg.(packedfunc.Value); ok {
			switch pv.Kind() {
			case packedfunc.KindInt:
				arg, _ = pv.AsInt()
			case packedfunc.KindFloat:
				arg, _ = pv.AsFloat()
			default:
				a, err := pv.AsArray()
				if err != nil {
					return fmt.Errorf("parameter %q: %w", p.Name, err)
				}
				arg = a
			}
		}
		if b := f.BufferMap[p]; b != nil {
			arr, ok := arg.(*ndarray.NDArray)
			if !ok || arr == nil {
				return fmt.Errorf("parameter %q: want an *ndarray.NDArray for buffer %q, got %T", p.Name, b.Name, arg)
			}
			bufs = append(bufs, pending{b, arr})
			continue
		}
		v, err := scalarArg(p, arg)
		if err != nil {
			return err
		}
		m.vars[p] = v
	}
	// Bind every dimension that is a plain variable first, then check all.
	for _, pb := range bufs {
		b, arr := pb.b, pb.arr
		if arr.Device().Type != devices.CPU {
			return fmt.Errorf("buffer %q: array is on %s, the interpreter needs host memory", b.Name, arr.Device())
		}
		if arr.DType() != b.DType {
			return fmt.Errorf("buffer %q: array has dtype %s, want %s", b.Name, arr.DType(), b.DType)
		}
		if arr.NDim() != len(b.Shape) {
			return fmt.Errorf("buffer %q: array has %d dimensions %s, want %d", b.Name, arr.NDim(), arr.Shape(), len(b.Shape))
		}
		if b.Strides == nil && !arr.IsContiguous() {
			return fmt.Errorf("buffer %q: array with strides %v is not compact and the buffer has no strides", b.Name, arr.Strides())
		}
		m.bindDims(b.Shape, arr.Shape())
		if b.Strides != nil {
			if len(b.Strides) != len(b.Shape) {
				return fmt.Errorf("buffer %q: %d strides for %d dimensions", b.Name, len(b.Strides), len(b.Shape))
			}
			m.bindDims(b.Strides, arr.Strides())
		}
		if v, ok := b.ElemOffset.(*ir.Var); ok {
			if _, bound := m.vars[v]; !bound {
				m.vars[v] = Int(v.Type, 0) // memory starts at the array's element 0
			}
		}
	}
	for _, pb := range bufs {
		if err := m.bindArray(pb.b, pb.arr); err != nil {
			return err
		}
	}
	return nil
}

func (m *machine) bindDims(dims []ir.Expr, actual []int64) {
	for d, e := range dims {
		if v, ok := e.(*ir.Var); ok {
			if _, bound := m.vars[v]; !bound {
				m.vars[v] = Int(v.Type, actual[d])
			}
		}
	}
}

// bindArray checks the array against the buffer and makes its memory the
// memory of the buffer's data variable.
func (m *machine) bindArray(b *ir.Buffer, arr *ndarray.NDArray) error {
	shape := arr.Shape()
	for d, e := range b.Shape {
		want, err := m.evalInt(e, "shape")
		if err != nil {
			return fmt.Errorf("buffer %q: dimension %d: %w", b.Name, d, err)
		}
		if want != shape[d] {
			return fmt.Errorf("buffer %q: array has shape %s, dimension %d must be %d (%s)", b.Name, shape, d, want, e)
		}
	}
	strides := arr.Strides()
	for d, e := range b.Strides {
		want, err := m.evalInt(e, "stride")
		if err != nil {
			return fmt.Errorf("buffer %q: stride %d: %w", b.Name, d, err)
		}
		if want != strides[d] && shape[d] != 1 {
			return fmt.Errorf("buffer %q: array has strides %v, stride %d must be %d (%s)", b.Name, strides, d, want, e)
		}
	}
	// Memory runs from the array's element 0 (the DLTensor's data plus
	// byte_offset) to its last element, so elem_offset is 0.
	size := int64(b.DType.Size())
	var last int64
	for d := range shape {
		if shape[d] == 0 {
			last = -1
			break
		}
		if strides[d] < 0 {
			return fmt.Errorf("buffer %q: negative strides %v are not supported", b.Name, strides)
		}
		last += (shape[d] - 1) * strides[d]
	}
	lay := &layout{shape: shape, strides: strides}
	if b.ElemOffset != nil {
		want, err := m.evalInt(b.ElemOffset, "elem_offset")
		if err != nil {
			return fmt.Errorf("buffer %q: %w", b.Name, err)
		}
		if want != 0 {
			return fmt.Errorf("buffer %q: elem_offset %s is %d; the interpreter addresses arrays from their element 0 and needs 0", b.Name, b.ElemOffset, want)
		}
	}
	n := (last + 1) * size
	var data []byte
	if n > 0 {
		data = arr.Data().HostBytes(n)
	}
	mem := &memory{name: b.Name, data: data, arr: arr}
	m.mem[b.Data] = mem
	m.layouts[b] = lay
	return nil
}

func scalarArg(p *ir.Var, arg any) (Value, error) {
	t := p.Type
	bad := func() (Value, error) {
		return Value{}, fmt.Errorf("parameter %q: want a %s scalar, got %T", p.Name, t, arg)
	}
	switch x := arg.(type) {
	case bool:
		if !ir.IsBool(t) {
			return bad()
		}
		return Bool(x), nil
	case int:
		return intArg(t, int64(x), bad)
	case int8:
		return intArg(t, int64(x), bad)
	case int16:
		return intArg(t, int64(x), bad)
	case int32:
		return intArg(t, int64(x), bad)
	case int64:
		return intArg(t, x, bad)
	case uint8:
		return intArg(t, int64(x), bad)
	case uint16:
		return intArg(t, int64(x), bad)
	case uint32:
		return intArg(t, int64(x), bad)
	case uint64:
		if !t.IsInt() || t.Lanes > 1 {
			return bad()
		}
		return Uint(t, x), nil
	case float32:
		if !t.IsFloat() || t.Lanes > 1 {
			return bad()
		}
		return Float(t, float64(x)), nil
	case float64:
		if !t.IsFloat() || t.Lanes > 1 {
			return bad()
		}
		return Float(t, x), nil
	case Value:
		if x.Type != t {
			return Value{}, fmt.Errorf("parameter %q: want a %s, got a %s", p.Name, t, x.Type)
		}
		return x, nil
	}
	return bad()
}

func intArg(t ir.DType, v int64, bad func() (Value, error)) (Value, error) {
	if t.Lanes > 1 || !(t.IsInt() || t.IsFloat() || ir.IsBool(t)) {
		return bad()
	}
	return Int(t, v), nil
}

// layoutOf returns b's evaluated layout, computing it on first use.
func (m *machine) layoutOf(b *ir.Buffer) (*layout, error) {
	if l, ok := m.layouts[b]; ok {
		return l, nil
	}
	l := &layout{shape: make([]int64, len(b.Shape))}
	for d, e := range b.Shape {
		v, err := m.evalInt(e, "shape")
		if err != nil {
			return nil, fmt.Errorf("buffer %q: %w", b.Name, err)
		}
		l.shape[d] = v
	}
	if b.Strides != nil {
		l.strides = make([]int64, len(b.Strides))
		for d, e := range b.Strides {
			v, err := m.evalInt(e, "stride")
			if err != nil {
				return nil, fmt.Errorf("buffer %q: %w", b.Name, err)
			}
			l.strides[d] = v
		}
	} else {
		l.strides = ndarray.CompactStrides(l.shape)
	}
	if b.ElemOffset != nil {
		v, err := m.evalInt(b.ElemOffset, "elem_offset")
		if err != nil {
			return nil, fmt.Errorf("buffer %q: %w", b.Name, err)
		}
		l.offset = v
	}
	m.layouts[b] = l
	return l, nil
}

// address returns the memory and byte offset of b[indices].
func (m *machine) address(b *ir.Buffer, indices []int64, verb string) (*memory, int, error) {
	mem := m.mem[b.Data]
	if mem == nil {
		return nil, 0, fmt.Errorf("%s %q: buffer has no memory (data %q is not allocated)", verb, b.Name, b.Data.Name)
	}
	if mem.threads != nil {
		mem = m.threadCopy(mem)
	}
	l, err := m.layoutOf(b)
	if err != nil {
		return nil, 0, err
	}
	if len(indices) != len(l.shape) {
		return nil, 0, fmt.Errorf("%s %q: %d indices for %d dimensions", verb, b.Name, len(indices), len(l.shape))
	}
	flat := l.offset
	for d, ix := range indices {
		if ix < 0 || ix >= l.shape[d] {
			return nil, 0, fmt.Errorf("%s %q: index %s %w of shape %s", verb, b.Name, fmtIndex(indices), ErrOutOfBounds, fmtIndex(l.shape))
		}
		flat += ix * l.strides[d]
	}
	size := int64(b.DType.Size())
	if flat < 0 || flat > int64(len(mem.data))/size-1 {
		return nil, 0, fmt.Errorf("%s %q: index %s (element %d) %w of the %d bytes of %q", verb, b.Name, fmtIndex(indices), flat, ErrOutOfBounds, len(mem.data), mem.name)
	}
	return mem, int(flat * size), nil
}

func fmtIndex(ix []int64) string {
	parts := make([]string, len(ix))
	for i, v := range ix {
		parts[i] = fmt.Sprint(v)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// Load reads b[indices] (Env).
func (m *machine) Load(b *ir.Buffer, indices []int64) (Value, error) {
	mem, off, err := m.address(b, indices, "load from")
	if err != nil {
		return Value{}, err
	}
	if mem.shared {
		if err := m.shared(mem, off, b, indices, false); err != nil {
			return Value{}, err
		}
	}
	t := b.DType
	es := int(t.Bits+7) / 8
	lanes := make([]uint64, max(int(t.Lanes), 1))
	for i := range lanes {
		lanes[i] = readLane(t, mem.data[off+i*es:])
	}
	return fromLanes(t, lanes), nil
}

func (m *machine) store(b *ir.Buffer, indices []int64, v Value) error {
	mem, off, err := m.address(b, indices, "store to")
	if err != nil {
		return err
	}
	if mem.shared {
		if err := m.shared(mem, off, b, indices, true); err != nil {
			return err
		}
	}
	t := b.DType
	if v.Type != t {
		return fmt.Errorf("store to %q: value of dtype %s, buffer holds %s", b.Name, v.Type, t)
	}
	es := int(t.Bits+7) / 8
	for i := range v.Lanes() {
		writeLane(t, mem.data[off+i*es:], lane(v, i))
	}
	return nil
}

func readLane(t ir.DType, b []byte) uint64 {
	switch {
	case t.IsFloat8():
		return math.Float64bits(ndarray.Float8Value(t.Code, b[0]))
	case t.Code == ndarray.BFloat:
		return math.Float64bits(float64(bfloat16ToFloat32(binary.LittleEndian.Uint16(b))))
	case t.Code == ndarray.Float && t.Bits == 16:
		return math.Float64bits(float64(halfToFloat32(binary.LittleEndian.Uint16(b))))
	case t.Code == ndarray.Float && t.Bits == 32:
		return math.Float64bits(float64(math.Float32frombits(binary.LittleEndian.Uint32(b))))
	case t.Code == ndarray.Float:
		return binary.LittleEndian.Uint64(b)
	}
	var raw uint64
	switch t.Bits {
	case 1, 8:
		raw = uint64(b[0])
	case 16:
		raw = uint64(binary.LittleEndian.Uint16(b))
	case 32:
		raw = uint64(binary.LittleEndian.Uint32(b))
	default:
		raw = binary.LittleEndian.Uint64(b)
	}
	return uint64(wrap(t.Scalar(), int64(raw)))
}

func writeLane(t ir.DType, b []byte, v uint64) {
	switch {
	case t.IsFloat8():
		b[0] = ndarray.Float8Bits(t.Code, math.Float64frombits(v))
		return
	case t.Code == ndarray.BFloat:
		binary.LittleEndian.PutUint16(b, float32ToBfloat16(float32(math.Float64frombits(v))))
		return
	case t.Code == ndarray.Float && t.Bits == 16:
		binary.LittleEndian.PutUint16(b, float32ToHalf(float32(math.Float64frombits(v))))
		return
	case t.Code == ndarray.Float && t.Bits == 32:
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(math.Float64frombits(v))))
		return
	}
	switch t.Bits {
	case 1, 8:
		b[0] = byte(v)
	case 16:
		binary.LittleEndian.PutUint16(b, uint16(v))
	case 32:
		binary.LittleEndian.PutUint32(b, uint32(v))
	default:
		binary.LittleEndian.PutUint64(b, v)
	}
}
