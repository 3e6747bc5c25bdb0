package vm

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/ndarray"
)

// Builder assembles an Executable; the compiler's VM code generator drives
// it. Constants are deduplicated. Calls name their callee: a function of
// the builder (defined before or after the call), a builtin (vm.builtin.*)
// or, failing both, an external kernel resolved when a VM is made. Misuse
// (a bad register, an unbound label) is reported by Build, never by a panic.
type Builder interface {
	// Function starts a function; its parameters arrive in registers
	// 0..len(params)-1.
	Function(name string, params ...Param) FunctionBuilder
	// Nil, Int, Float, String, DType and Shape add constants.
	Nil() Const
	Int(v int64) Const
	Float(v float64) Const
	String(s string) Const
	DType(dt ndarray.DType) Const
	Shape(dims ...int64) Const
	// Tensor adds a tensor constant holding a copy of a's elements.
	Tensor(a *ndarray.NDArray) (Const, error)
	// Constant adds any constant.
	Constant(c Constant) Const
	// AddSources records model operators that the calls of kernel fn
	// compute (FuncRef.Sources), each once.
	AddSources(fn string, srcs ...Source)
	// Build checks and returns the executable (Validate).
	Build() (*Executable, error)
}

// FunctionBuilder emits the code of one function.
type FunctionBuilder interface {
	// Name is the function's name.
	Name() string
	// Param is the register of parameter i.
	Param(i int) Reg
	// NewReg allocates a register.
	NewReg() Reg
	// Call emits a call whose result goes to a new register, returned.
	Call(fn string, args ...Operand) Reg
	// CallTo emits a call whose result goes to dst (NoReg discards it).
	CallTo(dst Reg, fn string, args ...Operand)
	// Ret emits a return of register r.
	Ret(r Reg)
	// NewLabel makes a jump target to Bind later.
	NewLabel() Label
	// Bind places a label at the next instruction.
	Bind(l Label)
	// Goto emits a jump.
	Goto(l Label)
	// If emits a conditional: execution continues with the next
	// instruction when cond holds a non-zero int and jumps to elseLabel
	// otherwise.
	If(cond Reg, elseLabel Label)
}

// Label is a jump target inside one function.
type Label int

// NewBuilder starts an empty executable.
func NewBuilder() Builder { return &builder{} }

type builder struct {
	consts  []Constant
	funcs   []*funcBuilder
	errs    []error
	sources map[string][]Source
}

func (b *builder) AddSources(fn string, srcs ...Source) {
	if b.sources == nil {
		b.sources = map[string][]Source{}
	}
	for _, s := range srcs {
		if !slices.Contains(b.sources[fn], s) {
			b.sources[fn] = append(b.sources[fn], s)
		}
	}
}

type pendingCall struct {
	pc   int
	name string
}

type funcBuilder struct {
	b      *builder
	fn     Function
	calls  []pendingCall
	labels []int // label -> pc, -1 while unbound
	jumps  []int // pcs of goto/if whose Target is a label
}

func (b *builder) errorf(format string, a ...any) {
	b.errs = append(b.errs, fmt.Errorf(format, a...))
}

func (b *builder) Constant(c Constant) Const {
	for i, o := range b.consts {
		if o.equal(c) {
			return Const(i)
		}
	}
	b.consts = append(b.consts, c)
	return Const(len(b.consts) - 1)
}

func (b *builder) Nil() Const            { return b.Constant(Constant{Kind: ConstNil}) }
func (b *builder) Int(v int64) Const     { return b.Constant(Constant{Kind: ConstInt, Int: v}) }
func (b *builder) Float(v float64) Const { return b.Constant(Constant{Kind: ConstFloat, Float: v}) }
func (b *builder) String(s string) Const { return b.Constant(Constant{Kind: ConstString, Str: s}) }
func (b *builder) DType(d ndarray.DType) Const {
	return b.Constant(Constant{Kind: ConstDType, DType: d})
}
func (b *builder) Shape(dims ...int64) Const {
	return b.Constant(Constant{Kind: ConstShape, Shape: append(ndarray.Shape{}, dims...)})
}

func (b *builder) Tensor(a *ndarray.NDArray) (Const, error) {
	if a == nil {
		return 0, errors.New("vm builder: tensor constant: nil array")
	}
	data, err := a.Bytes()
	if err != nil {
		return 0, fmt.Errorf("vm builder: tensor constant: %w", err)
	}
	if !a.IsContiguous() {
		return 0, fmt.Errorf("vm builder: tensor constant: array %s is not contiguous", a.Shape())
	}
	return b.Constant(Constant{Kind: ConstTensor, DType: a.DType(), Shape: a.Shape().Clone(), Data: data}), nil
}

func (b *builder) Function(name string, params ...Param) FunctionBuilder {
	fb := &funcBuilder{b: b, fn: Function{Name: name, Params: append([]Param{}, params...), NumRegs: len(params)}}
	b.funcs = append(b.funcs, fb)
	return fb
}

func (f *funcBuilder) Name() string { return f.fn.Name }

func (f *funcBuilder) Param(i int) Reg {
	if i < 0 || i >= len(f.fn.Params) {
		f.b.errorf("vm builder: function %q: parameter %d of %d", f.fn.Name, i, len(f.fn.Params))
		return NoReg
	}
	return Reg(i)
}

func (f *funcBuilder) NewReg() Reg {
	f.fn.NumRegs++
	return Reg(f.fn.NumRegs - 1)
}

func (f *funcBuilder) Call(fn string, args ...Operand) Reg {
	r := f.NewReg()
	f.CallTo(r, fn, args...)
	return r
}

func (f *funcBuilder) CallTo(dst Reg, fn string, args ...Operand) {
	as := make([]Arg, len(args))
	for i, a := range args {
		if a == nil {
			f.b.errorf("vm builder: function %q: call %q: argument %d is nil", f.fn.Name, fn, i)
			continue
		}
		as[i] = a.arg()
	}
	f.calls = append(f.calls, pendingCall{pc: len(f.fn.Code), name: fn})
	f.fn.Code = append(f.fn.Code, Instr{Op: OpCall, Dst: dst, Args: as})
}

func (f *funcBuilder) Ret(r Reg) { f.fn.Code = append(f.fn.Code, Instr{Op: OpRet, Dst: r}) }

func (f *funcBuilder) NewLabel() Label {
	f.labels = append(f.labels, -1)
	return Label(len(f.labels) - 1)
}

func (f *funcBuilder) Bind(l Label) {
	if l < 0 || int(l) >= len(f.labels) {
		f.b.errorf("vm builder: function %q: bind of unknown label %d", f.fn.Name, l)
		return
	}
	if f.labels[l] >= 0 {
		f.b.errorf("vm builder: function %q: label %d bound twice", f.fn.Name, l)
		return
	}
	f.labels[l] = len(f.fn.Code)
}

func (f *funcBuilder) Goto(l Label) {
	f.jumps = append(f.jumps, len(f.fn.Code))
	f.fn.Code = append(f.fn.Code, Instr{Op: OpGoto, Target: int32(l)})
}

func (f *funcBuilder) If(cond Reg, elseLabel Label) {
	f.jumps = append(f.jumps, len(f.fn.Code))
	f.fn.Code = append(f.fn.Code, Instr{Op: OpIf, Dst: cond, Target: int32(elseLabel)})
}

func (b *builder) Build() (*Executable, error) {
	if len(b.errs) > 0 {
		return nil, errors.Join(b.errs...)
	}
	exe := &Executable{Constants: append([]Constant{}, b.consts...)}
	names := map[string]bool{}
	for _, f := range b.funcs {
		names[f.fn.Name] = true
		if _, ok := builtinIndex(f.fn.Name); ok {
			return nil, fmt.Errorf("vm builder: function %q has the name of a builtin", f.fn.Name)
		}
	}
	table := map[string]int32{}
	for _, f := range b.funcs {
		fn := f.fn
		fn.Code = append([]Instr{}, f.fn.Code...)
		for _, pc := range f.jumps {
			l := fn.Code[pc].Target
			if l < 0 || int(l) >= len(f.labels) || f.labels[l] < 0 {
				return nil, fmt.Errorf("vm builder: function %q: instruction %d jumps to label %d, which is not bound", fn.Name, pc, l)
			}
			fn.Code[pc].Target = int32(f.labels[l])
		}
		for _, c := range f.calls {
			idx, ok := table[c.name]
			if !ok {
				kind := FuncExtern
				if names[c.name] {
					kind = FuncVM
				} else if _, isBuiltin := builtinIndex(c.name); isBuiltin {
					kind = FuncBuiltin
				}
				idx = int32(len(exe.FuncTable))
				table[c.name] = idx
				ref := FuncRef{Kind: kind, Name: c.name}
				if kind == FuncExtern {
					ref.Sources = slices.Clone(b.sources[c.name])
				}
				exe.FuncTable = append(exe.FuncTable, ref)
			}
			fn.Code[c.pc].Func = idx
		}
		exe.Functions = append(exe.Functions, fn)
	}
	if err := exe.Validate(); err != nil {
		return nil, fmt.Errorf("vm builder: %w", err)
	}
	return exe, nil
}
