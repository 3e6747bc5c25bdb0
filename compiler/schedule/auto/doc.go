// Package auto owns kiln's default schedules, CPU and GPU: the schedule a
// PrimFunc gets when nobody wrote one for it (the tensor programs
// LegalizeOps and FuseTIR make for a graph module). Today it schedules matmul-shaped
// reduction blocks (C[.., i, j] += A[.., i, k] * B[.., k, j] with B
// contiguous in j) as a register-blocked kernel: loops (i, j_outer, k,
// j_inner) with j_inner vectorized into a "local" accumulator tile,
// the way bench/matmul.go's hand schedule does. Direct convolutions with
// the output channels innermost (topi.Conv2D's conv2d_hwio stage) get a
// tile of output positions × vectors of channels in registers (conv.go);
// the elementwise blocks after one (bias, ReLU, Clip, residual adds, and
// the layout change back to NCHW) are inlined into the tile's store, so
// they run on registers before anything is written. Depthwise and
// grouped convolutions (and any convolution whose kernel is not in HWIO)
// with rows of stride 1 get a run of outputs along the row in vector
// registers instead (depthwise.go). Everything else is left as it is.
//
// For GPUs, GPUFunc is the fallback rule of DLight: a function's one block
// gets its spatial loops fused and bound to blockIdx.x and threadIdx.x,
// its reduction loops serial in each thread. Reductions across threads,
// GEMV and matmul rules are not there yet.
//
// It imports compiler/ir and compiler/schedule only; it must not import
// the graph-level packages, codegen or the runtime.
package auto
