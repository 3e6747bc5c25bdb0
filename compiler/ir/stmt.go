package ir

import "fmt"

// Stmt is a statement. The set of statements is closed: the types in this
// file are all of them.
type Stmt interface {
	isStmt()
}

// ForKind is how a loop's iterations run.
type ForKind uint8

// Loop kinds.
const (
	ForSerial ForKind = iota
	ForParallel
	ForVectorized
	ForUnrolled
	// ForThreadBinding binds the loop to the GPU thread axis For.ThreadTag
	// ("blockIdx.x", "threadIdx.x"…).
	ForThreadBinding
)

// String is the kind's TVMScript name: "serial", "parallel", "vectorized",
// "unroll" or "thread_binding".
func (k ForKind) String() string {
	switch k {
	case ForSerial:
		return "serial"
	case ForParallel:
		return "parallel"
	case ForVectorized:
		return "vectorized"
	case ForUnrolled:
		return "unroll"
	case ForThreadBinding:
		return "thread_binding"
	}
	return fmt.Sprintf("ForKind(%d)", uint8(k))
}

// AttrVectorLoadsInRegisters (bool) on a loop asks code generation to
// keep every vector load in its body one load in a register, however
// many operations use the vector (C: kiln_vload_reg), where a C compiler
// could fold a shared load into each of its uses as a memory operand. A
// schedule sets it (Schedule.Annotate) on a register tile whose
// operations share their loads.
const AttrVectorLoadsInRegisters = "pragma_vector_loads_in_registers"

// For runs Body with Var taking Min, Min+1, …, Min+Extent-1.
type For struct {
	Var         *Var
	Min, Extent Expr
	Kind        ForKind
	// ThreadTag names the thread axis when Kind is ForThreadBinding.
	ThreadTag string
	// Annotations are hints for passes ("pragma_unroll_explicit"…); may be nil.
	Annotations map[string]any
	Body        Stmt
}

// Block is TensorIR's unit of computation: iteration variables with their
// domains and kinds, the regions it reads and writes, an optional Init run
// before the first reduction step, a body, and buffers allocated for its
// scope. A Block only appears as the Block of a BlockRealize.
type Block struct {
	Name         string
	IterVars     []IterVar
	Reads        []BufferRegion
	Writes       []BufferRegion
	Init         Stmt // nil when the block is not a reduction
	Body         Stmt
	AllocBuffers []*Buffer
	Annotations  map[string]any
}

// BlockRealize runs Block with its IterVars bound to IterValues, when
// Predicate (Bool) holds.
type BlockRealize struct {
	IterValues []Expr
	Predicate  Expr
	Block      *Block
}

// BufferStore writes Value to Buffer at Indices.
type BufferStore struct {
	Buffer  *Buffer
	Value   Expr
	Indices []Expr
}

// Allocate allocates memory for Buffer (in its scope) and runs Body with
// Buffer and its Data variable defined.
type Allocate struct {
	Buffer *Buffer
	Body   Stmt
}

// DeclBuffer declares Buffer, a view over memory whose Data variable is
// already defined, for Body.
type DeclBuffer struct {
	Buffer *Buffer
	Body   Stmt
}

// SeqStmt runs statements in order.
type SeqStmt struct {
	Seq []Stmt
}

// IfThenElse runs Then when Cond holds and Else (nil for none) otherwise.
type IfThenElse struct {
	Cond Expr
	Then Stmt
	Else Stmt
}

// LetStmt binds Var to Value for Body.
type LetStmt struct {
	Var   *Var
	Value Expr
	Body  Stmt
}

// Evaluate evaluates Value for its side effects (a call).
type Evaluate struct {
	Value Expr
}

// AttrStmt attaches an attribute Key = Value about Node (may be nil) to
// Body, e.g. "thread_extent" or "pragma_*" after lowering.
type AttrStmt struct {
	Node  Expr
	Key   string
	Value Expr
	Body  Stmt
}

// AssertStmt fails the function with Message when Cond does not hold.
type AssertStmt struct {
	Cond    Expr
	Message string
}

func (*For) isStmt()          {}
func (*BlockRealize) isStmt() {}
func (*BufferStore) isStmt()  {}
func (*Allocate) isStmt()     {}
func (*DeclBuffer) isStmt()   {}
func (*SeqStmt) isStmt()      {}
func (*IfThenElse) isStmt()   {}
func (*LetStmt) isStmt()      {}
func (*Evaluate) isStmt()     {}
func (*AttrStmt) isStmt()     {}
func (*AssertStmt) isStmt()   {}

// NewFor returns a serial loop over [min, min+extent); extent and min are
// cast to v's type when they are constants of another type.
func NewFor(v *Var, min, extent Expr, kind ForKind, body Stmt) *For {
	if v == nil || min == nil || extent == nil || body == nil {
		panic("ir: For with a nil part")
	}
	if isConst(min) {
		min = NewCast(v.Type, min)
	}
	if isConst(extent) {
		extent = NewCast(v.Type, extent)
	}
	return &For{Var: v, Min: min, Extent: extent, Kind: kind, Body: body}
}

// NewBufferStore returns b[indices…] = value; a constant value is cast to
// the buffer's dtype.
func NewBufferStore(b *Buffer, value Expr, indices ...Expr) *BufferStore {
	if b == nil || value == nil {
		panic("ir: BufferStore with a nil part")
	}
	if isConst(value) {
		value = NewCast(b.DType.WithLanes(int(value.DType().Lanes)), value)
	}
	return &BufferStore{Buffer: b, Value: value, Indices: indices}
}

// Seq returns the statements in order, flattening nested SeqStmts and
// dropping nils; one statement is returned as itself.
func Seq(stmts ...Stmt) Stmt {
	var out []Stmt
	for _, s := range stmts {
		switch s := s.(type) {
		case nil:
		case *SeqStmt:
			for _, c := range s.Seq {
				if q, ok := c.(*SeqStmt); ok {
					out = append(out, Seq(q.Seq...))
				} else if c != nil {
					out = append(out, c)
				}
			}
		default:
			out = append(out, s)
		}
	}
	if len(out) == 1 {
		return out[0]
	}
	return &SeqStmt{Seq: out}
}

// RootBlockName is the name of the implicit block that wraps a TensorIR
// PrimFunc's body (TVMScript hides it behind `# with T.block("root"):`).
const RootBlockName = "root"

// NewRootBlock wraps body in the root block, which allocates allocs.
func NewRootBlock(body Stmt, allocs ...*Buffer) *BlockRealize {
	return &BlockRealize{Predicate: BoolImm(true), Block: &Block{Name: RootBlockName, Body: body, AllocBuffers: allocs}}
}

// RootBlock returns the root block of a PrimFunc body, or nil when the body
// is not wrapped in one.
func RootBlock(body Stmt) *Block {
	br, ok := body.(*BlockRealize)
	if !ok || br.Block.Name != RootBlockName || len(br.Block.IterVars) != 0 {
		return nil
	}
	return br.Block
}
