// Package ir is kiln's tensor-level IR (TensorIR): expressions, statements,
// buffers, PrimFuncs and IRModules, with structural equality and hashing,
// a verifier and walkers for passes.
//
// # Nodes
//
// Expressions (Expr, each with a DType, which is ndarray.DType):
// IntImm and FloatImm (constants; booleans are IntImm of dtype bool),
// StringImm, Var (identity by pointer), Binary (Op: Add, Sub, Mul, Div,
// Mod, FloorDiv, FloorMod, Min, Max, EQ, NE, LT, LE, GT, GE, And, Or), Not,
// Cast, Select, BufferLoad, Call (an intrinsic from Intrinsics such as exp
// or pow, OpIfThenElse, or OpCallExtern), Ramp and Broadcast (vectors) and
// Let. The constructors Add, Mul, Max, … promote operands to a common dtype
// as TVM does; NewBinary builds exactly what it is given, so ill-typed
// input reaches Verify instead of a panic.
//
// Statements (Stmt): For (Kind serial, parallel, vectorized, unrolled or
// thread-bound with a ThreadTag), BlockRealize binding a Block's IterVars
// (spatial or reduce, each with a domain Range) to values under a
// predicate, BufferStore, Allocate (memory for a buffer), DeclBuffer (a view
// over defined memory), SeqStmt, IfThenElse, LetStmt, Evaluate, AttrStmt
// and AssertStmt. A Block names its reads and writes as BufferRegions, may
// carry an Init statement (a reduction's initial value) and allocates its
// AllocBuffers.
//
// A Buffer has a name, dtype, shape (symbolic extents allowed), optional
// strides and element offset, a storage scope and a Data variable. A
// PrimFunc has parameters (scalars, or handles bound to buffers in
// BufferMap), a body, a return type and attributes ("global_symbol",
// "tir.noalias", "op_pattern"…). A TensorIR PrimFunc's body is a
// BlockRealize of the block named RootBlockName, which allocates the
// function's intermediate buffers (see NewRootBlock, RootBlock). An
// IRModule is an ordered, immutable map from names to BaseFuncs: PrimFunc
// here, graph-level kinds from other packages.
//
// # Graph level
//
// Files relax*.go hold the Relax-style graph IR: Function (a BaseFunc
// with parameters carrying StructInfo, a SeqExpr body of BindingBlocks,
// dataflow or not, and a result), graph expressions (RVar, RCall of an
// Op, a GlobalVar or a variable, RTuple, TupleGetItem, Constant,
// ShapeExpr, PrimValue, RIf…), StructInfo (tensor shape and dtype with
// symbolic dimensions, tuple, shape, scalar, function, object), a
// registry of operators (OpDef, filled by compiler/relax/op, which owns
// shape inference) and VerifyFunction.
//
// # Rules
//
// Nodes are immutable once built: passes build new nodes (Rewriter copies
// only what changes) and never write to fields of nodes they were given.
// Variables and buffers are identified by pointer; names are hints.
// StructuralEqual and StructuralHash compare up to renaming (alpha
// equivalence) and key the build cache. Verify reports ill-formed IR with
// errors naming the function, the block and the node.
//
// This package is pure: it takes no context, does no I/O and imports only
// ndarray from kiln (never devices, packedfunc or cli). The text format
// lives in compiler/script.
package ir
