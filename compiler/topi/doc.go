// Package topi is kiln's operator library: tensor-expression (compiler/te)
// implementations of the graph-level operators, with the semantics and the
// stage names of Apache TVM's topi and of Relax's legalization (T_add,
// T_transpose, matmul, compute, T_reshape, conv2d_nchw, pad_temp, …).
//
// Two layers:
//
//   - One Go function per operator over te tensors: Add, Exp, Matmul,
//     Reshape, Sum, Softmax, Conv2D, MaxPool2D, … Each returns the output
//     tensor(s) or an error for bad attributes or shapes (an axis out of
//     range, shapes that do not broadcast, a reshape that changes the
//     element count). They never panic on user input.
//   - Legalization of graph-level calls: LegalizeCall takes an operator
//     call (ir.RCall of "relax.add", "relax.nn.conv2d", …) whose tensor
//     arguments have known shapes and dtypes, and returns the PrimFunc
//     computing it in destination-passing style (tensor inputs, then
//     outputs), the call_tir arguments, the output struct info and TVM's
//     function name hint ("add", "matmul", "transpose", "relu").
//     Importing the package attaches Legalize to every operator it covers
//     in the registry of compiler/relax/op (op.SetLegalize).
//
// PrimFuncs use the graph's dimension expressions as they are: a
// symbolic dimension n of an argument is the same *ir.Var in the
// function's buffer shapes (as in TVM). Arguments whose dimensions are
// expressions of variables (n * 2) give buffers the interpreter and the
// code generator cannot bind; pass such calls through match_cast first.
//
// The package owns operator bodies only. It imports compiler/ir,
// compiler/te, compiler/arith, compiler/relax/op (for attribute schemas)
// and ndarray (dtypes); it must not import passes, schedules, codegen, the
// runtime or the text format.
package topi
