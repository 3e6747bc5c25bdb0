// Package te owns kiln's tensor expressions: the way a user describes a
// computation before scheduling it, as in TVM's te module.
//
// A computation is built from placeholders (the inputs), Compute stages
// defined by Go closures over index expressions, and reductions (Sum, Max,
// Min) over reduce axes. Sizes may be symbolic: Var returns an int32 size
// variable, as TVM's te.var does (VarOf picks another integer type).
// CreatePrimFunc turns the stages into one TensorIR PrimFunc, as TVM's
// create_prim_func does: one block per Compute stage, named after it, with
// spatial and reduce iteration variables, read and write regions and an
// init statement for reductions; intermediate stages are buffers of the
// root block. Schedule the result with compiler/schedule.
//
// the tensor-expression tutorial's vector add reads:
//
//	n := te.Var("n")
//	A := te.Placeholder([]ir.Expr{n}, ir.Float32, "A")
//	B := te.Placeholder([]ir.Expr{n}, ir.Float32, "B")
//	C := te.Compute(A.Shape, func(i ir.Expr) ir.Expr { return ir.Add(A.At(i), B.At(i)) }, "C")
//	f, err := te.CreatePrimFunc([]*te.Tensor{A, B, C})
//
// Mistakes in a definition (indexing a tensor with the wrong number of
// indices, a reduce axis outside its reduction, a closure that panics) do
// not panic: the Tensor records the error (see Tensor.Err) and
// CreatePrimFunc returns it.
//
// The expressions that Tensor.At, a reduce Axis and Sum/Max/Min return are
// placeholders of this package that only Compute understands; pass them
// to Compute, not to other IR code. This package imports compiler/ir (and
// ndarray for dtypes) only and must not import compiler/schedule, the
// lowering passes or anything outside the compiler.
package te
