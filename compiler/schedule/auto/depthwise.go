package auto

import (
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// Convolutions along the output's rows: depthwise and grouped
// convolutions over NCHW data (topi.Conv2D's group_conv2d_nchw), and any
// convolution whose kernel is not in HWIO,
//
//	C[n, f, y, x] += A[n, c, y·s+ry, x·s+rx] · W[f, c, ry, rx]
//
// that is, a block of spatial iteration variables then two or more
// reductions whose store's last index is the last spatial variable (x),
// which the second operand does not use. When the first reads the row
// with a stride of 1 (stride-2 rows would gather lane by lane) and a
// vector of 4 lanes or more divides it, the tile is a run of xi outputs
// along x kept in vector registers (the widest vectors that fit in the
// row, see rowTile) over the whole reduction, times fi output channels
// when A does not depend on the channel (a convolution of one group in
// OIHW: each step loads the row's vectors once for fi broadcast
// weights; pointwise ones take the flattened plane first, pointwise.go),
// times (a choice, one by default) yi output rows, which every weight
// broadcast then feeds; a depthwise
// channel has weights of its own, so its tile is one row. The epilogue
// runs on the tile as for the channel-vectorized convolution (conv.go),
// and the rows of all channels are shared among the threads. Depthwise
// convolutions compute a plane per channel instead (depthwise_plane.go),
// which measured 1.1–2.4× faster on mobilenet_v2's.

// maxRowVectors bounds the vectors of a row tile along the row; with
// output channel rows, maxRowVectors/2 vectors along the row times the
// rows stay within the accumulators the registers hold (Options.accumulators).
const maxRowVectors = 8

// findRowConvs lists the unscheduled blocks of f of the row form, a
// convBlock each (its last spatial variable is x).
func findRowConvs(f *ir.PrimFunc) []convBlock { return findBlocks(f, matchRowConv) }

func matchRowConv(br *ir.BlockRealize) (convBlock, bool) {
	c, x, a, w, ok := lastAxisMAC(br, 2)
	if !ok {
		return matchPool(br)
	}
	if !onlyLastUses(a.Indices, x) || usesVar(w, x) {
		return convBlock{}, false
	}
	for i, iv := range br.Block.IterVars[:len(c.spatial)-1] {
		if usesVar(w, iv.Var) && !usesVar(a, iv.Var) {
			c.rows = i
		}
	}
	return c, true
}

// matchPool matches a pooling window over NCHW data, a sum or maximum
// C[n, c, y, x] op= A[n, c, y·s+ry, x·s+rx] over two reductions; it runs
// as a depthwise convolution's plane (depthwise_plane.go).
func matchPool(br *ir.BlockRealize) (convBlock, bool) {
	spatial, reduce, ok := unscheduledExtents(br)
	st, isStore := br.Block.Body.(*ir.BufferStore)
	if !ok || !isStore || len(spatial) != 4 || len(reduce) != 2 {
		return convBlock{}, false
	}
	if _, ok := reduction(br.Block, st); !ok {
		return convBlock{}, false
	}
	return convBlock{name: br.Block.Name, dtype: st.Buffer.DType, spatial: spatial, reduce: reduce, rows: -1}, true
}

// unitStep reports whether e is x plus terms free of x: consecutive x
// read consecutive elements (a stride of 1), so a run of x is one vector
// load.
func unitStep(e ir.Expr, x *ir.Var) bool {
	if isVar(e, x) {
		return true
	}
	sum, ok := e.(*ir.Binary)
	if !ok || sum.Op != ir.OpAdd {
		return false
	}
	return unitStep(sum.A, x) && !usesVar(sum.B, x) || unitStep(sum.B, x) && !usesVar(sum.A, x)
}

// rowTile picks the lanes of the row tile's vectors: the widest power of
// two of at least 4, at most maxLanes, that fits in the row (the fewest
// vectors per row; a row they do not divide ends in a run that overlaps
// the one before). ok is false when no such power of two divides X
// (unrolled scalars measured slower than the unscheduled loops, which GCC
// vectorizes itself).
func rowTile(X, maxLanes int64) (lanes int64, ok bool) {
	for l := maxLanes; l >= 4; l /= 2 {
		if X%l == 0 {
			ok = true
		}
		if lanes == 0 && l <= X {
			lanes = l
		}
	}
	return lanes, ok && lanes > 0
}

// rowVectors picks the vectors of lanes along a row of X in the row tile,
// at most maxVecs and X/lanes: the count whose runs take the fewest
// vectors over the row (⌈X/(v·lanes)⌉·v; a last run that overlaps the one
// before computes some outputs twice), the larger on a tie.
func rowVectors(X, lanes, maxVecs int64) int64 {
	best, cost := int64(1), int64(0)
	for v := int64(1); v <= min(maxVecs, X/lanes); v++ {
		if c := (X + v*lanes - 1) / (v * lanes) * v; cost == 0 || c <= cost {
			best, cost = v, c
		}
	}
	return best
}

// unitRows reports whether block c of f reads its input with a stride of
// 1 along the row (the register tile loads a run of it as one vector).
func unitRows(f *ir.PrimFunc, c convBlock) bool {
	unit := false
	findBlocks(f, func(br *ir.BlockRealize) (struct{}, bool) {
		if br.Block.Name == c.name {
			if _, x, a, _, ok := lastAxisMAC(br, 2); ok {
				unit = unitStep(a.Indices[len(a.Indices)-1], x)
			}
		}
		return struct{}{}, false
	})
	return unit
}

func rowConvSchedule(s *schedule.Schedule, c convBlock, opts Options, epilogue bool) error {
	blk, loops, maxLanes, err := c.loops(s, opts.VectorBytes)
	if err != nil {
		return err
	}
	site := func(what string) string { return RuleRowConv + "/" + c.name + "/" + what }
	pad := padProducer(s.Func(), c.name)
	ns := len(c.spatial)
	X := c.spatial[ns-1]
	lanes, ok := rowTile(X, maxLanes)
	if !ok || !unitRows(s.Func(), c) {
		return skip("block %q: rows of %d take no vectors", c.name, X)
	}
	// The tile: lanes per vector, vectors along the row, output
	// channel rows; each default is rowTile's pick for the choices
	// before it.
	// Vectors that do not divide the row end with a run that overlaps
	// the one before (SplitOverlap).
	var laneCands []int64
	for l := maxLanes; l >= 4; l /= 2 {
		if l <= X {
			laneCands = append(laneCands, l)
		}
	}
	if lanes, err = opts.choose(s, site("lanes"), laneCands, lanes); err != nil {
		return err
	}
	maxVecs := int64(maxRowVectors)
	if c.rows >= 0 {
		maxVecs /= 2
	}
	xv := rowVectors(X, lanes, maxVecs)
	if xv, err = opts.choose(s, site("vectors"), upTo(min(X/lanes, max(maxRowVectors, opts.accumulators()))), xv); err != nil {
		return err
	}
	xi := xv * lanes
	if epilogue, err = chooseEpilogue(s, c, opts, site("epilogue"), epilogue); err != nil {
		return err
	}
	outer := append([]schedule.LoopRV{}, loops[:ns-1]...)
	tile := []schedule.LoopRV{}
	if c.rows >= 0 {
		// Rows that do not divide the channels end with a tile that
		// overlaps the one before.
		fy := c.spatial[c.rows]
		limit := max(1, opts.accumulators()/xv)
		fi, err := opts.choose(s, site("rows"), tileSizes(fy, limit), largestDivisor(fy, limit))
		if err != nil {
			return err
		}
		split := s.Split
		if fy%fi != 0 {
			split = s.SplitOverlap
		}
		fs, err := split(loops[c.rows], -1, fi)
		if err != nil {
			return err
		}
		outer[c.rows] = fs[0]
		tile = append(tile, fs[1])
		// Output rows (the spatial loop before x) in the tile too: each
		// weight broadcast then feeds every row of the tile, for a load
		// of A per row; the rule's own is one row.
		if y := ns - 2; y > c.rows {
			yi, err := opts.choose(s, site("out_rows"), divisorsUpTo(c.spatial[y], max(1, opts.accumulators()/(xv*fi))), 1)
			if err != nil {
				return err
			}
			if yi > 1 {
				ys, err := s.Split(loops[y], -1, yi)
				if err != nil {
					return err
				}
				outer[y] = ys[0]
				tile = append(tile, ys[1])
			}
		}
		// The tiles of rows outside the spatial loops after them (a
		// tile of W stays in cache while the rows of A stream by, the
		// rule's own), or innermost of the outer loops (a row of A stays
		// in cache while the tiles of W go by).
		inside, err := opts.chooseBool(s, site("rows_inner"), false)
		if err != nil {
			return err
		}
		if inside {
			outer = append(append(slices.Clone(outer[:c.rows]), outer[c.rows+1:]...), fs[0])
		}
	}
	split := s.Split
	if X%xi != 0 {
		split = s.SplitOverlap
	}
	xs, err := split(loops[ns-1], -1, xv, lanes)
	if err != nil {
		return err
	}
	if err := c.tileOverReductions(s, blk, loops[ns:], append(outer, xs[0]), append(tile, xs[1:]...), identity(len(c.reduce)), lanes, epilogue, opts, site); err != nil {
		return err
	}
	par, err := padStage(s, site("padding"), pad, append(outer, xs[0]), opts)
	if err != nil {
		return err
	}
	if len(outer) == 0 {
		par = nil
	} else if X%xi != 0 {
		par = par[:min(len(par), len(outer))] // xs[0] recomputes its last iteration
	}
	// Rows are memory-bound: they go parallel earlier than a matmul.
	on := opts.ParallelFlops > 0 && product(c.spatial)*product(c.reduce)*8 >= opts.ParallelFlops && len(outer) > 0
	return chooseParallel(s, site("parallel"), par, len(outer), on, opts)
}

// identity is 0, 1, …, n-1.
func identity(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	return p
}
