package vm

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// Options configure a VM.
type Options struct {
	// MemoryCfg picks the storage allocator: MemoryNaive or MemoryPooled
	// ("" means pooled).
	MemoryCfg string
	// MaxSteps stops an invocation after that many instructions with
	// ErrStepLimit (0: no limit).
	MaxSteps int64
	// MaxDepth bounds nested VM function calls (0: DefaultMaxDepth).
	MaxDepth int
	// MaxAllocBytes refuses any single alloc_storage larger than this
	// (0: no limit).
	MaxAllocBytes int64
	// NoCallCache makes vm.builtin.call_cached call its function every
	// time (see BuiltinCallCached).
	NoCallCache bool
	// Profile times every kernel call; VM.Profile reports the totals per
	// kernel. The timing costs two clock reads per call.
	Profile bool
}

// DefaultMaxDepth is the call depth a VM allows when Options.MaxDepth is 0.
const DefaultMaxDepth = 1024

// Errors callers branch on.
var (
	// ErrStepLimit: an invocation ran more than Options.MaxSteps
	// instructions.
	ErrStepLimit = errors.New("step limit reached")
	// ErrNoFunction: the executable has no function of that name.
	ErrNoFunction = errors.New("no such function")
	// ErrNotReady: InvokeStateful before SetInput, or GetOutputs before
	// InvokeStateful.
	ErrNotReady = errors.New("not ready")
)

// opcodes after linking.
type lop uint8

const (
	lopKernel lop = iota // packedfunc call
	lopBuiltin
	lopVM
	lopRet
	lopGoto
	lopIf
	lopAllocStorage // alloc_storage with constant operands
	lopAllocTensor  // alloc_tensor with constant offset, shape and dtype
	lopShapeOf      // shape_of, reusing the last shape Value when equal
	lopCached       // call_cached of a VM function (args[1:])
)

// allocSpec holds the operands of a specialized alloc_storage or
// alloc_tensor, decoded at link time.
type allocSpec struct {
	nbytes int64
	dev    devices.Device
	scope  string
	offset int64
	shape  ndarray.Shape
	dtype  ndarray.DType
}

type linkedInstr struct {
	op     lop
	dst    int32
	target int32
	callee int32 // VM function index
	args   []Arg
	fn     *packedfunc.Func
	bi     builtinFn
	spec   *allocSpec
	last   *packedfunc.Value // lopShapeOf: the shape it returned last
	cache  *callCache        // lopCached
	name   string
}

type dimCheck struct {
	static int64
	sym    int // index into linkedFunc.syms, or -1
}

type paramCheck struct {
	kind  ParamKind
	dtype ndarray.DType
	ndim  int
	dims  []dimCheck
}

type linkedFunc struct {
	f      *Function
	checks []paramCheck
	syms   []string
	code   []linkedInstr

	inputs    []Value
	hasInputs bool
	output    Value
	hasOutput bool
}

// VM runs an Executable. It is not safe for concurrent use.
type VM struct {
	packedfunc.ImportList
	exec    *Executable
	devs    []devices.Device
	alloc   allocator
	consts  []Value
	funcs   []linkedFunc
	byName  map[string]int
	opts    Options
	stack   []Value
	kargs   []packedfunc.Value
	bargs   []Value
	owned   []*storage
	depth   int
	running bool
	steps   int64
	closed  bool
	prof    *profile
	thread  *osThread // runs invocations on the VM's own OS thread (see invoke)
}

// New links an executable for running on dev: its constants are copied to
// the device, every call is resolved (VM functions, builtins, then kernels
// from the kernels module — which may be nil — then the global packedfunc
// registry), and the allocator named by opts.MemoryCfg is made. Device
// index 0 of alloc_storage is dev; index 1 is the host CPU when dev is not
// the CPU.
func New(exec *Executable, kernels packedfunc.Module, dev devices.Device, opts Options) (*VM, error) {
	if exec == nil {
		return nil, errors.New("vm: nil executable")
	}
	if err := exec.Validate(); err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	alloc, err := newAllocator(opts.MemoryCfg)
	if err != nil {
		return nil, err
	}
	if opts.MaxDepth <= 0 {
		opts.MaxDepth = DefaultMaxDepth
	}
	m := &VM{exec: exec, devs: []devices.Device{dev}, alloc: alloc, opts: opts, byName: map[string]int{}}
	if opts.Profile {
		m.prof = &profile{byName: map[string]*kernelSamples{}}
	}
	if dev.Type != devices.CPU {
		m.devs = append(m.devs, devices.CPUDevice)
	}
	if kernels != nil {
		m.Import(kernels)
	}
	if err := m.loadConstants(); err != nil {
		return nil, err
	}
	for i, f := range exec.Functions {
		m.byName[f.Name] = i
	}
	maxArgs := 0
	m.funcs = make([]linkedFunc, len(exec.Functions))
	for i := range exec.Functions {
		f := &exec.Functions[i]
		lf := &m.funcs[i]
		lf.f = f
		lf.checks, lf.syms = compileChecks(f.Params)
		lf.code = make([]linkedInstr, len(f.Code))
		for pc, in := range f.Code {
			li := linkedInstr{dst: int32(in.Dst), target: in.Target, args: in.Args}
			switch in.Op {
			case OpRet:
				li.op = lopRet
			case OpGoto:
				li.op = lopGoto
			case OpIf:
				li.op = lopIf
			case OpCall:
				maxArgs = max(maxArgs, len(in.Args))
				ref := exec.FuncTable[in.Func]
				li.name = ref.Name
				switch ref.Kind {
				case FuncVM:
					li.op, li.callee = lopVM, int32(m.byName[ref.Name])
				case FuncBuiltin:
					bi, _ := builtinIndex(ref.Name)
					li.op, li.bi = lopBuiltin, builtins[bi].fn
					m.specialize(&li)
					if ref.Name == BuiltinCallCached {
						m.linkCached(&li)
					}
				case FuncExtern:
					fn, err := m.resolve(kernels, ref.Name)
					if err != nil {
						return nil, fmt.Errorf("vm: function %q instruction %d: %w", f.Name, pc, err)
					}
					li.op, li.fn = lopKernel, fn
				}
			}
			lf.code[pc] = li
		}
	}
	m.kargs = make([]packedfunc.Value, maxArgs)
	m.bargs = make([]Value, maxArgs)
	return m, nil
}

// specialize turns an alloc_storage or alloc_tensor whose operands (but
// the storage) are constants into a specialized instruction. When decoding
// the operands fails it leaves the generic builtin, which reports the
// error when the instruction runs.
func (m *VM) specialize(li *linkedInstr) {
	consts := func(from int) ([]Value, bool) {
		vals := make([]Value, len(li.args))
		for i, a := range li.args {
			switch a.Kind {
			case ArgConst:
				vals[i] = m.consts[a.Value]
			case ArgImm:
				vals[i] = Value{v: packedfunc.Int(a.Value)}
			default:
				if i >= from {
					return nil, false
				}
			}
		}
		return vals, true
	}
	switch li.name {
	case BuiltinShapeOf:
		li.op, li.last = lopShapeOf, new(packedfunc.Value)
	case BuiltinAllocStorage:
		vals, ok := consts(0)
		if !ok {
			return
		}
		nbytes, dev, scope, err := m.storageArgs(vals)
		if err != nil {
			return
		}
		li.op, li.spec = lopAllocStorage, &allocSpec{nbytes: nbytes, dev: dev, scope: scope}
	case BuiltinAllocTensor:
		vals, ok := consts(1)
		if !ok {
			return
		}
		offset, err1 := argInt(vals, 1, "")
		shape, err2 := argShape(vals, 2, "")
		dt, err3 := argDType(vals, 3, "")
		if err1 != nil || err2 != nil || err3 != nil || offset < 0 || shape.Validate() != nil || !validDType(dt) {
			return
		}
		li.op, li.spec = lopAllocTensor, &allocSpec{offset: offset, shape: shape, dtype: dt}
	}
}

func (m *VM) resolve(kernels packedfunc.Module, name string) (*packedfunc.Func, error) {
	if kernels != nil {
		if fn, err := kernels.GetFunction(name); err == nil {
			return fn, nil
		}
	}
	if fn, err := packedfunc.Get(name); err == nil {
		return fn, nil
	}
	where := "the global registry (no kernel module given)"
	if kernels != nil {
		where = fmt.Sprintf("the %s kernel module nor the global registry", kernels.Type())
	}
	return nil, fmt.Errorf("kernel %q: not in %s: %w", name, where, packedfunc.ErrNotFound)
}

func (m *VM) loadConstants() error {
	m.consts = make([]Value, len(m.exec.Constants))
	for i, c := range m.exec.Constants {
		var v packedfunc.Value
		switch c.Kind {
		case ConstNil:
		case ConstInt:
			v = packedfunc.Int(c.Int)
		case ConstFloat:
			v = packedfunc.Float(c.Float)
		case ConstString:
			v = packedfunc.String(c.Str)
		case ConstDType:
			v = packedfunc.DTypeValue(c.DType)
		case ConstShape:
			v = packedfunc.ShapeValue(c.Shape)
		case ConstTensor:
			a, err := ndarray.FromBytes(c.Data, c.Shape, c.DType, m.devs[0])
			if err != nil {
				return fmt.Errorf("vm: constant %d: %w", i, err)
			}
			v = packedfunc.Array(a)
		}
		m.consts[i] = Value{v: v}
	}
	return nil
}

func compileChecks(params []Param) ([]paramCheck, []string) {
	var syms []string
	out := make([]paramCheck, len(params))
	for i, p := range params {
		pc := paramCheck{kind: p.Kind, dtype: p.DType, ndim: p.NDim}
		if p.Kind == ParamTensor && p.Shape != nil {
			pc.dims = make([]dimCheck, len(p.Shape))
			for j, d := range p.Shape {
				if d.Name == "" {
					pc.dims[j] = dimCheck{static: d.Value, sym: -1}
					continue
				}
				k := slices.Index(syms, d.Name)
				if k < 0 {
					k = len(syms)
					syms = append(syms, d.Name)
				}
				pc.dims[j] = dimCheck{sym: k}
			}
		}
		out[i] = pc
	}
	return out, syms
}

// checkArgs validates a frame's arguments against the function's
// parameters.
func (lf *linkedFunc) checkArgs(args []Value) error {
	var symStack [8]int64
	var setStack [8]int8
	symVal, symSet := symStack[:], setStack[:] // symSet: parameter index + 1
	if len(lf.syms) > len(symStack) {
		symVal, symSet = make([]int64, len(lf.syms)), make([]int8, len(lf.syms))
	}
	params := lf.f.Params
	for i := range lf.checks {
		c := &lf.checks[i]
		a := &args[i]
		switch c.kind {
		case ParamAny:
			continue
		case ParamTuple:
			if a.tup == nil {
				return lf.paramErr(i, "%w: want tuple, got %s", packedfunc.ErrType, a.kindName())
			}
			continue
		case ParamInt:
			if a.tup != nil || a.v.Kind() != packedfunc.KindInt {
				return lf.paramErr(i, "%w: want int, got %s", packedfunc.ErrType, a.kindName())
			}
			continue
		case ParamFloat:
			if a.tup != nil || (a.v.Kind() != packedfunc.KindFloat && a.v.Kind() != packedfunc.KindInt) {
				return lf.paramErr(i, "%w: want float, got %s", packedfunc.ErrType, a.kindName())
			}
			continue
		case ParamShape:
			if a.tup != nil || a.v.Kind() != packedfunc.KindShape {
				return lf.paramErr(i, "%w: want shape, got %s", packedfunc.ErrType, a.kindName())
			}
			continue
		}
		if a.tup != nil || a.v.Kind() != packedfunc.KindNDArray {
			return lf.paramErr(i, "%w: want %s, got %s", packedfunc.ErrType, params[i].TypeString(), a.kindName())
		}
		arr, _ := a.v.AsArray()
		shape := arr.Shape()
		if c.dtype != (ndarray.DType{}) && arr.DType() != c.dtype {
			return lf.paramErr(i, "%w: got %s %s, want %s", packedfunc.ErrType, shape, arr.DType(), params[i].TypeString())
		}
		if c.ndim >= 0 && len(shape) != c.ndim {
			if params[i].Shape != nil {
				return lf.paramErr(i, "%w: shape %s, want %s", packedfunc.ErrType, shape, dimsString(params[i].Shape))
			}
			return lf.paramErr(i, "%w: shape %s has %d dimensions, want %d", packedfunc.ErrType, shape, len(shape), c.ndim)
		}
		for j, d := range c.dims {
			if d.sym < 0 {
				if shape[j] != d.static {
					return lf.paramErr(i, "%w: shape %s, want %s", packedfunc.ErrType, shape, dimsString(params[i].Shape))
				}
				continue
			}
			if symSet[d.sym] != 0 && symVal[d.sym] != shape[j] {
				first := int(symSet[d.sym]) - 1
				return lf.paramErr(i, "%w: shape %s, want %s: %s is %d here but %d in parameter %d %q", packedfunc.ErrType,
					shape, dimsString(params[i].Shape), lf.syms[d.sym], shape[j], symVal[d.sym], first, params[first].Name)
			}
			symVal[d.sym] = shape[j]
			if symSet[d.sym] == 0 {
				symSet[d.sym] = int8(min(i+1, 127))
			}
		}
	}
	return nil
}

// paramErr is the error for a bad argument to parameter i.
func (lf *linkedFunc) paramErr(i int, format string, x ...any) error {
	return fmt.Errorf("%s: parameter %d %q: "+format, append([]any{lf.f.Name, i, lf.f.Params[i].Name}, x...)...)
}

// Executable is the program the VM runs.
func (m *VM) Executable() *Executable { return m.exec }

// Devices are the devices alloc_storage's device index selects.
func (m *VM) Devices() []devices.Device { return slices.Clone(m.devs) }

// Stats reports the allocator's counters.
func (m *VM) Stats() AllocStats { return m.alloc.stats() }

func (m *VM) lookup(name string) (int, error) {
	fi, ok := m.byName[name]
	if !ok {
		return 0, fmt.Errorf("vm: function %q: %w (executable has %v)", name, ErrNoFunction, m.exec.FunctionNames())
	}
	return fi, nil
}

// Invoke calls a VM function directly with parameters and returns its
// result. The arguments are checked against the function's parameters
// (count, kind, dtype, shape with symbolic dimensions).
func (m *VM) Invoke(name string, args ...packedfunc.Value) (Value, error) {
	fi, err := m.lookup(name)
	if err != nil {
		return Value{}, err
	}
	if err := m.enter(fi, len(args)); err != nil {
		return Value{}, err
	}
	for i, a := range args {
		m.stack[i] = Value{v: a}
	}
	return m.invoke(fi)
}

// InvokeValues is Invoke with VM Values (tuples allowed) as arguments.
func (m *VM) InvokeValues(name string, args ...Value) (Value, error) {
	fi, err := m.lookup(name)
	if err != nil {
		return Value{}, err
	}
	if err := m.enter(fi, len(args)); err != nil {
		return Value{}, err
	}
	copy(m.stack, args)
	return m.invoke(fi)
}

// enter checks the argument count and makes room for the top frame.
func (m *VM) enter(fi int, nargs int) error {
	lf := &m.funcs[fi]
	if m.closed {
		return fmt.Errorf("vm: %s: VM is closed", lf.f.Name)
	}
	if m.running {
		return fmt.Errorf("vm: %s: VM is already running an invocation (a VM is not reentrant)", lf.f.Name)
	}
	if nargs != len(lf.f.Params) {
		return fmt.Errorf("vm: %s: %w: want %d (%s), got %d", lf.f.Name, packedfunc.ErrArity, len(lf.f.Params), paramNames(lf.f.Params), nargs)
	}
	m.grow(lf.f.NumRegs)
	return nil
}

func paramNames(ps []Param) string {
	var s string
	for i, p := range ps {
		if i > 0 {
			s += ", "
		}
		s += p.Name
	}
	return s
}

func (m *VM) grow(n int) {
	if n > len(m.stack) {
		m.stack = slices.Grow(m.stack[:len(m.stack):len(m.stack)], n-len(m.stack))[:n]
	}
}

// invoke runs function fi on the arguments already in the bottom frame and
// settles storage ownership.
//
// Every invocation of a VM runs on the same OS thread, the VM's own. kiln's
// thread pool is one per process and does not care, but kernels of
// artifacts built before it ran their parallel loops with OpenMP, whose
// runtime keeps a team of worker threads per calling thread, and those workers
// spin for a while after each parallel loop, waiting for the next. Calls
// that moved between threads, from one kernel to the next or from one
// invocation to the next, would start a team on each, and the idle teams'
// spinning would take the cores from the working one (the onnx benchmark's
// transformer layer on two threads: 0.2 ms a run when its invocations
// hopped between threads, 0.1 ms on one).
func (m *VM) invoke(fi int) (res Value, err error) {
	if m.thread == nil {
		m.thread = startOSThread()
		// A VM dropped without Close ends its thread too.
		runtime.AddCleanup(m, (*osThread).stop, m.thread)
	}
	m.thread.work <- func() {
		defer func() { m.thread.done <- recover() }()
		res, err = m.invokeHere(fi)
	}
	if p := <-m.thread.done; p != nil {
		panic(p)
	}
	return res, err
}

// osThread is a goroutine locked to its OS thread that runs the functions
// sent to it, one at a time.
type osThread struct {
	work chan func()
	done chan any // each function's panic value, nil when it returned
	once sync.Once
}

func startOSThread() *osThread {
	t := &osThread{work: make(chan func()), done: make(chan any, 1)}
	go func() {
		// The thread stays locked to the end: it exits with the goroutine
		// once stop closes the channel, its OpenMP team with it.
		runtime.LockOSThread()
		for f := range t.work {
			f()
		}
	}()
	return t
}

func (t *osThread) stop() { t.once.Do(func() { close(t.work) }) }

func (m *VM) invokeHere(fi int) (Value, error) {
	lf := &m.funcs[fi]
	n := lf.f.NumRegs
	m.running = true
	m.steps = 0
	res, err := m.call(fi, 0)
	clear(m.stack[:n])
	m.running = false
	if err != nil {
		res = Value{}
		if _, ok := err.(*Error); !ok {
			err = fmt.Errorf("vm: %w", err)
		}
	}
	m.settle(res)
	return res, err
}

// settle hands the storage reachable from res to the caller and gives the
// rest back to the allocator.
func (m *VM) settle(res Value) {
	if len(m.owned) == 0 {
		return
	}
	markEscaped(res)
	for i, s := range m.owned {
		if s.escaped {
			m.alloc.escape(s)
		} else {
			m.alloc.release(s)
		}
		m.owned[i] = nil
	}
	m.owned = m.owned[:0]
}

func markEscaped(v Value) {
	if v.st != nil {
		v.st.escaped = true
	}
	if v.tup != nil {
		for _, f := range v.tup.fields {
			markEscaped(f)
		}
	}
}

// call runs function fi with its frame at stack[base:], arguments in
// place; it checks them first.
func (m *VM) call(fi int, base int) (Value, error) {
	lf := &m.funcs[fi]
	f := lf.f
	np := len(f.Params)
	if err := lf.checkArgs(m.stack[base : base+np]); err != nil {
		return Value{}, err
	}
	code := lf.code
	pc := 0
	for {
		if m.opts.MaxSteps > 0 {
			if m.steps++; m.steps > m.opts.MaxSteps {
				return Value{}, at(fmt.Errorf("%w (%d)", ErrStepLimit, m.opts.MaxSteps), Frame{Func: f.Name, PC: pc})
			}
		}
		in := &code[pc]
		switch in.op {
		case lopKernel:
			kargs := m.kargs[:len(in.args)]
			for i, a := range in.args {
				var v *Value
				switch a.Kind {
				case ArgReg:
					v = &m.stack[base+int(a.Value)]
				case ArgConst:
					v = &m.consts[a.Value]
				default:
					kargs[i] = packedfunc.Int(a.Value)
					continue
				}
				if v.tup != nil || (v.st != nil && v.v.IsNil()) {
					return Value{}, m.fail(f, pc, in, fmt.Errorf("argument %d (%s) is a %s, which kernels cannot take", i, a, v.kindName()))
				}
				kargs[i] = v.v
			}
			var t0 time.Time
			if m.prof != nil {
				t0 = time.Now()
			}
			r, err := in.fn.Call(kargs...)
			if m.prof != nil {
				m.prof.add(in.name, t0, time.Since(t0))
			}
			if err != nil {
				return Value{}, m.fail(f, pc, in, err)
			}
			if in.dst >= 0 {
				m.stack[base+int(in.dst)] = Value{v: r}
			}
			pc++
		case lopBuiltin:
			bargs := m.bargs[:len(in.args)]
			m.fill(bargs, in.args, base)
			r, err := in.bi(m, bargs)
			clear(bargs)
			if err != nil {
				return Value{}, m.fail(f, pc, in, err)
			}
			if in.dst >= 0 {
				m.stack[base+int(in.dst)] = r
			}
			pc++
		case lopVM:
			if m.depth >= m.opts.MaxDepth {
				return Value{}, m.fail(f, pc, in, fmt.Errorf("call depth exceeds %d", m.opts.MaxDepth))
			}
			callee := &m.funcs[in.callee]
			nb := base + f.NumRegs
			m.grow(nb + callee.f.NumRegs)
			m.fill(m.stack[nb:nb+len(in.args)], in.args, base)
			m.depth++
			r, err := m.call(int(in.callee), nb)
			m.depth--
			clear(m.stack[nb : nb+callee.f.NumRegs])
			if err != nil {
				return Value{}, m.fail(f, pc, in, err)
			}
			if in.dst >= 0 {
				m.stack[base+int(in.dst)] = r
			}
			pc++
		case lopCached:
			args := m.bargs[:len(in.args)-1]
			m.fill(args, in.args[1:], base)
			if !m.opts.NoCallCache && in.cache.hit(args) {
				clear(args)
				if in.dst >= 0 {
					m.stack[base+int(in.dst)] = in.cache.value
				}
				pc++
				continue
			}
			if m.depth >= m.opts.MaxDepth {
				clear(args)
				return Value{}, m.fail(f, pc, in, fmt.Errorf("call depth exceeds %d", m.opts.MaxDepth))
			}
			callee := &m.funcs[in.callee]
			nb := base + f.NumRegs
			m.grow(nb + callee.f.NumRegs)
			copy(m.stack[nb:], args)
			// The callee's builtins reuse m.bargs: take the keys now.
			keys, cacheable := arrayKeys(args)
			clear(args)
			m.depth++
			r, err := m.call(int(in.callee), nb)
			m.depth--
			clear(m.stack[nb : nb+callee.f.NumRegs])
			if err != nil {
				return Value{}, m.fail(f, pc, in, err)
			}
			if cacheable && !m.opts.NoCallCache {
				in.cache.set(keys, r)
			}
			if in.dst >= 0 {
				m.stack[base+int(in.dst)] = r
			}
			pc++
		case lopAllocStorage:
			sp := in.spec
			r, err := m.allocStorage(sp.nbytes, sp.dev, sp.scope)
			if err != nil {
				return Value{}, m.fail(f, pc, in, err)
			}
			if in.dst >= 0 {
				m.stack[base+int(in.dst)] = r
			}
			pc++
		case lopAllocTensor:
			st := &Value{v: packedfunc.Int(in.args[0].Value)}
			if a := in.args[0]; a.Kind == ArgReg {
				st = &m.stack[base+int(a.Value)]
			} else if a.Kind == ArgConst {
				st = &m.consts[a.Value]
			}
			r, err := m.allocTensor(st, in.spec.offset, in.spec.shape, in.spec.dtype)
			if err != nil {
				return Value{}, m.fail(f, pc, in, err)
			}
			if in.dst >= 0 {
				m.stack[base+int(in.dst)] = r
			}
			pc++
		case lopShapeOf:
			x := &Value{v: packedfunc.Int(in.args[0].Value)}
			if a := in.args[0]; a.Kind == ArgReg {
				x = &m.stack[base+int(a.Value)]
			} else if a.Kind == ArgConst {
				x = &m.consts[a.Value]
			}
			arr, err := x.Array()
			if err != nil || arr == nil {
				return Value{}, m.fail(f, pc, in, fmt.Errorf("shape_of: %w: want ndarray, got %s", packedfunc.ErrType, x.kindName()))
			}
			if last, _ := in.last.AsShape(); in.last.Kind() != packedfunc.KindShape || !last.Equal(arr.Shape()) {
				*in.last = packedfunc.ShapeValue(arr.Shape())
			}
			if in.dst >= 0 {
				m.stack[base+int(in.dst)] = Value{v: *in.last}
			}
			pc++
		case lopRet:
			return m.stack[base+int(in.dst)], nil
		case lopGoto:
			pc = int(in.target)
		case lopIf:
			c := &m.stack[base+int(in.dst)]
			if c.tup != nil || c.v.Kind() != packedfunc.KindInt {
				return Value{}, at(fmt.Errorf("if: condition %%%d holds %s, want int", in.dst, c.kindName()), Frame{Func: f.Name, PC: pc})
			}
			if n, _ := c.v.AsInt(); n != 0 {
				pc++
			} else {
				pc = int(in.target)
			}
		}
	}
}

func (m *VM) fill(dst []Value, args []Arg, base int) {
	for i, a := range args {
		switch a.Kind {
		case ArgReg:
			dst[i] = m.stack[base+int(a.Value)]
		case ArgConst:
			dst[i] = m.consts[a.Value]
		default:
			dst[i] = Value{v: packedfunc.Int(a.Value)}
		}
	}
}

func (m *VM) fail(f *Function, pc int, in *linkedInstr, err error) error {
	return at(err, Frame{Func: f.Name, PC: pc, Call: in.name})
}

// Recycle gives the storage behind a result of this VM back to its
// allocator, for the next invocations to reuse: a benchmark or serving
// loop that is done with each result before the next call then runs
// without allocating. The arrays in v (and any view of them) must not be
// used afterwards: with the pooled allocator later results overwrite them,
// with the naive one they are freed. Values the VM did not allocate, and
// storage already recycled, are left alone.
func (m *VM) Recycle(v Value) {
	if m.running {
		return
	}
	if v.tup != nil {
		for _, f := range v.tup.fields {
			m.Recycle(f)
		}
		return
	}
	if s := v.st; s != nil && s.escaped && !s.pinned && s.owner == m.alloc && !m.closed {
		s.escaped = false
		m.alloc.recycle(s)
	}
}

// SetInput stores the arguments of a later InvokeStateful(name), checked
// against the function's parameters now.
func (m *VM) SetInput(name string, args ...packedfunc.Value) error {
	fi, err := m.lookup(name)
	if err != nil {
		return err
	}
	lf := &m.funcs[fi]
	if len(args) != len(lf.f.Params) {
		return fmt.Errorf("vm: set_input %s: %w: want %d (%s), got %d", name, packedfunc.ErrArity, len(lf.f.Params), paramNames(lf.f.Params), len(args))
	}
	in := make([]Value, len(args))
	for i, a := range args {
		in[i] = Value{v: a}
	}
	if err := lf.checkArgs(in); err != nil {
		return fmt.Errorf("vm: set_input %w", err)
	}
	lf.inputs, lf.hasInputs = in, true
	return nil
}

// InvokeStateful runs name on the inputs given to SetInput and keeps the
// result for GetOutputs.
func (m *VM) InvokeStateful(name string) error {
	fi, err := m.lookup(name)
	if err != nil {
		return err
	}
	lf := &m.funcs[fi]
	if !lf.hasInputs {
		return fmt.Errorf("vm: invoke_stateful %s: %w: no inputs (call SetInput first)", name, ErrNotReady)
	}
	if err := m.enter(fi, len(lf.inputs)); err != nil {
		return err
	}
	copy(m.stack, lf.inputs)
	res, err := m.invoke(fi)
	if err != nil {
		lf.output, lf.hasOutput = Value{}, false
		return err
	}
	lf.output, lf.hasOutput = res, true
	return nil
}

// GetOutputs returns the result of the last InvokeStateful(name).
func (m *VM) GetOutputs(name string) (Value, error) {
	fi, err := m.lookup(name)
	if err != nil {
		return Value{}, err
	}
	lf := &m.funcs[fi]
	if !lf.hasOutput {
		return Value{}, fmt.Errorf("vm: get_outputs %s: %w: no outputs (call InvokeStateful first)", name, ErrNotReady)
	}
	return lf.output, nil
}

// Type is "vm" (packedfunc.Module).
func (m *VM) Type() string { return "vm" }

// Functions lists the executable's functions (packedfunc.Module).
func (m *VM) Functions() []string { return m.exec.FunctionNames() }

// GetFunction returns a VM function as a packedfunc.Func that Invokes it
// (a tuple result comes back as a packedfunc tuple), or else a function of
// the kernel module (packedfunc.Module).
func (m *VM) GetFunction(name string) (*packedfunc.Func, error) {
	if _, ok := m.byName[name]; !ok {
		return m.Lookup(name)
	}
	return packedfunc.New(name, func(args []packedfunc.Value) (packedfunc.Value, error) {
		r, err := m.Invoke(name, args...)
		if err != nil {
			return packedfunc.Nil, err
		}
		p, err := r.Packed()
		if err != nil {
			return packedfunc.Nil, fmt.Errorf("vm: %s: result: %w", name, err)
		}
		return p, nil
	}), nil
}

// Close frees the pooled storage and the stored inputs and outputs; later
// invocations fail. Arrays already returned stay valid. Close is
// idempotent.
func (m *VM) Close() error {
	if m.closed {
		return nil
	}
	m.closed = true
	if m.thread != nil {
		m.thread.stop()
	}
	m.alloc.close()
	for i := range m.funcs {
		m.funcs[i].inputs, m.funcs[i].output = nil, Value{}
		m.funcs[i].hasInputs, m.funcs[i].hasOutput = false, false
	}
	return nil
}
