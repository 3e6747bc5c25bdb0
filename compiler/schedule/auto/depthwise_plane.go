package auto

import (
	"math"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// Depthwise convolutions as a plane per channel: a function made of an
// optional padding stage, a depthwise convolution over NCHW data
//
//	C[n, c, y, x] += A[n, c, y·sy+ry, x·sx+rx] · W[c, 0, ry, rx]
//
// (topi.Conv2D's group_conv2d_nchw with one channel per group, any
// width, a stride of 1 or 2 along the rows) and elementwise blocks after
// it (bias, Clip, residual add), scheduled with these primitives:
//
//	compute_inline      the elementwise blocks into the last one
//	sample_categorical  the rule's choices (Options.choose): the lanes,
//	                    by default the widest vector that fits in the
//	                    row; the vectors and rows of a tile; whether
//	                    the window's rows are unrolled; the parallel
//	                    channels
//	split_overlap       rows no vector divides: the last vector of a
//	                    tile moves back to end at the row's end, so the
//	                    tile is stored where it belongs
//	pad_einsum          or (a choice, and rows narrower than the
//	                    narrowest vector) x to whole vectors (Xv): the
//	                    window reads a padded copy of the plane (the
//	                    padding stage inlined into it) and stores a
//	                    padded output, copied out
//	transform_layout    stride 2: the plane's columns w at (w % 2, w // 2),
//	                    even and odd apart, so that every tap reads
//	                    consecutive elements (cache_read_layout when the
//	                    window reads a parameter)
//	split, reorder      a tile of rows × vectors
//	cache_write, decompose_reduction
//	                    the tile in registers, zeroed, the
//	                    window accumulated into it, unrolled, vectorized;
//	                    the taps along the row unrolled
//	annotate            with the window's rows unrolled, the tile's loop
//	                    ir.AttrVectorLoadsInRegisters (a choice), so that
//	                    the vectors the rows share stay one load each
//	reverse_compute_at  the epilogue on the tile's whole vectors when it
//	                    reads nothing else along the row (a bias, Clip),
//	                    else on the row's X elements after the tile; the
//	                    copy of the X columns of each row after the tile
//	compute_at          the plane under the channel's loop (one plane per
//	                    channel, which stays in cache), its rows and
//	                    columns annotated pragma_loop_partition_hint so
//	                    that lowering leaves its interior a plain copy
//	parallel            the channels, above Options.ParallelFlops
//
//	parallel for c:
//	  P = A's plane for channel c, padded (stride 2: even, odd columns)
//	  for each tile of rows, each tile of vectors along the row
//	  (x0 = min(i·width, X − width): the last one moved back):
//	    acc[rows, vectors] = 0                (in registers)
//	    for ry, rx: acc += P[row y·sy+ry, from x0 + rx] · W[c, ry, rx]
//	    out[n, c, rows, x0:x0+width] = epilogue(acc)
//
// A pooling window after a padding stage (a maximum or sum of A's window,
// topi's pool_max and pool_sum) is computed the same way, its terms
// combined by max or + from the reduction's initial value: the padding
// stage, a pass over memory of its own otherwise, is per channel here
// (resnet18's 3×3 stride-2 max pool: 306→118 µs in the model).

// maxPlaneVectors bounds the vectors of one output row held in
// registers.
const maxPlaneVectors = 8

// maxPlaneAccumulators bounds the vectors of the default tile of output
// rows (rows of one vector make chains of dependent multiply-adds, so
// several rows run side by side); the choice of rows goes up to the
// target's accumulators (Options.accumulators).
const maxPlaneAccumulators = 12

// depthwisePlane is what matchDepthwisePlane found in a function.
type depthwisePlane struct {
	conv     *ir.BlockRealize
	pad      *ir.BlockRealize // nil when the convolution reads a parameter
	epilogue *ir.BlockRealize // the last elementwise block, nil if none
	a, w     *ir.BufferLoad
	// iteration variables of the convolution: n, c, y, x and the window's
	// ry, rx (rc, the channel within the group, has extent 1 and is 0).
	n, c, y, x, rc, ry, rx *ir.Var // rc is nil for a pooling window
	// op and init combine the window's terms (OpAdd from 0 for a
	// convolution, whose w is the weight; a pooling window's w is nil).
	op                 ir.BinaryOp
	init               ir.Expr
	N, C, Y, X, KH, KW int64
	sy, sx             int64
	offY, offX         int64 // A's row and column at y = ry = 0
	planeSource
}

// planeSource is what a window reads: src is the unpadded input (four
// axes, its rows srcH and columns srcW); A[.., i, j] = src[.., i-padY,
// j-padX] inside src and padValue outside.
type planeSource struct {
	src        *ir.Buffer
	padY, padX int64
	padValue   ir.Expr
	srcH, srcW int64
}

// matchSource finds the source of A, the buffer block name's window
// reads: a parameter when pad is nil, else pad's padding of one.
func matchSource(f *ir.PrimFunc, name string, a *ir.Buffer, pad *ir.BlockRealize) (planeSource, error) {
	var p planeSource
	if pad != nil {
		if err := p.matchPad(f, pad, a); err != nil {
			return p, err
		}
	} else if !isParam(f, a) {
		return p, skip("block %q reads an intermediate", name)
	} else {
		p.src, p.padValue = a, ir.F32(0)
	}
	var ok1, ok2 bool
	if len(p.src.Shape) == 4 {
		p.srcH, ok1 = ir.IsConstInt(p.src.Shape[2])
		p.srcW, ok2 = ir.IsConstInt(p.src.Shape[3])
	}
	if !ok1 || !ok2 {
		return p, skip("block %q: input shape", name)
	}
	return p, nil
}

// scheduleDepthwisePlane returns f scheduled by the rule above, or an
// error when f is not of its form.
func scheduleDepthwisePlane(f *ir.PrimFunc, c convBlock, opts Options) (*scheduled, error) {
	s, err := depthwisePlaneSchedule(f, c, opts)
	if err != nil {
		return nil, err
	}
	return done(s), nil
}

// depthwisePlaneSchedule returns the rule's schedule of f, from f itself:
// its trace replays on f.
func depthwisePlaneSchedule(f *ir.PrimFunc, c convBlock, opts Options) (*schedule.Schedule, error) {
	conv := len(c.reduce) == 3 && c.reduce[0] == 1
	if c.rows >= 0 || len(c.spatial) != 4 || !conv && len(c.reduce) != 2 || c.dtype != ir.Float32 {
		return nil, skip("block %q is not a depthwise convolution", c.name)
	}
	s, err := schedule.New(f)
	if err != nil {
		return nil, err
	}
	if err := inlineAfterIn(s, c.name); err != nil {
		return nil, err
	}
	d, err := matchDepthwisePlane(s.Func(), c)
	if err != nil {
		return nil, err
	}
	if d.sx > 2 {
		return nil, skip("block %q: a stride of %d along the rows", c.name, d.sx)
	}
	if d.w == nil && d.pad == nil {
		// An unpadded pooling window reads its input where it is
		// (pool.go); a plane would only copy it.
		return nil, skip("block %q: pooling without padding", c.name)
	}
	if ha, ok := ir.IsConstInt(d.a.Buffer.Shape[2]); !ok || d.offY < 0 || (d.Y-1)*d.sy+d.KH-1+d.offY >= ha {
		return nil, skip("block %q: rows past the input", c.name)
	}
	if _, ok := ir.IsConstInt(d.a.Buffer.Shape[3]); !ok {
		return nil, skip("block %q: input width", c.name)
	}
	// The lanes: the target's vectors or a half, a quarter... of them; by
	// default those that take the fewest operations per output row (see
	// planeRowCost), the narrowest of equals (the least padding).
	var candidates []int64
	pick, least := 0, int64(0)
	for l := opts.VectorBytes / 4; l >= 4; l /= 2 {
		candidates = append(candidates, l)
		if cost := d.planeRowCost(l); len(candidates) == 1 || cost <= least {
			pick, least = len(candidates)-1, cost
		}
	}
	if len(candidates) == 0 {
		return nil, skip("block %q: vectors of %d bytes", c.name, opts.VectorBytes)
	}
	var err2 error
	for _, epilogue := range []bool{true, false} {
		t := s.Copy()
		lanes, err := opts.choose(t, planeSite(c, "lanes"), candidates, candidates[pick])
		if err != nil {
			return nil, err
		}
		if err2 = d.schedule(t, c, lanes, opts, epilogue); err2 == nil {
			return t, nil
		}
	}
	return nil, err2
}

// planeRowCost estimates the operations of one output row in vectors of
// lanes, in halves: a vector operation per tap and vector, the row's
// vectors whole when lanes divide it, the last one moved back to end at
// the row's end when it is at least one vector wide (overlap), else
// padded to whole vectors and copied out at half an operation per
// element (a load and a store per vector of a copy that the C compiler
// vectorizes in pieces).
func (d *depthwisePlane) planeRowCost(lanes int64) int64 {
	cost := 2 * ceilDiv(d.X, lanes) * d.KH * d.KW
	if d.X < lanes {
		cost += d.X
	}
	return cost
}

// planeTileCost estimates the vector operations of a channel's plane
// computed in tiles of rows × vec vectors of lanes, the window's rows
// unrolled when rows > 1 (the default): per tile a multiply-add per tap
// and vector, a broadcast per tap (the weight; none for a pooling
// window), and the loads of the plane's vectors, each tap's own when
// the tile is one row, else those of the rows × vec vectors that the
// unrolled rows share (rows+KH−1 rows of the plane per tap along the
// row: a tile of one vector over eight rows loads 30 vectors for its 72
// multiply-adds where eight tiles of one row load 72); times the tiles
// of the plane, whose columns overlapped tiles compute some of twice.
func (d *depthwisePlane) planeTileCost(lanes, vec, rows int64) float64 {
	taps := d.KH * d.KW
	loads := rows * vec * taps
	if rows > 1 {
		loads = (rows + d.KH - 1) * vec * d.KW
	}
	bcast := taps
	if d.w == nil {
		bcast = 0
	}
	perTile := float64(rows*vec*taps + loads + bcast)
	tiles := float64(d.Y/rows) * float64(ceilDiv(d.X, vec*lanes))
	return perTile * tiles
}

// loadsInRegisters is the default of the choice to keep the loads that
// a tile of rows × vec accumulators shares in registers (the window's
// rows unrolled): where the registers the tile needs (tileRegisters)
// are at most the target's vector registers, so that the loads need not
// spill. Without the annotation GCC (its tuning for AMD Zen) folds a
// load that several rows' multiply-adds share into each of them as a
// memory operand: a 3×3 depthwise convolution over 144 channels of
// 56×56, in tiles of 8 rows × 16 lanes, then loads 72 vectors a tile
// where its rows share 30, and ran 1.4× slower on one core of an AMD
// EPYC (Zen 4, AVX-512). Tiles that need more registers than there are
// (convnext_tiny's 7×7 windows, efficientnet_b0's with a SiLU, AVX2's
// 8-row tiles) gained nothing in sum with their loads in registers,
// which then spill (each kernel 0.85–1.09× the time; convnext_tiny's
// 1.03–1.09×), so they keep the compiler's choice.
func (d *depthwisePlane) loadsInRegisters(rows, vec int64, epilogue bool, opts Options) bool {
	return d.tileRegisters(rows, vec, epilogue) <= opts.withDefaults().VectorRegisters
}

// tileRegisters estimates the vector registers a tile of rows × vec
// accumulators needs with the window's rows unrolled: the accumulators;
// the loads its rows share that are live at once, (rows − 1) × KW × vec
// (the vectors of the window's row that later rows of the tile reuse);
// and when the epilogue is on the tile, its constants, each distinct
// one and a dozen for each math function but rounding and absolute
// values (the vector exponential, tanh or erf is a polynomial whose
// coefficients the C compiler keeps in registers across the tile).
func (d *depthwisePlane) tileRegisters(rows, vec int64, epilogue bool) int64 {
	n := rows*vec + (rows-1)*d.KW*vec
	if !epilogue || d.epilogue == nil {
		return n
	}
	consts := map[float64]bool{}
	ir.Visit(d.epilogue.Block.Body, func(e ir.Node) bool {
		switch e := e.(type) {
		case *ir.FloatImm:
			consts[e.Value] = true
		case *ir.Call:
			if _, ok := ir.Intrinsics[e.Op]; ok && !roundingOps[e.Op] {
				n += 12
			}
		}
		return true
	})
	return n + int64(len(consts))
}

// roundingOps are the intrinsics that hold no constants: rounding and
// absolute values.
var roundingOps = map[string]bool{"fabs": true, "abs": true, "floor": true, "ceil": true, "round": true, "trunc": true, "nearbyint": true}

// planeSite names the plane rule's choice what for block c.
func planeSite(c convBlock, what string) string { return "plane/" + c.name + "/" + what }

// inlineAfterIn inlines the elementwise blocks after block name into the
// last of them, in s (see inlineAfter).
func inlineAfterIn(s *schedule.Schedule, name string) error {
	after := blocksAfter(s.Func(), name)
	for _, a := range after[:max(len(after)-1, 0)] {
		b, err := s.GetBlock(a)
		if err != nil {
			return err
		}
		if err := s.ComputeInline(b); err != nil {
			return skip("block %q after %q cannot be inlined: %v", a, name, err)
		}
	}
	return nil
}

// matchPlaneFunc returns f with the elementwise blocks after block c
// inlined into the last of them, and what matchDepthwisePlane finds in
// it.
func matchPlaneFunc(f *ir.PrimFunc, c convBlock) (*ir.PrimFunc, *depthwisePlane, error) {
	g, err := inlineAfter(f, c.name)
	if err != nil {
		return nil, nil, err
	}
	d, err := matchDepthwisePlane(g, c)
	return g, d, err
}

// inlineAfter returns f with the elementwise blocks after block name
// inlined into the last of them, which the rules then compute from their
// result.
func inlineAfter(f *ir.PrimFunc, name string) (*ir.PrimFunc, error) {
	s, err := inlinedAfter(f, name)
	if err != nil {
		return nil, err
	}
	return s.Func(), nil
}

func matchDepthwisePlane(f *ir.PrimFunc, cb convBlock) (*depthwisePlane, error) {
	d := &depthwisePlane{}
	blocks := topBlocks(f)
	for i, br := range blocks {
		if br.Block.Name == cb.name {
			d.conv = br
			switch {
			case i == len(blocks)-1:
			case i == len(blocks)-2:
				d.epilogue = blocks[i+1]
			default:
				return nil, skip("more than one block after %q", cb.name)
			}
			if i > 1 {
				return nil, skip("more than one block before %q", cb.name)
			}
			if i == 1 {
				d.pad = blocks[0]
			}
		}
	}
	if d.conv == nil {
		return nil, skip("no block %q", cb.name)
	}
	b := d.conv.Block
	st, ok := b.Body.(*ir.BufferStore)
	if !ok {
		return nil, skip("block %q: not a store", cb.name)
	}
	iv := b.IterVars
	d.n, d.c, d.y, d.x = iv[0].Var, iv[1].Var, iv[2].Var, iv[3].Var
	d.N, d.C, d.Y, d.X = cb.spatial[0], cb.spatial[1], cb.spatial[2], cb.spatial[3]
	nr := len(iv) - 2
	d.ry, d.rx = iv[nr].Var, iv[nr+1].Var
	d.KH, d.KW = cb.reduce[len(cb.reduce)-2], cb.reduce[len(cb.reduce)-1]
	var a *ir.BufferLoad
	if a, d.w, ok = multiplyAccumulate(st); ok && len(cb.reduce) == 3 {
		d.rc = iv[4].Var
		if usesVar(a, d.ry) && usesVar(d.w, d.y) || !usesVar(a, d.x) {
			a, d.w = d.w, a
		}
		d.op, d.init = ir.OpAdd, ir.F32(0)
		if usesVar(d.w, d.y) || usesVar(d.w, d.x) {
			return nil, skip("block %q: operands", cb.name)
		}
	} else if r, ok := reduction(b, st); ok && len(cb.reduce) == 2 {
		// A pooling window: a sum or maximum of A's elements.
		if a, ok = r.term.(*ir.BufferLoad); !ok {
			return nil, skip("block %q: not a pooling window", cb.name)
		}
		d.op, d.init, d.w = r.op, r.init, nil
	} else {
		return nil, skip("block %q: not a window", cb.name)
	}
	d.a = a
	if len(a.Indices) != 4 {
		return nil, skip("block %q: operands", cb.name)
	}
	for i := range st.Indices {
		if !isVar(st.Indices[i], iv[i].Var) {
			return nil, skip("block %q: output indices", cb.name)
		}
	}
	if d.sy, d.offY, ok = windowIndex(a.Indices[2], d.y, d.ry); !ok {
		return nil, skip("block %q: rows of the input", cb.name)
	}
	if d.sx, d.offX, ok = windowIndex(a.Indices[3], d.x, d.rx); !ok {
		return nil, skip("block %q: columns of the input", cb.name)
	}
	for _, e := range a.Indices[:2] {
		for _, v := range []*ir.Var{d.y, d.x, d.ry, d.rx} {
			if usesVar(e, v) {
				return nil, skip("block %q: input channel", cb.name)
			}
		}
	}
	src, err := matchSource(f, cb.name, a.Buffer, d.pad)
	if err != nil {
		return nil, err
	}
	d.planeSource = src
	if d.epilogue != nil {
		est, ok := d.epilogue.Block.Body.(*ir.BufferStore)
		if !ok || !isSpatial(d.epilogue.Block) || len(est.Indices) != 4 || !isParam(f, est.Buffer) {
			return nil, skip("the block after %q is not elementwise", cb.name)
		}
		for i, ix := range est.Indices {
			ext, _ := ir.IsConstInt(d.epilogue.Block.IterVars[i].Dom.Extent)
			if !isVar(ix, d.epilogue.Block.IterVars[i].Var) || ext != cb.spatial[i] {
				return nil, skip("the block after %q is not elementwise", cb.name)
			}
		}
		bad := false
		ir.Visit(est.Value, func(n ir.Node) bool {
			if l, ok := n.(*ir.BufferLoad); ok && l.Buffer == st.Buffer {
				for i, ix := range l.Indices {
					bad = bad || !isVar(ix, d.epilogue.Block.IterVars[i].Var)
				}
			}
			return !bad
		})
		if bad {
			return nil, skip("the block after %q reads it elsewhere", cb.name)
		}
	} else if !isParam(f, st.Buffer) {
		return nil, skip("block %q writes an intermediate nobody reads", cb.name)
	}
	return d, nil
}

// matchPad matches block d.pad as a padding stage of a's four
// dimensions, A[i0, i1, i2, i3] = if_then_else(inside, src[i0, i1, i2 -
// padY, i3 - padX], value), value a constant, src a parameter.
func (p *planeSource) matchPad(f *ir.PrimFunc, pad *ir.BlockRealize, a *ir.Buffer) error {
	st, ok := pad.Block.Body.(*ir.BufferStore)
	if !ok || st.Buffer != a || !isSpatial(pad.Block) || len(st.Indices) != 4 {
		return skip("the block before the window is not its padding")
	}
	for i, ix := range st.Indices {
		if !isVar(ix, pad.Block.IterVars[i].Var) {
			return skip("padding indices")
		}
	}
	call, ok := st.Value.(*ir.Call)
	if !ok || call.Op != ir.OpIfThenElse || len(call.Args) != 3 {
		return skip("padding: not a conditional")
	}
	src, ok := call.Args[1].(*ir.BufferLoad)
	if !ok || !isParam(f, src.Buffer) || len(src.Indices) != 4 {
		return skip("padding: not a load of a parameter")
	}
	switch v := call.Args[2].(type) {
	case *ir.FloatImm:
	case *ir.Cast:
		if _, ok := v.Value.(*ir.FloatImm); !ok {
			return skip("padding value")
		}
	default:
		return skip("padding value")
	}
	iv := pad.Block.IterVars
	var off [4]int64
	for i, ix := range src.Indices {
		env := map[*ir.Var]int64{}
		for _, v := range iv {
			env[v.Var] = 0
		}
		o, ok := evalInt(ix, env)
		env[iv[i].Var] = 5
		o5, ok5 := evalInt(ix, env)
		if !ok || !ok5 || o5-o != 5 {
			return skip("padding: index %d", i)
		}
		for j, v := range iv {
			if j != i && usesVar(ix, v.Var) {
				return skip("padding: index %d", i)
			}
		}
		off[i] = o
	}
	if off[0] != 0 || off[1] != 0 {
		return skip("padding of batch or channels")
	}
	p.src, p.padY, p.padX, p.padValue = src.Buffer, -off[2], -off[3], call.Args[2]
	return nil
}

func isParam(f *ir.PrimFunc, b *ir.Buffer) bool {
	for _, p := range f.Params {
		if f.BufferMap[p] == b {
			return true
		}
	}
	return false
}

// windowIndex matches e = o·s + r + off (o the output position, r the
// window's, dilation 1) and returns s and off.
func windowIndex(e ir.Expr, o, r *ir.Var) (s, off int64, ok bool) {
	at := func(ov, rv int64) (int64, bool) {
		return evalInt(e, map[*ir.Var]int64{o: ov, r: rv})
	}
	off, ok0 := at(0, 0)
	s, ok1 := at(1, 0)
	r1, ok2 := at(0, 1)
	s3, ok3 := at(3, 2)
	s, r1 = s-off, r1-off
	if !ok0 || !ok1 || !ok2 || !ok3 || r1 != 1 || s < 1 || s3-off != 3*s+2 {
		return 0, 0, false
	}
	return s, off, true
}

// evalInt evaluates an integer expression of the variables in env.
func evalInt(e ir.Expr, env map[*ir.Var]int64) (int64, bool) {
	switch e := e.(type) {
	case *ir.IntImm:
		return e.Value, true
	case *ir.Var:
		v, ok := env[e]
		return v, ok
	case *ir.Cast:
		return evalInt(e.Value, env)
	case *ir.Binary:
		a, ok1 := evalInt(e.A, env)
		b, ok2 := evalInt(e.B, env)
		if !ok1 || !ok2 {
			return 0, false
		}
		switch e.Op {
		case ir.OpAdd:
			return a + b, true
		case ir.OpSub:
			return a - b, true
		case ir.OpMul:
			return a * b, true
		case ir.OpFloorDiv:
			if b > 0 && a >= 0 {
				return a / b, true
			}
		case ir.OpFloorMod:
			if b > 0 && a >= 0 {
				return a % b, true
			}
		}
	}
	return 0, false
}

// ceilDiv is a/b rounded up (b > 0).
func ceilDiv(a, b int64) int64 {
	if a >= 0 {
		return (a + b - 1) / b
	}
	return -((-a) / b)
}

// schedule applies the rule's primitives to s (the function with its
// epilogue inlined into one block), its rows in vectors of lanes; rows
// that vectors divide, or that the last vector overlaps, take the
// epilogue on the register tile when epilogue is set. Its choices:
//
//	overlap   rows no vector divides: the last vector of each tile
//	          moves back to end at the row's end (split_overlap) and the
//	          tile is stored where it belongs, or the row is padded to
//	          whole vectors (pad_einsum) and its X columns copied out
//	vectors   the vectors of a tile along the row
//	rows      the rows of a tile (a divisor of the rows)
//	unroll_ry the window's rows unrolled too: the tile's rows then share
//	          the loads of the plane's rows they have in common
//	loads_in_registers
//	          with the rows unrolled, those shared loads kept in
//	          registers (see loadsInRegisters)
//	parallel  the channels in parallel
func (d *depthwisePlane) schedule(s *schedule.Schedule, c convBlock, lanes int64, opts Options, epilogue bool) error {
	nv := ceilDiv(d.X, lanes) // vectors in a row
	if nv > maxPlaneVectors {
		return skip("block %q: rows of %d are too wide", c.name, d.X)
	}
	blk, err := s.GetBlock(c.name)
	if err != nil {
		return err
	}
	overlap := false
	if d.X%lanes != 0 && d.X >= lanes {
		if overlap, err = opts.chooseBool(s, planeSite(c, "overlap"), true); err != nil {
			return err
		}
	}
	if !overlap {
		// Whole vectors along x: the padded domain reads a padded copy
		// of the plane (the padding stage inlined into it) and stores a
		// padded output whose extra columns are dropped.
		padding := make([]int64, len(c.spatial)+len(c.reduce))
		for i := range padding {
			padding[i] = 1
		}
		padding[3] = lanes
		if err := s.PadEinsum(blk, padding); err != nil {
			return err
		}
	}
	plane, err := d.planeBlock(s, blk)
	if err != nil {
		return err
	}
	loops, err := s.GetLoops(blk)
	if err != nil {
		return err
	}
	if len(loops) != len(c.spatial)+len(c.reduce) {
		return skip("block %q is nested in other loops", c.name)
	}
	// A tile of rows × vectors stays in registers: every divisor of the
	// row's vectors when the row is padded, any number that fits in the
	// row when the last vector moves back; its rows, the divisors of the
	// plane's rows whose tile fits in the target's accumulators. By
	// default the tile of maxPlaneAccumulators vectors at most that
	// takes the fewest operations (see planeTileCost), the most vectors
	// of equals.
	var vcands []int64
	for v := int64(1); v <= nv; v++ {
		if overlap && v*lanes <= d.X || !overlap && nv%v == 0 {
			vcands = append(vcands, v)
		}
	}
	rowCands := func(vec int64) []int64 {
		var rs []int64
		for r := int64(1); r <= min(d.Y, max(1, opts.accumulators()/vec)); r++ {
			if d.Y%r == 0 {
				rs = append(rs, r)
			}
		}
		return rs
	}
	limit := max(1, min(maxPlaneAccumulators, opts.accumulators()))
	// bestRows is the default rows of a tile of vec vectors and its cost.
	bestRows := func(vec int64) (int64, float64) {
		rdef, least := int64(1), d.planeTileCost(lanes, vec, 1)
		for _, r := range rowCands(vec) {
			if r*vec > limit {
				break
			}
			if cost := d.planeTileCost(lanes, vec, r); cost <= least {
				rdef, least = r, cost
			}
		}
		return rdef, least
	}
	vdef, least := vcands[0], math.Inf(1)
	for _, v := range vcands {
		if _, cost := bestRows(v); cost <= least {
			vdef, least = v, cost
		}
	}
	vec, err := opts.choose(s, planeSite(c, "vectors"), vcands, vdef)
	if err != nil {
		return err
	}
	rdef, _ := bestRows(vec)
	yt, err := opts.choose(s, planeSite(c, "rows"), rowCands(vec), rdef)
	if err != nil {
		return err
	}
	ys, err := s.Split(loops[2], d.Y/yt, yt)
	if err != nil {
		return err
	}
	var xs []schedule.LoopRV
	if overlap {
		xs, err = s.SplitOverlap(loops[3], -1, vec, lanes)
	} else {
		xs, err = s.Split(loops[3], -1, vec, lanes)
	}
	if err != nil {
		return err
	}
	order := append([]schedule.LoopRV{loops[0], loops[1], ys[0], xs[0]}, loops[4:]...)
	tile := []schedule.LoopRV{ys[1], xs[1], xs[2]}
	if err := s.Reorder(append(order, tile...)...); err != nil {
		return err
	}
	if overlap || d.X%lanes == 0 {
		if err := registerTile(s, blk, nil, xs[0], loops[4], tile, lanes, epilogue); err != nil {
			return err
		}
	} else if err := d.paddedTile(s, blk, ys[0], xs[0], loops[4], tile, lanes); err != nil {
		return err
	}
	// The window's taps along the row, unrolled: each reads the plane at
	// a constant offset (stride 2: from a constant phase).
	if err := s.Unroll(loops[len(loops)-1]); err != nil {
		return err
	}
	// The window's rows unrolled share the loads of a tile of several
	// rows (see planeTileCost): that is the default.
	unrollRows, err := opts.chooseBool(s, planeSite(c, "unroll_ry"), yt > 1 && d.KH > 1)
	if err != nil {
		return err
	}
	if unrollRows {
		if err := s.Unroll(loops[len(loops)-2]); err != nil {
			return err
		}
		// The vectors the unrolled rows share stay one load each in a
		// register (ir.AttrVectorLoadsInRegisters) where the C compiler
		// would fold them into every multiply-add that uses them.
		// The annotation goes on the innermost loop around the tile that
		// lowering keeps (more than one iteration).
		var at *schedule.LoopRV
		switch {
		case ceilDiv(d.X, vec*lanes) > 1:
			at = &xs[0]
		case d.Y/yt > 1:
			at = &ys[0]
		case d.C > 1:
			at = &loops[1]
		}
		if at != nil {
			pin, err := opts.chooseBool(s, planeSite(c, "loads_in_registers"), d.loadsInRegisters(yt, vec, epilogue, opts))
			if err != nil {
				return err
			}
			if pin {
				if err := s.Annotate(*at, ir.AttrVectorLoadsInRegisters, true); err != nil {
					return err
				}
			}
		}
	}
	if plane != nil {
		if err := s.ComputeAt(*plane, loops[1]); err != nil {
			return err
		}
		// A stride of 2: the phase under the rows by default, so that
		// both phases of a row are copied while the input's row is in
		// cache (a plane larger than the cache is read once, not once
		// per phase); outermost is a choice.
		outer := false
		if d.sx > 1 {
			if outer, err = opts.chooseBool(s, planeSite(c, "phase_outer"), false); err != nil {
				return err
			}
		}
		if err := phaseLoops(s, *plane, d.sx, outer); err != nil {
			return err
		}
	}
	if opts.ParallelFlops > 0 && d.C > 1 {
		par, err := opts.chooseBool(s, planeSite(c, "parallel"), d.C*d.Y*d.X*d.KH*d.KW*8 >= opts.ParallelFlops)
		if err != nil {
			return err
		}
		if par {
			if err := s.Parallel(loops[1]); err != nil {
				return err
			}
		}
	}
	return nil
}

// planeBlock returns the block that writes the plane block blk reads (the
// padded copy, the padding stage, or for a parameter read with a stride
// a copy of it), with the padding stage inlined into a padded copy; a
// stride of 2 stores the plane's even and odd columns apart (w % 2, w //
// 2), so that every tap reads consecutive elements. It is nil when blk
// reads a parameter in place.
func (d *depthwisePlane) planeBlock(s *schedule.Schedule, blk schedule.BlockRV) (*schedule.BlockRV, error) {
	br, err := s.BlockRealize(blk)
	if err != nil {
		return nil, err
	}
	read := -1
	for i, r := range br.Block.Reads {
		if d.w == nil || r.Buffer != d.w.Buffer {
			if r.Buffer != br.Block.Body.(*ir.BufferStore).Buffer {
				read = i
				break
			}
		}
	}
	if read < 0 {
		return nil, skip("block %q reads no plane", br.Block.Name)
	}
	planeBuf := br.Block.Reads[read].Buffer
	writer := writerOf(s.Func(), planeBuf)
	if writer != "" && d.pad != nil && writer != d.pad.Block.Name {
		// The padded copy reads the padding stage: inline it.
		pad, err := s.GetBlock(d.pad.Block.Name)
		if err != nil {
			return nil, err
		}
		if err := s.ComputeInline(pad); err != nil {
			return nil, err
		}
	}
	deinterleave := "lambda n, c, h, w: (n, c, w % 2, h, w // 2)"
	var zero float64
	var pb schedule.BlockRV
	switch {
	case writer == "" && d.sx == 1:
		return nil, nil
	case writer == "":
		m, err := schedule.ParseIndexMap(deinterleave)
		if err != nil {
			return nil, err
		}
		pb, err = s.CacheReadLayout(blk, read, "global", m, &zero)
		return &pb, err
	default:
		pb, err = s.GetBlock(writer)
		if err != nil {
			return nil, err
		}
	}
	if d.sx == 2 {
		m, err := schedule.ParseIndexMap(deinterleave)
		if err != nil {
			return nil, err
		}
		if err := s.TransformLayout(pb, schedule.BufferIndex{Write: true}, m, &zero); err != nil {
			return nil, err
		}
	}
	return &pb, nil
}

// writerOf names the block of f that writes buf, or "" for none (a
// parameter).
func writerOf(f *ir.PrimFunc, buf *ir.Buffer) string {
	name := ""
	ir.Visit(f.Body, func(n ir.Node) bool {
		if b, ok := n.(*ir.Block); ok && b.Name != ir.RootBlockName {
			for _, w := range b.Writes {
				if w.Buffer == buf {
					name = b.Name
				}
			}
		}
		return name == ""
	})
	return name
}

// paddedTile accumulates blk's padded rows in a tile of registers and
// stores them, whole vectors, to the padded output; the copy of its
// first X columns (through the epilogue, when there is one) runs after
// each tile of rows (loop rows). When the epilogue reads nothing else
// along the row (a bias, Clip) it runs on the whole vectors too, extra
// lanes included, into a padded output of its own.
func (d *depthwisePlane) paddedTile(s *schedule.Schedule, blk schedule.BlockRV, rows, at, red schedule.LoopRV, tile []schedule.LoopRV, lanes int64) error {
	br, err := s.BlockRealize(blk)
	if err != nil {
		return err
	}
	after := blocksAfter(s.Func(), br.Block.Name) // the unpadding copy, the epilogue
	wb, err := s.CacheWrite(blk, 0, "local")
	if err != nil {
		return err
	}
	init, err := s.DecomposeReduction(blk, red)
	if err != nil {
		return err
	}
	store := wb
	var copyOut string
	switch {
	case len(after) == 1:
		copyOut = after[0]
	case len(after) == 2 && d.vectorTail():
		// The epilogue on the padded rows: it reads the padded output
		// where it is, the accumulators once the write-back is inlined.
		unpad, err := s.GetBlock(after[0])
		if err != nil {
			return err
		}
		if err := s.ComputeInline(unpad); err != nil {
			return err
		}
		ep, err := s.GetBlock(after[1])
		if err != nil {
			return err
		}
		if err := s.PadEinsum(ep, []int64{1, 1, 1, lanes}); err != nil {
			return err
		}
		if err := s.ComputeInline(wb); err != nil {
			return err
		}
		store = ep
		epr, err := s.BlockRealize(ep)
		if err != nil {
			return err
		}
		copyOut = blocksAfter(s.Func(), epr.Block.Name)[0]
	case len(after) == 2:
		unpad, err := s.GetBlock(after[0])
		if err != nil {
			return err
		}
		if err := s.ComputeInline(unpad); err != nil {
			return err
		}
		copyOut = after[1]
	default:
		return skip("block %q: %d blocks after it", br.Block.Name, len(after))
	}
	if err := tileStore(s, store, at, lanes); err != nil {
		return err
	}
	out, err := s.GetBlock(copyOut)
	if err != nil {
		return err
	}
	if err := s.ReverseComputeAt(out, rows); err != nil {
		return err
	}
	// The copy's loop over the padded row stops at X (its guard, split
	// off, is never taken).
	ol, err := s.GetLoops(out)
	if err != nil {
		return err
	}
	if err := s.Annotate(ol[len(ol)-1], loopPartitionHint, true); err != nil {
		return err
	}
	return unrollTile(s, tile, init)
}

// vectorTail reports whether the epilogue reads nothing but the
// convolution along the row (a bias, Clip: it may be computed on lanes
// past the row's end).
func (d *depthwisePlane) vectorTail() bool {
	if d.epilogue == nil {
		return true
	}
	outBuf := d.conv.Block.Body.(*ir.BufferStore).Buffer
	x := d.epilogue.Block.IterVars[3].Var
	tail := true
	ir.Visit(d.epilogue.Block.Body.(*ir.BufferStore).Value, func(m ir.Node) bool {
		if l, ok := m.(*ir.BufferLoad); ok && l.Buffer != outBuf && usesVar(l, x) {
			tail = false
		}
		return tail
	})
	return tail
}

// loopPartitionHint is transform.AttrLoopPartitionHint (TVM's key).
const loopPartitionHint = "pragma_loop_partition_hint"
