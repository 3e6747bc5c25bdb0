// Package auto owns kiln's default schedules, CPU and GPU: the schedule a
// PrimFunc gets when nobody wrote one for it (the tensor programs
// LegalizeOps and FuseTIR make for a graph module). On CPUs:
//
//   - Matmul-shaped reduction blocks (C[.., i, j] += A[.., i, k] *
//     B[.., k, j] with B contiguous in j) become a register-blocked
//     kernel: a tile of rows × vectors of columns accumulates in a
//     "local" buffer over the whole of k, the way bench/matmul.go's hand
//     schedule does. When every row reads the same B (a dense layer's
//     weight), the activation's row loops are fused into one and the
//     column tiles run outside the row tiles, so each panel of the
//     weight is read from memory once; the elementwise blocks after the
//     matmul (bias, activation, residual add) are computed on the tile
//     before it is stored (matmul.go). A weight packed in panels of the
//     tile's columns (relax.matmul_packed, which CPU builds make of dense
//     layers: AlterDenseLayout) is read a contiguous panel at a time.
//   - Direct convolutions with the output channels innermost
//     (topi.Conv2D's conv2d_hwio stage, its kernel in HWIO or in blocks
//     of output channels such as OIHW32o) get a tile of output positions
//     × vectors of channels in registers (conv.go); the elementwise blocks
//     after one (bias, ReLU, Clip, residual adds, and the layout change
//     back to NCHW) are inlined into the tile's store, so they run on
//     registers before anything is written. A network's stem (a
//     convolution of at most 4 input channels, its output in NCHW) is
//     vectorized along the output row instead: per output row, the input
//     rows it reads are copied once, padded and split into phases of the
//     stride, and a tile of output channels × vectors of positions
//     accumulates over the whole window (stem_conv.go). Depthwise and grouped
//     convolutions (and any convolution whose kernel is not in HWIO) with
//     rows of stride 1 get a run of outputs along the row in vector
//     registers instead (depthwise.go). Depthwise convolutions (any row
//     width, stride 1 or 2) are rewritten into loops of their own: a
//     padded plane per channel, and tiles of rows in whole vectors, the
//     extra lanes dropped (depthwise_plane.go); so are pooling windows
//     after a padding stage. Pointwise convolutions (1×1, stride 1,
//     unpadded) with the kernel in OIHW or in panels of output channels
//     (OIHW8o) are rewritten into a matrix product over each channel's
//     flattened plane: tiles of output channels (a panel) × whole vectors
//     of positions, whatever the rows' width, computing only the channels
//     a slice after them keeps (pointwise.go). Global
//     pooling (GlobalAveragePool's mean) reads each plane as one run of
//     vectors (pool.go); pooling windows without padding compute vectors
//     of outputs along each row from strided vector loads of the input
//     (pool.go).
//   - Functions that reduce rows and then compute over the same rows
//     (layer norm, softmax) get the row pipeline rule
//     (row_pipeline_cpu.go): every step of a row computed at the last
//     block's row loop, the rows fused and parallel, so a row's steps
//     run while it is in the L1 cache.
//   - Every other kernel gets the generic rule (injective.go): cheap
//     elementwise intermediates inlined into their readers, the innermost
//     loop of each elementwise block vectorized, row reductions (softmax's
//     and layer norm's sums and maxima, means) run on a vector of partial
//     results (reduction_cpu.go), and loop nests with enough work
//     parallel over their outer loops.
//
// For GPUs, GPUFunc picks a rule the way DLight does: 2-D matmuls of
// float16 or bfloat16 operands run on the tensor cores, a warp's tile of C
// as 16×8 float32 accumulators updated by ptx_mma m16n8k16 (PTX's
// mma.sync) from fragments loaded out of shared-memory tiles
// (gpu_matmul_mma.go); other 2-D matmuls get a
// shared-memory tiled schedule with a register tile per thread and their
// elementwise epilogues computed from registers (gpu_matmul_shared.go,
// else the register-only rule of gpu_matmul.go); reductions end in warp
// shuffles across threads (gpu_reduce.go), with a block of threads per
// row for softmax and layer norm (gpu_rows.go); everything else falls back
// to fusing a block's spatial loops and binding them to blockIdx.x and
// threadIdx.x, its reduction loops serial in each thread (gpu.go).
//
// The rules are data (rules.go): an ordered list per kind of target,
// cpuRules and gpuRules, each rule a name and a function that schedules a
// function or says that the rule does not apply; the first that applies
// wins. "Does not apply" is not an error; an error is a bug in a rule
// and FuncRule and GPUFunc return it with the rule's name. The CPU rules
// read the target's vector width, vector registers (a register tile keeps
// its accumulators to three quarters of them) and caches from Options,
// which the build fills from its target table (compiler.Target.Info).
//
// It imports compiler/ir and compiler/schedule only; it must not import
// the graph-level packages, codegen or the runtime.
package auto
