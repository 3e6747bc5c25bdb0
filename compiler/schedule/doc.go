// Package schedule owns kiln's schedule primitives: transformations of a
// TensorIR PrimFunc's loops and blocks that change how a computation runs,
// never what it computes, in the manner of TVM's tir.Schedule.
//
// A Schedule holds one PrimFunc. IR nodes are immutable: each primitive
// builds a new PrimFunc (Func returns the current one; earlier ones stay
// valid), and Copy forks a schedule cheaply. Blocks and loops are named by
// handles, BlockRV and LoopRV, that stay valid across primitives while
// what they name exists; a handle to a loop that a primitive replaced (the
// loop a Split or Fuse consumed, the loops ComputeAt regenerated) gives an
// error saying that the loop no longer exists.
//
// The primitives are GetBlock, GetLoops, GetChildBlocks, Split, Fuse,
// Reorder, Parallel, Vectorize, Unroll, Bind, Annotate, CacheRead,
// CacheWrite (and CacheReadLayout, CacheWriteLayout, which store the copy
// in another layout), ComputeAt, ReverseComputeAt, ComputeInline,
// ReverseComputeInline, DecomposeReduction, RFactor, SetScope,
// StorageAlign, TransformLayout (with an IndexMap), PadEinsum, Blockize
// and Tensorize (with a TensorIntrin registered by RegisterTensorIntrin),
// and the sampling primitives SamplePerfectTile and SampleCategorical.
// Each checks its preconditions and returns an error that names the
// primitive, the failed condition and the blocks and loops involved,
// leaving the schedule unchanged.
//
// Trace lists the primitives applied, one line each, in TVM's Python
// syntax, with the handles they return assigned to variables named after
// the blocks and loops:
//
//	C = sch.get_block("C")
//	i, j, k = sch.get_loops(C)
//	j_0, j_1 = sch.split(loop=j, factors=[None, 16])
//	C_rf = sch.rfactor(k, 0)
//
// Replay applies such a trace to the unscheduled function again and gives
// a structurally equal PrimFunc.
//
// the tensor-expression tutorial's s[C].parallel(C.op.axis[0]) is
//
//	s, _ := schedule.New(f) // f from te.CreatePrimFunc
//	c, _ := s.GetBlock("C")
//	loops, _ := s.GetLoops(c)
//	err := s.Parallel(loops[0])
//
// Buffers that CacheRead and CacheWrite add have the full shape of the
// buffer they cache, like TVM's; shrinking them to the region a loop nest
// touches is a lowering pass (TVM's CompactBufferAllocation).
//
// This package is pure IR code: it imports compiler/ir only, takes no
// context and must not import the lowering passes, code generators, te
// or anything outside the compiler.
package schedule
