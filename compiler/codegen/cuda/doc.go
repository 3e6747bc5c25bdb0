// Package cuda owns kiln's CUDA C code generator: it prints lowered
// PrimFuncs whose loops are bound to GPU thread axes (blockIdx.x/y/z,
// threadIdx.x/y/z) as `extern "C" __global__` kernels, and returns each
// kernel's launch metadata (grid and block dimensions, static shared
// memory, parameters).
//
// It is a dialect of the C renderer (compiler/codegen/c): the prelude,
// the kernel signature, thread-bound loop headers, shared-memory
// declarations and the function's end differ; everything else (expressions,
// stores, loops) is printed by the same code as for the CPU.
//
// Before printing, every kernel is verified against the target's limits
// (Limits): a thread axis bound with a constant extent, the same extent
// wherever the axis is bound, threads per block and grid dimensions within
// the architecture's limits, static shared memory within the per-block
// limit, one thread-bound loop nest per kernel, and no store executed
// outside the thread-bound loops (which every thread would repeat). Errors
// name the kernel and the limit.
//
// The input is a PrimFunc lowered up to, and not including,
// make_packed_api (see LowerOptions): a kernel takes raw pointers and
// scalars, not packed arguments.
package cuda
