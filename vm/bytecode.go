package vm

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/ndarray"
)

// Opcode is an instruction's operation.
type Opcode uint8

// The instructions of the VM.
const (
	// OpCall calls FuncTable[Func] with Args and stores the result in Dst
	// (NoReg discards it).
	OpCall Opcode = 1
	// OpRet returns register Dst from the function.
	OpRet Opcode = 2
	// OpGoto jumps to instruction Target.
	OpGoto Opcode = 3
	// OpIf continues with the next instruction when register Dst holds a
	// non-zero int and jumps to instruction Target otherwise.
	OpIf Opcode = 4
)

// String names the opcode as the disassembly shows it.
func (o Opcode) String() string {
	switch o {
	case OpCall:
		return "call"
	case OpRet:
		return "ret"
	case OpGoto:
		return "goto"
	case OpIf:
		return "if"
	}
	return "op(" + strconv.Itoa(int(o)) + ")"
}

// Reg is a register of the current frame. A function's parameters arrive in
// registers 0..len(Params)-1.
type Reg int32

// NoReg is the destination of a call whose result is discarded.
const NoReg Reg = -1

// Const is an index into the executable's constant pool.
type Const int32

// Imm is an integer immediate operand.
type Imm int64

// Operand is a call argument as the Builder takes it: a Reg, a Const or an
// Imm.
type Operand interface{ arg() Arg }

func (r Reg) arg() Arg   { return Arg{Kind: ArgReg, Value: int64(r)} }
func (c Const) arg() Arg { return Arg{Kind: ArgConst, Value: int64(c)} }
func (i Imm) arg() Arg   { return Arg{Kind: ArgImm, Value: int64(i)} }

// ArgKind says where a call argument comes from.
type ArgKind uint8

// Argument kinds.
const (
	ArgReg   ArgKind = 0 // a register of the frame
	ArgConst ArgKind = 1 // a constant of the pool
	ArgImm   ArgKind = 2 // an integer immediate
)

// Arg is one call argument.
type Arg struct {
	Kind  ArgKind
	Value int64
}

func (a Arg) arg() Arg { return a }

// String prints the argument as the disassembly shows it: %3, c1, 42.
func (a Arg) String() string {
	switch a.Kind {
	case ArgReg:
		return "%" + strconv.FormatInt(a.Value, 10)
	case ArgConst:
		return "c" + strconv.FormatInt(a.Value, 10)
	case ArgImm:
		return strconv.FormatInt(a.Value, 10)
	}
	return fmt.Sprintf("arg(%d,%d)", a.Kind, a.Value)
}

// Instr is one instruction. Which fields matter depends on Op.
type Instr struct {
	Op Opcode
	// Dst is the destination of a call, the returned register of a ret and
	// the condition register of an if.
	Dst Reg
	// Func indexes the executable's FuncTable (call).
	Func int32
	// Args are the call's arguments.
	Args []Arg
	// Target is the instruction index a goto jumps to, and the one an if
	// jumps to when its condition is false.
	Target int32
}

// FuncKind says what a FuncTable entry names.
type FuncKind uint8

// Function kinds.
const (
	// FuncVM is another function of the executable.
	FuncVM FuncKind = 1
	// FuncBuiltin is one of the VM's builtins (vm.builtin.*).
	FuncBuiltin FuncKind = 2
	// FuncExtern is looked up in the kernel module given to New, then in
	// the global packedfunc registry.
	FuncExtern FuncKind = 3
)

// String names the kind.
func (k FuncKind) String() string {
	switch k {
	case FuncVM:
		return "vm"
	case FuncBuiltin:
		return "builtin"
	case FuncExtern:
		return "extern"
	}
	return "funckind(" + strconv.Itoa(int(k)) + ")"
}

// FuncRef is one entry of the function table that calls index.
type FuncRef struct {
	Kind FuncKind
	Name string
	// Sources are the model operators the calls of a kernel (FuncExtern)
	// compute, as the compiler carried them from the model: a profile
	// names them beside the kernel. Nil when unknown.
	Sources []Source
}

// Source is a model operator: the node's name and its operator type in
// the model ("conv1", "Conv").
type Source struct {
	Name string `json:"name"`
	Op   string `json:"op"`
}

// ParamKind is what a function parameter accepts.
type ParamKind uint8

// Parameter kinds.
const (
	ParamAny    ParamKind = 0 // any value, unchecked
	ParamTensor ParamKind = 1 // an NDArray, checked against DType and Shape
	ParamInt    ParamKind = 2 // an int
	ParamFloat  ParamKind = 3 // a float (an int converts)
	ParamShape  ParamKind = 4 // a shape
	ParamTuple  ParamKind = 5 // a tuple
)

var paramKindNames = [...]string{"any", "tensor", "int", "float", "shape", "tuple"}

// String names the kind.
func (k ParamKind) String() string {
	if int(k) < len(paramKindNames) {
		return paramKindNames[k]
	}
	return "paramkind(" + strconv.Itoa(int(k)) + ")"
}

// Dim is one dimension of a tensor parameter: static (Name empty) or a
// symbolic name that every parameter using it must agree on within a call.
type Dim struct {
	Value int64
	Name  string
}

// Static is a dimension of fixed extent n.
func Static(n int64) Dim { return Dim{Value: n} }

// Sym is a symbolic dimension.
func Sym(name string) Dim { return Dim{Name: name} }

// String prints the extent or the name.
func (d Dim) String() string {
	if d.Name != "" {
		return d.Name
	}
	return strconv.FormatInt(d.Value, 10)
}

// Param is one function parameter and what it must hold.
type Param struct {
	Name string
	Kind ParamKind
	// DType is the tensor's element type; the zero DType accepts any.
	DType ndarray.DType
	// NDim is the tensor's rank, or -1 for any rank.
	NDim int
	// Shape, when not nil, has NDim dimensions.
	Shape []Dim
}

// TensorParam is a tensor parameter of fixed rank len(dims) and dtype dt
// (the zero DType accepts any).
func TensorParam(name string, dt ndarray.DType, dims ...Dim) Param {
	return Param{Name: name, Kind: ParamTensor, DType: dt, NDim: len(dims), Shape: append([]Dim{}, dims...)}
}

// AnyParam is an unchecked parameter.
func AnyParam(name string) Param { return Param{Name: name, Kind: ParamAny, NDim: -1} }

// KindParam is a parameter of a kind other than tensor (int, float, shape,
// tuple) or a tensor of any dtype and shape.
func KindParam(name string, k ParamKind) Param { return Param{Name: name, Kind: k, NDim: -1} }

// TypeString describes what the parameter accepts: R.Tensor((2, n), "float32").
func (p Param) TypeString() string {
	if p.Kind != ParamTensor {
		return p.Kind.String()
	}
	var b strings.Builder
	b.WriteString("Tensor(")
	switch {
	case p.Shape != nil:
		b.WriteString(dimsString(p.Shape))
	case p.NDim >= 0:
		b.WriteString("ndim=" + strconv.Itoa(p.NDim))
	default:
		b.WriteString("?")
	}
	if p.DType != (ndarray.DType{}) {
		b.WriteString(", " + p.DType.String())
	}
	b.WriteString(")")
	return b.String()
}

func dimsString(ds []Dim) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.String()
	}
	if len(ds) == 1 {
		return "(" + parts[0] + ",)"
	}
	return "(" + strings.Join(parts, ", ") + ")"
}
