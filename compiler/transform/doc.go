// Package transform owns kiln's lowering pipeline: the passes that take a
// scheduled TensorIR PrimFunc (blocks, multi-dimensional buffers, loops of
// every kind) to the flat, block-free form the code generators print, and
// the packed-API prologue that checks a call's arguments.
//
// The pipeline is data: Passes lists every pass by name in its one legal
// order, with a table of ordering constraints checked when the package is
// initialised. Running passes in another order panics naming both passes
// (a programming error); a panic inside a pass becomes an error naming the
// pass and the function.
//
//	lower_init       a block's T.init → if (reduce iter vars == their min) init
//	lower_blocks     block realizes → plain statements: iter values
//	                 substituted, predicate → if, alloc_buffers → Allocate
//	compact_buffers  each allocated buffer shrunk to the region its
//	                 accesses touch and placed at the innermost statement
//	                 holding them (after lower_blocks: it works on Allocate
//	                 and plain loops; before flatten_buffers: it needs the
//	                 buffer's dimensions)
//	flatten_buffers  multi-dimensional buffers → 1-D views over the same data
//	                 (row-major, or the buffer's strides)
//	vectorize        a vectorized loop of constant extent → Ramp/Broadcast
//	                 vector expressions of at most the native width (see
//	                 Vectorize for when it stays a serial loop instead)
//	unroll           an unrolled loop of constant extent, or a small serial
//	                 one indexing a "local" buffer → repeated bodies (or a
//	                 pragma for the C compiler when too large)
//	simplify         constant folding and algebraic identities; floordiv
//	                 and floormod of non-negative values → C's / and %
//	storage_rewrite  hoists constant-size allocations out of serial loops
//	                 and lets allocations with disjoint lifetimes share memory
//	make_packed_api  the kernel ABI's argument checks and bindings
//
// transform is pure IR code: it takes no context, does no I/O beyond
// Options.Dump and imports only compiler/ir, compiler/script (to print
// dumps), compiler/arith and abi. It must not import code generators,
// devices or the toolchain.
package transform
