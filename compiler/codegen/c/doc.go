// Package c owns kiln's C code generator: it prints lowered PrimFuncs (the
// output of compiler/transform, with the packed API) as one C source file
// for the kernel ABI of abi/kiln_abi.h. Each function becomes an exported
// packed function; the file also defines kiln_last_error() and
// kiln_module_metadata() (the abi.Metadata JSON).
//
// Parallel loops are outlined (parallel.go): a loop's body becomes a static
// function over a range of iterations that reads the values it uses from a
// closure, and the loop becomes a launch through the module's
// kiln_parallel_launch, which the loader points at its thread pool
// (devices/cpu); a loop nested in a parallel one runs serially. Vector
// expressions (Ramp and Broadcast from the vectorize pass) use GCC vector
// types (`typedef float float32x16 __attribute__((vector_size(64)))`),
// with unaligned loads and stores through __builtin_memcpy. A "local"
// buffer of constant size whose every access has a constant index (after
// unrolling) is printed as one variable per accessed slot rather than an
// array (scalar replacement), so a register-blocked micro-kernel keeps its
// accumulators in vector registers instead of reloading and storing them
// on every iteration of the reduction. Unrolled loops that the unroll pass left in place get
// `#pragma GCC unroll`. Buffer pointers are `restrict` when the function
// has tir.noalias. Math intrinsics map to libm (expf, …); T.round is
// nearbyint, as the reference interpreter computes it. Exp and erf on
// float32 vectors (Vectorize makes those for CPU targets) are inline
// helpers, kiln_vexp_float32xN and kiln_verf_float32xN: polynomials
// within 2 ulp of expf and 4.1e-7 of erf (vmath.go).
//
// The printer is one Renderer parameterised by a Dialect: C is the
// default dialect, and a CUDA generator overrides a few hooks (prelude,
// signature, loop headers, intrinsics) instead of copying the renderer.
//
// c is pure text generation: it imports compiler/ir, compiler/transform
// (for the packed API's attribute names) and abi, and must not import the
// toolchain, devices or artifacts.
package c
