package auto

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// Options tune the default schedules.
type Options struct {
	// VectorBytes is the width of the target's vector registers (64 with
	// AVX-512); 0 means 64.
	VectorBytes int64
	// ParallelFlops is the multiply-add count from which the outer tile
	// loop runs in parallel (waking the pool's threads costs microseconds); 0
	// means DefaultParallelFlops, negative never.
	ParallelFlops int64
	// VectorRegisters is the number of the target's vector registers,
	// which bounds the accumulators of a register tile (three quarters
	// of the file); 0 means 32 with 64-byte vectors (AVX-512), else 16.
	VectorRegisters int64
	// L1DBytes is one core's L1 data cache: a stem convolution's strip of
	// input rows must fit in it; 0 means DefaultL1DBytes.
	L1DBytes int64
	// L2Bytes is one core's L2 cache: a pointwise convolution whose input
	// is larger reads it once, in tiles of positions outside tiles of
	// channels; 0 means DefaultL2Bytes.
	L2Bytes int64
	// FMAChains is how many independent multiply-adds a core keeps in
	// flight (the multiply-add's latency times the units that issue
	// one per cycle): a register tile with fewer accumulators leaves
	// the units idle while each waits on its last multiply-add. 0 means
	// DefaultFMAChains.
	FMAChains int64
	// Decide makes the rules' choices (see Decider); nil takes each
	// rule's own pick, the default schedule.
	Decide Decider
}

// DefaultL1DBytes is Options.L1DBytes when it is zero.
const DefaultL1DBytes = 48 << 10

// DefaultL2Bytes is Options.L2Bytes when it is zero.
const DefaultL2Bytes = 1 << 20

// DefaultFMAChains is Options.FMAChains when it is zero: 4 cycles of
// latency on 2 units, the x86-64 cores since Skylake and Zen 2 and the
// Arm Neoverse cores.
const DefaultFMAChains = 8

// withDefaults fills in the zero options.
func (o Options) withDefaults() Options {
	if o.VectorBytes <= 0 {
		o.VectorBytes = 64
	}
	if o.ParallelFlops == 0 {
		o.ParallelFlops = DefaultParallelFlops
	}
	if o.VectorRegisters <= 0 {
		o.VectorRegisters = 16
		if o.VectorBytes >= 64 {
			o.VectorRegisters = 32
		}
	}
	if o.L1DBytes <= 0 {
		o.L1DBytes = DefaultL1DBytes
	}
	if o.L2Bytes <= 0 {
		o.L2Bytes = DefaultL2Bytes
	}
	if o.FMAChains <= 0 {
		o.FMAChains = DefaultFMAChains
	}
	return o
}

// accumulators is how many vector registers a register tile may keep its
// sums in: three quarters of the file (24 of AVX-512's 32, 12 of AVX2's
// 16), the rest for the loads and broadcasts that feed them.
func (o Options) accumulators() int64 { return max(1, o.VectorRegisters*3/4) }

// DefaultParallelFlops is Options.ParallelFlops when it is zero: below
// about a million multiply-adds one thread is faster than a fork/join
// (the transformer's 32×128×384 projection, 1.5 million, runs in 24 µs
// on two threads against 35 µs on one).
const DefaultParallelFlops = 1 << 20

// maxMatmulRows bounds the rows of a matmul's register tile: each vector
// of B loaded at a step of k feeds that many multiply-adds. With fewer
// than about six rows the loads, not the multiply-adds, bound the loop
// (a 32×128 · 128×2048 layer runs at 70 GFLOPS on one Zen 4 core with
// 4 rows × 4 vectors, 94–114 with 8 × 2).
const maxMatmulRows = 8

// maxMatmulVectors bounds the vectors of columns of a register tile
// whose rows are full (a matmul of more rows than maxMatmulRows): each
// step of k reads that many vectors of B, and the panel of B that the
// row tiles share (K × the tile's columns) is what the cache must hold;
// 4 rows × 4 vectors ran at 0.7× 8 × 2 on the layer above.
const maxMatmulVectors = 3

// matmulTile picks a matmul's register tile over rows × N: lanes per
// vector (the widest power of two of at most maxLanes that divides N, at
// least 4), mr rows (up to maxMatmulRows) and vecs vectors of columns (a
// divisor of N's vectors), as many as fit in the vector registers (regs)
// beside them: mr·vecs accumulators, vecs loads of B and one broadcast
// of A, the accumulators at most three quarters of the file.
//
// mr is the count whose tile holds the most accumulators per row it
// computes: a count that does not divide rows covers them with an
// overlapping last tile (split_overlap), whose recomputed rows count
// against it (6 rows over 32 run 36). Ties go to an exact divisor, then
// to more rows. A tile whose loads bound the loop is taken only when no
// other is left: a step of k loads vecs vectors of B and broadcasts mr
// values of A for mr·vecs multiply-adds, and a core that issues as many
// loads as multiply-adds a cycle (two and two on Zen 3 and 4, Haswell
// and later) waits on its loads when mr+vecs > mr·vecs, as one vector
// per row does. With AVX-512's 32 registers that is 8 rows of 2 vectors;
// with AVX2's 16 it is 6 rows of 2 (the 1024³ matmul on a Zen 3 core:
// 4 rows of 2 vectors, 8 accumulators, ran at 0.6× of it). Without a
// vector width that divides N, vector is false and the tile is one row
// of an unrolled run of up to 32 scalar columns.
func matmulTile(rows, N, maxLanes, regs int64) (lanes, mr, nt int64, vector bool) {
	for lanes = maxLanes; lanes >= 4 && N%lanes != 0; lanes /= 2 {
	}
	if lanes < 4 || lanes&(lanes-1) != 0 {
		return 1, 1, largestDivisor(N, 32), false
	}
	vecsLimit := func(d int64) int64 {
		v := matmulVectorLimit(d, regs)
		if rows > maxMatmulRows {
			v = min(v, maxMatmulVectors)
		}
		return v
	}
	vecs := func(d int64) int64 { return largestDivisor(N/lanes, vecsLimit(d)) }
	// The score of d rows: accumulators × rows / rows run, kept as the
	// fraction num/den to compare exactly.
	better := func(d, e int64) bool {
		vd, ve := vecs(d), vecs(e)
		lbD, lbE := d > 1 && d+vd > d*vd, e > 1 && e+ve > e*ve
		if lbD != lbE {
			return !lbD
		}
		runD, runE := (rows+d-1)/d*d, (rows+e-1)/e*e
		sd, se := d*vd*runE, e*ve*runD // (d·vd·rows/runD) vs (e·ve·rows/runE)
		if sd != se {
			return sd > se
		}
		if exD, exE := rows%d == 0, rows%e == 0; exD != exE {
			return exD
		}
		return d > e
	}
	mr = 1
	for d := int64(2); d <= min(rows, maxMatmulRows); d++ {
		if better(d, mr) {
			mr = d
		}
	}
	return lanes, mr, vecs(mr) * lanes, true
}

// matmulVectorLimit is how many vectors of columns a register tile of mr
// rows may have with regs vector registers: mr·vecs accumulators within
// three quarters of the file, and vecs loads of B and one broadcast of A
// beside them.
func matmulVectorLimit(mr, regs int64) int64 {
	return max(1, min(regs*3/4/mr, (regs-1)/(mr+1)))
}

// The codes of a matmul's parallel loop: none, the outer tile loop, the
// inner one, or parBatch+b, the b-th loop of the rows outside the tiles.
const (
	parNone int64 = iota
	parOuter
	parInner
	parBatch
)

// DenseTileWidth is the column tile the dense rule gives a float32 layer
// of rows × n on a target of vectorBytes-wide vectors and regs vector
// registers (0: as Options fills them in): the panel width a weight
// packed for it must have (relax's AlterDenseLayout). 0 when no vector
// width divides n.
func DenseTileWidth(rows, n, vectorBytes, regs int64) int64 {
	o := Options{VectorBytes: vectorBytes, VectorRegisters: regs}.withDefaults()
	_, _, nt, vector := matmulTile(rows, n, o.VectorBytes/4, o.VectorRegisters)
	if !vector {
		return 0
	}
	return nt
}

// DensePanels are the panel widths P, smallest first, of the weights
// packed in (N/P, K, P) panels (relax.matmul_packed) that the dense rule
// schedules for a float32 layer of rows × n (its tile then P columns
// wide) on a target of vectorBytes-wide vectors and regs vector
// registers (0: as Options fills them in): each P that divides n, below
// n, whose vectors are as wide as n's (the rule's own width for the
// layer) and whose register tile fits. DenseTileWidth is one of them when
// it is below n.
func DensePanels(rows, n, vectorBytes, regs int64) []int64 {
	o := Options{VectorBytes: vectorBytes, VectorRegisters: regs}.withDefaults()
	maxLanes := o.VectorBytes / 4
	lanes, _, _, vector := matmulTile(rows, n, maxLanes, o.VectorRegisters)
	if !vector {
		return nil
	}
	var out []int64
	for p := lanes; p < n; p += lanes {
		if n%p != 0 {
			continue
		}
		if l, _, nt, ok := matmulTile(rows, p, maxLanes, o.VectorRegisters); ok && l == lanes && nt == p {
			out = append(out, p)
		}
	}
	return out
}

// The rules FuncRule names, in the order it tries them.
const (
	RuleMatmul         = "matmul"
	RuleConvStem       = "conv2d stem"
	RulePointwise      = "pointwise conv2d"
	RuleConv           = "conv2d"
	RuleGlobalPool     = "global pool"
	RulePoolRows       = "pool"
	RuleDepthwisePlane = "depthwise conv2d"
	RuleRowConv        = "conv2d rows"
	RuleRowPipeline    = "row pipeline"
	RuleGeneric        = "elementwise and reductions"
)

// matmulBlock is a block C[.., i, j] += A[.., i, k] * B[.., k, j].
type matmulBlock struct {
	name    string
	dtype   ir.DType
	extents []int64 // per iteration variable; the last three are i, j, k
	// sharedB: B's index uses only j and k (a weight every row reads),
	// so the rows may be tiled in any order and share B's panels.
	sharedB bool
	// packed is P when B is a weight packed in panels of P columns,
	// B[j / P, k, j % P] (relax.matmul_packed): the column tile is P.
	packed int64
	// b is the buffer B.
	b *ir.Buffer
}

// findMatmuls lists the blocks of f that look like an unscheduled matmul:
// spatial iteration variables then one reduction, each bound to its own
// serial loop in order (as LegalizeOps makes them), with constant extents,
// a body C = C + A * B whose B index ends in (k, j) and whose C index
// ends in j.
func findMatmuls(f *ir.PrimFunc) []matmulBlock { return findBlocks(f, matchMatmul) }

// findBlocks lists, in program order, what match makes of the blocks of f
// it accepts.
func findBlocks[T any](f *ir.PrimFunc, match func(*ir.BlockRealize) (T, bool)) []T {
	var out []T
	ir.Visit(f.Body, func(n ir.Node) bool {
		br, ok := n.(*ir.BlockRealize)
		if !ok || br.Block == nil || br.Block.Name == ir.RootBlockName {
			return true
		}
		if m, ok := match(br); ok {
			out = append(out, m)
		}
		return true
	})
	return out
}

func matchMatmul(br *ir.BlockRealize) (matmulBlock, bool) {
	b := br.Block
	n := len(b.IterVars)
	if n < 3 || b.Init == nil || len(br.IterValues) != n || !isTrue(br.Predicate) {
		return matmulBlock{}, false
	}
	m := matmulBlock{name: b.Name, extents: make([]int64, n)}
	for i, iv := range b.IterVars {
		want := ir.IterSpatial
		if i == n-1 {
			want = ir.IterReduce
		}
		ext, ok := iv.Dom.Extent.(*ir.IntImm)
		if iv.Kind != want || !ok {
			return matmulBlock{}, false
		}
		if min, _ := iv.Dom.Min.(*ir.IntImm); min == nil || min.Value != 0 {
			return matmulBlock{}, false
		}
		// Bound directly to a loop variable (unscheduled).
		if _, ok := br.IterValues[i].(*ir.Var); !ok {
			return matmulBlock{}, false
		}
		m.extents[i] = ext.Value
	}
	st, ok := b.Body.(*ir.BufferStore)
	if !ok || len(st.Indices) == 0 {
		return matmulBlock{}, false
	}
	j, k := b.IterVars[n-2].Var, b.IterVars[n-1].Var
	if !isVar(st.Indices[len(st.Indices)-1], j) {
		return matmulBlock{}, false
	}
	sum, ok := st.Value.(*ir.Binary)
	if !ok || sum.Op != ir.OpAdd {
		return matmulBlock{}, false
	}
	c, ok := sum.A.(*ir.BufferLoad)
	if !ok || c.Buffer != st.Buffer {
		return matmulBlock{}, false
	}
	prod, ok := sum.B.(*ir.Binary)
	if !ok || prod.Op != ir.OpMul {
		return matmulBlock{}, false
	}
	bl, ok := prod.B.(*ir.BufferLoad)
	if !ok || len(bl.Indices) < 2 {
		return matmulBlock{}, false
	}
	if p := packedIndex(bl.Indices, j, k); p > 0 {
		m.packed = p
	} else if !isVar(bl.Indices[len(bl.Indices)-1], j) || !isVar(bl.Indices[len(bl.Indices)-2], k) {
		return matmulBlock{}, false
	}
	if _, ok := prod.A.(*ir.BufferLoad); !ok {
		return matmulBlock{}, false
	}
	m.dtype = st.Buffer.DType
	m.b = bl.Buffer
	m.sharedB = true
	for _, iv := range b.IterVars[:n-2] {
		for _, e := range bl.Indices {
			if usesVar(e, iv.Var) {
				m.sharedB = false
			}
		}
	}
	return m, true
}

// packedIndex returns P when idx is (j / P, k, j % P), a weight packed in
// panels of P columns (floor division and remainder), else 0.
func packedIndex(idx []ir.Expr, j, k *ir.Var) int64 {
	if len(idx) != 3 || !isVar(idx[1], k) {
		return 0
	}
	d, ok1 := idx[0].(*ir.Binary)
	r, ok2 := idx[2].(*ir.Binary)
	if !ok1 || !ok2 || d.Op != ir.OpFloorDiv || r.Op != ir.OpFloorMod || !isVar(d.A, j) || !isVar(r.A, j) {
		return 0
	}
	p, ok1 := ir.IsConstInt(d.B)
	q, ok2 := ir.IsConstInt(r.B)
	if !ok1 || !ok2 || p != q || p < 1 {
		return 0
	}
	return p
}

func isVar(e ir.Expr, v *ir.Var) bool {
	x, ok := e.(*ir.Var)
	return ok && x == v
}

func isTrue(e ir.Expr) bool {
	if e == nil {
		return true
	}
	c, ok := e.(*ir.IntImm)
	return ok && c.Value != 0
}

// largestDivisor is the largest divisor of n that is at most limit (≥ 1).
func largestDivisor(n, limit int64) int64 {
	for d := min(n, limit); d > 1; d-- {
		if n%d == 0 {
			return d
		}
	}
	return 1
}

// minPanelRowTiles and minPanelRowBytes say when a matmul copies the
// panel of B a column tile reads (copyPanel): at least this many row
// tiles read it, each K times in steps of rows this many bytes apart
// (a page: a step each to the TLB, and with rows a multiple of 4 KiB
// all in the same few cache sets, which no L1 or L2 size avoids).
const (
	minPanelRowTiles = 4
	minPanelRowBytes = 4 << 10
)

// copyPanel copies the panel of B that one iteration of the column tile
// loop at reads into a contiguous buffer there (cache_read computed at
// the loop, its innermost loop vectorized), so that the tiles' steps of
// k read consecutive rows of the panel, as a weight packed in panels
// (relax.matmul_packed) has them. The copy is K × columns once per column
// tile, against rows × K × columns multiply-adds.
func copyPanel(s *schedule.Schedule, c schedule.BlockRV, b *ir.Buffer, at schedule.LoopRV) error {
	br, err := s.BlockRealize(c)
	if err != nil {
		return err
	}
	idx := -1
	for x, r := range br.Block.Reads {
		if r.Buffer == b {
			idx = x
		}
	}
	if idx < 0 {
		return fmt.Errorf("block %q does not read %q", br.Block.Name, b.Name)
	}
	p, err := s.CacheRead(c, idx, "global")
	if err != nil {
		return err
	}
	if err := s.ComputeAt(p, at); err != nil {
		return err
	}
	pl, err := s.GetLoops(p)
	if err != nil {
		return err
	}
	return s.Vectorize(pl[len(pl)-1])
}

// scheduleMatmul register-blocks block m: a tile of mr rows × nt columns
// (nt = vecs vectors of lanes when lanes divide N, else an unrolled
// scalar tile) accumulates in a "local" buffer over the whole of k.
// With epilogue, the elementwise blocks after the matmul are computed on
// the tile before it is stored (see convEpilogue): the matmul's own
// output is never written to memory.
func scheduleMatmul(s *schedule.Schedule, m matmulBlock, opts Options, epilogue bool) (bool, error) {
	c, err := s.GetBlock(m.name)
	if err != nil {
		return false, err
	}
	loops, err := s.GetLoops(c)
	if err != nil {
		return false, err
	}
	n := len(m.extents)
	if len(loops) != n {
		return false, nil // nested in other loops: someone scheduled it
	}
	M, N, K := int64(1), m.extents[n-2], m.extents[n-1]
	for _, e := range m.extents[:n-2] {
		M *= e
	}
	esize := int64(m.dtype.Size())
	if esize <= 0 {
		return false, nil
	}
	regs := opts.VectorRegisters
	iExt := m.extents[n-3]
	fuse, fixedRows := false, false
	if m.sharedB {
		// Every row reads the same B: the spatial loops before j are
		// one run of rows (a [1, M, K] activation, or [M, 1, K]), when
		// the row tile's split of it leaves each row's indices affine
		// in the loops (which decompose_reduction needs to prove the
		// tile's rows distinct): one loop of more than one row, or a
		// tile of all the rows but the outermost loop's ([1, 7, 7, K]
		// in tiles of 7). Otherwise (a [1, 56, 56, K] activation:
		// ConvNeXt's Linear layers) the last row loop is tiled and the
		// others stay outside, as for a batch.
		iExt, fuse = M, true
		var rows []int64
		for _, e := range m.extents[:n-2] {
			if e > 1 {
				rows = append(rows, e)
			}
		}
		if len(rows) > 1 {
			inner := product(rows[1:])
			if _, mr, _, _ := matmulTile(M, N, opts.VectorBytes/esize, regs); mr != inner {
				iExt, fuse = m.extents[n-3], false
			} else {
				// The tile is the inner rows: no other row count
				// keeps the rows' indices affine.
				fixedRows = true
			}
		}
	}
	lanes, mr, nt, vector := matmulTile(iExt, N, opts.VectorBytes/esize, regs)
	if m.packed > 0 {
		// The tile is the weight's panel, whatever the vector width.
		if lanes, mr, nt, vector = matmulTile(iExt, m.packed, opts.VectorBytes/esize, regs); nt != m.packed || N%nt != 0 {
			return false, nil
		}
	}
	if !vector && nt < 4 && N > 32 {
		return false, nil
	}
	site := "matmul/" + m.name + "/"
	if vector {
		if mr, nt, err = matmulTileChoice(s, opts, site, iExt, N, m.packed, lanes, mr, nt, fixedRows); err != nil {
			return false, err
		}
	}
	// Unrolling a few steps of k into the tile's loop gives the
	// compiler independent loads to schedule; today's rule does not.
	ku, err := opts.choose(s, site+"k_unroll", divisorsUpTo(K, 8), 1)
	if err != nil {
		return false, err
	}
	colsOuter, err := opts.chooseBool(s, site+"columns_outer", m.sharedB)
	if err != nil {
		return false, err
	}
	i, j, k := loops[n-3], loops[n-2], loops[n-1]
	batch := loops[:n-3]
	if fuse && n > 3 {
		if i, err = s.Fuse(loops[:n-2]...); err != nil {
			return false, err
		}
		batch = nil
	}
	split := s.Split
	if iExt%mr != 0 {
		// The last row tile overlaps the one before (see matmulTile).
		split = s.SplitOverlap
	}
	is, err := split(i, -1, mr)
	if err != nil {
		return false, err
	}
	js, err := s.Split(j, -1, nt)
	if err != nil {
		return false, err
	}
	// With a shared B, a panel of B (K × nt) is the tile loop's
	// working set: the row tiles run inside the column tiles (the
	// default of columns_outer), so each panel is read from memory once
	// and A, the smaller operand of a layer over few rows, is what is
	// re-read (from cache).
	outer, inner := is[0], js[0]
	outerExt, innerExt := iExt/mr, N/nt
	if colsOuter {
		outer, inner = js[0], is[0]
		outerExt, innerExt = innerExt, outerExt
	}
	order := append([]schedule.LoopRV{}, batch...)
	order = append(order, outer, inner, k)
	var unrolled []schedule.LoopRV // the steps of k unrolled
	if ku > 1 {
		ks, err := s.Split(k, -1, ku)
		if err != nil {
			return false, err
		}
		k, unrolled = ks[0], ks[1:]
		order = append(order[:len(order)-1], ks...)
	}
	var jv []schedule.LoopRV
	if vector {
		if jv, err = s.Split(js[1], -1, lanes); err != nil {
			return false, err
		}
		order = append(order, is[1], jv[0], jv[1])
	} else {
		order = append(order, is[1], js[1])
	}
	if err := s.Reorder(order...); err != nil {
		return false, err
	}
	wb, err := s.CacheWrite(c, 0, "local")
	if err != nil {
		return false, err
	}
	init, err := s.DecomposeReduction(c, k)
	if err != nil {
		return false, err
	}
	switch {
	case vector && epilogue:
		err = convEpilogue(s, wb, inner, lanes)
	case vector:
		err = tileStore(s, wb, inner, lanes)
	case epilogue:
		return false, skip("block %q: no vector tile for an epilogue", m.name)
	default:
		err = s.ReverseComputeAt(wb, inner)
	}
	if err != nil {
		return false, err
	}
	if m.sharedB && m.packed == 0 && colsOuter {
		cp, err := opts.chooseBool(s, site+"copy_panel", iExt/mr >= minPanelRowTiles && N*esize >= minPanelRowBytes)
		if err != nil {
			return false, err
		}
		if cp {
			if err := copyPanel(s, c, m.b, js[0]); err != nil {
				return false, err
			}
		}
	}
	il, err := s.GetLoops(init)
	if err != nil {
		return false, err
	}
	for _, u := range unrolled {
		if err := s.Unroll(u); err != nil {
			return false, err
		}
	}
	if vector {
		for _, u := range []schedule.LoopRV{is[1], jv[0], il[len(il)-3], il[len(il)-2]} {
			if err := s.Unroll(u); err != nil {
				return false, err
			}
		}
		for _, v := range []schedule.LoopRV{jv[1], il[len(il)-1]} {
			if err := s.Vectorize(v); err != nil {
				return false, err
			}
		}
	} else {
		for _, u := range []schedule.LoopRV{is[1], js[1], il[len(il)-2], il[len(il)-1]} {
			if err := s.Unroll(u); err != nil {
				return false, err
			}
		}
	}
	switch par := matmulParallel(opts, m, M*N*K, fuse, [2]int64{outerExt, innerExt}); {
	case par == parOuter:
		err = s.Parallel(outer)
	case par == parInner:
		err = s.Parallel(inner)
	case par >= parBatch:
		err = s.Parallel(batch[par-parBatch])
	}
	if err != nil {
		return false, err
	}
	return true, nil
}

// matmulTileChoice asks for a vector register tile's rows and vectors of
// columns (sites matmul/BLOCK/rows and matmul/BLOCK/vectors), mr rows and
// nt columns the rule's own: any count of rows up to the accumulators
// (a fixed count with fixedRows; one that does not divide the rows
// overlaps its last tile), then any divisor of the
// columns' vectors whose accumulators, loads and broadcast fit in the
// registers beside those rows (the packed weight's panel, with packed).
// It returns the tile's rows and columns.
func matmulTileChoice(s *schedule.Schedule, opts Options, site string, rows, N, packed, lanes, mr, nt int64, fixedRows bool) (int64, int64, error) {
	regs := opts.VectorRegisters
	vecsOf := func(r int64) []int64 {
		if packed > 0 {
			if packed/lanes <= matmulVectorLimit(r, regs) {
				return []int64{packed / lanes}
			}
			return nil
		}
		return divisorsUpTo(N/lanes, matmulVectorLimit(r, regs))
	}
	var rowCands []int64
	if fixedRows {
		rowCands = []int64{mr}
	} else {
		for r := int64(1); r <= min(rows, max(opts.accumulators(), maxMatmulRows)); r++ {
			if len(vecsOf(r)) > 0 {
				rowCands = append(rowCands, r)
			}
		}
	}
	mr, err := opts.choose(s, site+"rows", rowCands, mr)
	if err != nil {
		return 0, 0, err
	}
	// The rule's own vectors for its rows; the most that fit for others.
	vc := vecsOf(mr)
	def := vc[len(vc)-1]
	if slices.Contains(vc, nt/lanes) {
		def = nt / lanes
	}
	v, err := opts.choose(s, site+"vectors", vc, def)
	if err != nil {
		return 0, 0, err
	}
	return mr, v * lanes, nil
}

// matmulParallel says which loop of a matmul's tiles runs in parallel
// (one of the par codes): the outer tile loop (the inner one when the
// outer has one iteration) for a matmul of at least opts.ParallelFlops
// multiply-adds, or, for rows outside the tiles that share B, the first
// of those loops; none below (one fork and join costs more than it
// saves), nor with a negative ParallelFlops. ext are the outer and inner
// tile loops' iterations. It is not a choice: the tuner times candidates
// on one core and one thread, where the parallel loop cannot show, and a
// choice drawn at random there ran the 1024³ matmul at 0.7× with all
// threads (its inner loop in parallel, a fork and join per column tile).
func matmulParallel(opts Options, m matmulBlock, flops int64, fuse bool, ext [2]int64) int64 {
	if opts.ParallelFlops < 0 || flops < opts.ParallelFlops {
		return parNone
	}
	n := len(m.extents)
	if m.sharedB && !(fuse && n > 3) {
		for b, e := range m.extents[:n-3] {
			if e > 1 {
				return parBatch + int64(b)
			}
		}
	}
	if ext[0] < 2 {
		return parInner
	}
	return parOuter
}
