// Package nn builds graph-level IRModules the way TVM's
// tvm.relax.frontend.nn does (the IRModule tutorial's RelaxModel): a model is a tree
// of Modules (Linear, ReLU, Conv2D, LayerNorm, Embedding, Sequential, or
// user types implementing Module), and Export traces its Forward into
// one graph function whose parameters are the inputs followed by every
// weight (named by their path, fc1.weight, in module order), with
// R.func_attr({"num_input": N}), plus the weights themselves (Params),
// initialized deterministically from a seed and saved as safetensors.
//
// The graph uses the operators of compiler/relax/op as TVM's builder
// does: a Linear layer is R.permute_dims, R.matmul and R.add.
//
// The package owns the builder and the layers. It imports compiler/ir,
// compiler/relax/op, ndarray and devices (for Params.Save); it must not
// import passes, code generators, the runtime backends or the CLI.
// Params.Save and LoadParams move data through host NDArrays, so the
// program must link a CPU backend (import devices/cpu).
package nn
