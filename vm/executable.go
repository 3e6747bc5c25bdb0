package vm

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/ndarray"
)

// Limits an executable must respect; Validate enforces them so that a
// hostile vm.bin cannot make the VM allocate without bound.
const (
	// MaxRegs is the most registers one function may use.
	MaxRegs = 1 << 16
	// MaxArgs is the most arguments one call may pass.
	MaxArgs = 1 << 12
)

// ErrInvalid reports an executable that breaks the format's rules; Validate
// and Unmarshal wrap it.
var ErrInvalid = errors.New("invalid executable")

// ConstKind is the type of a constant.
type ConstKind uint8

// Constant kinds.
const (
	ConstNil    ConstKind = 0
	ConstInt    ConstKind = 1
	ConstFloat  ConstKind = 2
	ConstString ConstKind = 3
	ConstDType  ConstKind = 4
	ConstShape  ConstKind = 5
	ConstTensor ConstKind = 6
)

var constKindNames = [...]string{"nil", "int", "float", "string", "dtype", "shape", "tensor"}

// String names the kind.
func (k ConstKind) String() string {
	if int(k) < len(constKindNames) {
		return constKindNames[k]
	}
	return "constkind(" + strconv.Itoa(int(k)) + ")"
}

// Constant is one entry of the constant pool. Kind says which fields hold
// it: Int, Float, Str, DType, Shape, or DType+Shape+Data (a tensor's
// elements as compact little-endian host bytes).
type Constant struct {
	Kind  ConstKind
	Int   int64
	Float float64
	Str   string
	DType ndarray.DType
	Shape ndarray.Shape
	Data  []byte
}

// String prints the constant as the disassembly shows it.
func (c Constant) String() string {
	switch c.Kind {
	case ConstNil:
		return "nil"
	case ConstInt:
		return strconv.FormatInt(c.Int, 10)
	case ConstFloat:
		return strconv.FormatFloat(c.Float, 'g', -1, 64)
	case ConstString:
		return strconv.Quote(c.Str)
	case ConstDType:
		return "dtype " + c.DType.String()
	case ConstShape:
		return "shape " + c.Shape.String()
	case ConstTensor:
		return fmt.Sprintf("tensor %s %s (%d bytes)", c.Shape, c.DType, len(c.Data))
	}
	return c.Kind.String()
}

func (c Constant) equal(o Constant) bool {
	return c.Kind == o.Kind && c.Int == o.Int && math.Float64bits(c.Float) == math.Float64bits(o.Float) &&
		c.Str == o.Str && c.DType == o.DType && c.Shape.Equal(o.Shape) && string(c.Data) == string(o.Data) &&
		(c.Shape == nil) == (o.Shape == nil)
}

// Function is one function of an executable.
type Function struct {
	Name   string
	Params []Param
	// NumRegs is the size of the function's register file, parameters
	// included.
	NumRegs int
	Code    []Instr
}

// Executable is a compiled graph-level program: functions, the constant
// pool and the table of functions that calls name. It is read-only once
// built; several VMs may share one.
type Executable struct {
	Functions []Function
	Constants []Constant
	FuncTable []FuncRef
}

// Function returns the function of that name.
func (e *Executable) Function(name string) (*Function, bool) {
	for i := range e.Functions {
		if e.Functions[i].Name == name {
			return &e.Functions[i], true
		}
	}
	return nil, false
}

// FunctionNames lists the functions in order.
func (e *Executable) FunctionNames() []string {
	out := make([]string, len(e.Functions))
	for i, f := range e.Functions {
		out[i] = f.Name
	}
	return out
}

// Kernels lists, sorted, the external functions the executable calls: the
// kernels the module given to New must provide (or the global registry).
func (e *Executable) Kernels() []string {
	var out []string
	for _, r := range e.FuncTable {
		if r.Kind == FuncExtern {
			out = append(out, r.Name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, a...)...)
}

// validDType reports the dtypes ndarray can hold (the rules of
// ndarray.ParseDType, without handles).
func validDType(d ndarray.DType) bool {
	if d.Lanes == 0 {
		return false
	}
	switch d.Code {
	case ndarray.Int:
		return d.Bits == 8 || d.Bits == 16 || d.Bits == 32 || d.Bits == 64
	case ndarray.UInt:
		return d.Bits == 1 || d.Bits == 8 || d.Bits == 16 || d.Bits == 32 || d.Bits == 64
	case ndarray.Float:
		return d.Bits == 16 || d.Bits == 32 || d.Bits == 64
	case ndarray.BFloat:
		return d.Bits == 16
	case ndarray.Bool:
		return d.Bits == 8
	}
	return false
}

// Validate checks everything the interpreter relies on: unique function
// names, registers, constants and table entries in range, jump targets
// inside the code, no instruction falling off the end, call arities of
// builtins and VM functions, known builtins, well-formed constants and
// parameters. An executable that passes cannot make the VM panic.
func (e *Executable) Validate() error {
	for i, c := range e.Constants {
		if err := c.validate(); err != nil {
			return invalid("constant %d: %v", i, err)
		}
	}
	names := map[string]int{}
	for i, f := range e.Functions {
		if f.Name == "" {
			return invalid("function %d has no name", i)
		}
		if _, dup := names[f.Name]; dup {
			return invalid("function %q defined twice", f.Name)
		}
		names[f.Name] = i
	}
	for i, r := range e.FuncTable {
		switch r.Kind {
		case FuncVM:
			if _, ok := names[r.Name]; !ok {
				return invalid("function table entry %d: no VM function %q", i, r.Name)
			}
		case FuncBuiltin:
			if _, ok := builtinIndex(r.Name); !ok {
				return invalid("function table entry %d: unknown builtin %q", i, r.Name)
			}
		case FuncExtern:
			if r.Name == "" {
				return invalid("function table entry %d: extern with no name", i)
			}
		default:
			return invalid("function table entry %d (%q): bad kind %d", i, r.Name, r.Kind)
		}
	}
	for fi := range e.Functions {
		if err := e.validateFunc(&e.Functions[fi], names); err != nil {
			return err
		}
	}
	return nil
}

func (c Constant) validate() error {
	switch c.Kind {
	case ConstNil, ConstInt, ConstFloat, ConstString:
	case ConstDType:
		if !validDType(c.DType) {
			return fmt.Errorf("bad dtype %s", c.DType)
		}
	case ConstShape:
		if err := c.Shape.Validate(); err != nil {
			return err
		}
	case ConstTensor:
		if !validDType(c.DType) {
			return fmt.Errorf("tensor: bad dtype %s", c.DType)
		}
		if err := c.Shape.Validate(); err != nil {
			return fmt.Errorf("tensor: %w", err)
		}
		n := c.Shape.NumElements()
		sz := int64(c.DType.Size())
		if n > math.MaxInt64/sz || int64(len(c.Data)) != n*sz {
			return fmt.Errorf("tensor %s %s has %d bytes of data, want %d", c.Shape, c.DType, len(c.Data), n*sz)
		}
	default:
		return fmt.Errorf("bad kind %d", c.Kind)
	}
	return nil
}

func validateParam(p Param) error {
	if p.Kind > ParamTuple {
		return fmt.Errorf("bad kind %d", p.Kind)
	}
	if p.NDim < -1 || p.NDim > 1<<16 {
		return fmt.Errorf("bad rank %d", p.NDim)
	}
	if p.Shape != nil && len(p.Shape) != p.NDim {
		return fmt.Errorf("%d dimensions for rank %d", len(p.Shape), p.NDim)
	}
	for _, d := range p.Shape {
		if d.Name == "" && d.Value < 0 {
			return fmt.Errorf("negative dimension %d", d.Value)
		}
	}
	if p.DType != (ndarray.DType{}) && !validDType(p.DType) {
		return fmt.Errorf("bad dtype %s", p.DType)
	}
	return nil
}

func (e *Executable) validateFunc(f *Function, names map[string]int) error {
	where := func(format string, a ...any) error {
		return invalid("function %q: "+format, append([]any{f.Name}, a...)...)
	}
	if f.NumRegs < len(f.Params) || f.NumRegs > MaxRegs {
		return where("%d registers for %d parameters (at most %d)", f.NumRegs, len(f.Params), MaxRegs)
	}
	for i, p := range f.Params {
		if err := validateParam(p); err != nil {
			return where("parameter %d %q: %v", i, p.Name, err)
		}
	}
	if len(f.Code) == 0 {
		return where("no code")
	}
	reg := func(pc int, r Reg, what string) error {
		if r < 0 || int(r) >= f.NumRegs {
			return where("instruction %d: %s register %d out of range (function has %d registers)", pc, what, r, f.NumRegs)
		}
		return nil
	}
	target := func(pc int, t int32) error {
		if t < 0 || int(t) >= len(f.Code) {
			return where("instruction %d: jump target %d outside the code (%d instructions)", pc, t, len(f.Code))
		}
		return nil
	}
	for pc, in := range f.Code {
		switch in.Op {
		case OpCall:
			if in.Dst != NoReg {
				if err := reg(pc, in.Dst, "destination"); err != nil {
					return err
				}
			}
			if in.Func < 0 || int(in.Func) >= len(e.FuncTable) {
				return where("instruction %d: function index %d out of range (table has %d)", pc, in.Func, len(e.FuncTable))
			}
			if len(in.Args) > MaxArgs {
				return where("instruction %d: %d arguments (at most %d)", pc, len(in.Args), MaxArgs)
			}
			for ai, a := range in.Args {
				switch a.Kind {
				case ArgReg:
					if a.Value < 0 || a.Value >= int64(f.NumRegs) {
						return where("instruction %d: argument %d: register %d out of range (function has %d registers)", pc, ai, a.Value, f.NumRegs)
					}
				case ArgConst:
					if a.Value < 0 || a.Value >= int64(len(e.Constants)) {
						return where("instruction %d: argument %d: constant %d out of range (pool has %d)", pc, ai, a.Value, len(e.Constants))
					}
				case ArgImm:
				default:
					return where("instruction %d: argument %d: bad kind %d", pc, ai, a.Kind)
				}
			}
			ref := e.FuncTable[in.Func]
			switch ref.Kind {
			case FuncVM:
				callee := &e.Functions[names[ref.Name]]
				if len(in.Args) != len(callee.Params) {
					return where("instruction %d: calls %q with %d arguments, it takes %d", pc, ref.Name, len(in.Args), len(callee.Params))
				}
			case FuncBuiltin:
				bi, _ := builtinIndex(ref.Name)
				if err := builtins[bi].checkArity(len(in.Args)); err != nil {
					return where("instruction %d: %v", pc, err)
				}
			}
			if pc == len(f.Code)-1 {
				return where("instruction %d: call is the last instruction: execution would fall off the end", pc)
			}
		case OpRet:
			if err := reg(pc, in.Dst, "returned"); err != nil {
				return err
			}
		case OpGoto:
			if err := target(pc, in.Target); err != nil {
				return err
			}
		case OpIf:
			if err := reg(pc, in.Dst, "condition"); err != nil {
				return err
			}
			if err := target(pc, in.Target); err != nil {
				return err
			}
			if pc == len(f.Code)-1 {
				return where("instruction %d: if is the last instruction: execution would fall off the end", pc)
			}
		default:
			return where("instruction %d: bad opcode %d", pc, in.Op)
		}
	}
	return nil
}

// String disassembles the executable: the constant pool, then each
// function with its parameters and code. The text is stable, so tests
// compare it with goldens.
func (e *Executable) String() string {
	var b strings.Builder
	for i, c := range e.Constants {
		fmt.Fprintf(&b, "c%d = %s\n", i, c)
	}
	for _, f := range e.Functions {
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "func %s(", f.Name)
		for i, p := range f.Params {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%%%d %s: %s", i, p.Name, p.TypeString())
		}
		fmt.Fprintf(&b, ") regs=%d\n", f.NumRegs)
		for pc, in := range f.Code {
			fmt.Fprintf(&b, "  %3d: %s\n", pc, e.instrString(in))
		}
	}
	return b.String()
}

func (e *Executable) instrString(in Instr) string {
	switch in.Op {
	case OpCall:
		name := fmt.Sprintf("f%d", in.Func)
		if in.Func >= 0 && int(in.Func) < len(e.FuncTable) {
			name = e.FuncTable[in.Func].Name
		}
		args := make([]string, len(in.Args))
		for i, a := range in.Args {
			args[i] = a.String()
		}
		dst := ""
		if in.Dst != NoReg {
			dst = fmt.Sprintf("%%%d = ", in.Dst)
		}
		return fmt.Sprintf("%scall %s(%s)", dst, name, strings.Join(args, ", "))
	case OpRet:
		return fmt.Sprintf("ret %%%d", in.Dst)
	case OpGoto:
		return fmt.Sprintf("goto %d", in.Target)
	case OpIf:
		return fmt.Sprintf("if %%%d else goto %d", in.Dst, in.Target)
	}
	return in.Op.String()
}
