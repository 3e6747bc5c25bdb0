// Package transform holds kiln's graph-level passes over IRModules that
// mix graph functions (compiler/ir's Relax-style Function) and TensorIR
// PrimFuncs: AlterConvLayout, AlterDenseLayout (CPU builds only, outside
// the named pipelines), LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps,
// FuseTIR, DeadCodeElimination, StaticPlanBlockMemory, ConcatInPlace
// (the inputs of a concatenation written into its output) and
// AnnotateUsedMemory, and the named pipelines that chain them ("zero",
// "O0"–"O3").
//
// Passes are data: a Pass is a name and a function from module to
// module; Lookup finds one by name, Pipeline returns a named list, and
// Run/RunPasses apply a list, checking the ordering constraints (a pass
// that needs another one before it), turning a panic inside a pass into
// an error that names the pass, and verifying the module after every
// pass when asked (tests always ask).
//
// Each pass follows the Apache TVM Relax pass of the same name closely
// enough that the IRModule tutorial's MLP goes through the zero pipeline to the module
// TVM prints (compiler/script/testdata/001_after_zero_pipeline.py).
//
// The package owns graph-level rewriting only. It imports compiler/ir,
// compiler/relax/op (the operator registry and its legalizers),
// compiler/topi (legalization), compiler/interp (to fold constants), ndarray and
// devices/cpu (host arrays for the interpreter); it must not import the
// text format (compiler/script, except in tests), code generators, the VM,
// devices other than the host array type, or the CLI.
package transform
