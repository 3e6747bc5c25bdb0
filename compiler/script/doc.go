// Package script reads and writes kiln's text format, a subset of TVMScript,
// for TensorIR (@T.prim_func) and graph-level (@R.function) IR.
//
// Parse(filename, src) reads one @I.ir_module class or bare @T.prim_func and
// @R.function definitions. Errors are *Error values that print
// file:line:column, the offending line and a caret under the column. The
// graph level accepts R.dataflow/R.output, annotated bindings,
// R.call_tir(cls.f, (args), out_sinfo=...), calls of module functions,
// R.call_packed, R.const, R.shape, R.prim_value, R.str, R.dtype,
// R.match_cast, if/else, tuples and indexing, every operator registered in
// compiler/relax/op (keyword arguments placed by the operator's schema),
// and symbolic dimensions ("n" strings in parameters or n = T.int64()).
// Every parsed function is verified (ir.Verify, ir.VerifyFunction).
//
// Print(node) writes an *ir.IRModule, *ir.PrimFunc, *ir.Function, struct
// info, expression or statement. print(parse(x)) is stable and
// parse(print(m)) is structurally equal to m; the graph functions of TVM's
// IRModule tutorial print exactly as TVM printed them.
//
// The package owns the text format only: it imports compiler/ir,
// compiler/relax/op and ndarray, never a pass, a code generator or the runtime.
package script
