// Package onnx imports ONNX models (ModelProto files, as PyTorch's
// torch.onnx.export writes them) into kiln's graph IR.
//
// Read parses a model with the Go types generated from ONNX's own
// onnx.proto (package onnxpb) and checks it before anything is imported:
// a truncated or non-ONNX file, an opset outside the range kiln knows, a
// graph with a cycle or a dangling input, or an initializer whose data
// disagrees with its dims is an error naming the node or tensor.
// Initializers are decoded from raw_data or the typed fields, or from
// external data files next to the model.
//
// Import turns a Model into an IRModule holding one graph function,
// "main", whose parameters are the model's inputs, named as in the model,
// followed by its weights (R.func_attr({"num_input": N})), together with
// the weights themselves (Params, saved as safetensors). Symbolic
// dimensions of the inputs are resolved by Options.InputShapes or refused
// naming the input and the dimension. Shapes are inferred as the graph is
// built, and subgraphs whose values are known at import time (the Shape →
// Gather → Concat → Reshape pattern of every PyTorch export) are folded to
// constants. Operators whose output shape depends on their input values
// (NonZero, Unique, NonMaxSuppression…) are computed at import from
// inputs known then; If selects between its branches, and Loop and Scan
// are unrolled, so their trip counts must be known at import. An
// operator kiln does not support is an error naming the node, its op
// type and opset, before anything is built.
//
// The package owns the reader and the importer. It imports compiler/ir,
// compiler/relax/op, ndarray and the generated onnxpb types; it must not
// import passes, code generators, the runtime backends or the CLI.
package onnx
