package schedule

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// BufferIndex names a buffer of a block by the block's access regions:
// the Index-th read (Write false) or write region.
type BufferIndex struct {
	Write bool
	Index int
}

func (bi BufferIndex) String() string {
	if bi.Write {
		return fmt.Sprintf("(\"write\", %d)", bi.Index)
	}
	return fmt.Sprintf("(\"read\", %d)", bi.Index)
}

// maxCheckedPoints bounds the indices TransformLayout evaluates the map
// at to check it is injective.
const maxCheckedPoints = 1 << 24

// TransformLayout gives the buffer that block b accesses as bi a new
// layout (TVM's sch.transform_layout): the buffer's shape becomes the
// image of its index space under m, and every access, region and
// allocation follows, B[i, j] becoming B[m(i, j)]. The map must be
// injective over the buffer's shape (TransformLayout evaluates it at every
// index), with indices from 0. A map that is not onto the new shape pads
// the buffer (i // 16, i % 16 over 20 rows): then pad must be non-nil,
// and a block named buffer_pad, placed before the buffer's first writer,
// stores *pad in all of the new buffer. The buffer must be one a block
// allocates; to repack a parameter, transform the layout of a
// CacheRead or CacheWrite copy (CacheReadLayout, CacheWriteLayout).
func (s *Schedule) TransformLayout(b BlockRV, bi BufferIndex, m *IndexMap, pad *float64) error {
	if err := s.transformLayout(b, bi, m, pad); err != nil {
		return fmt.Errorf("transform_layout: %w", err)
	}
	s.record("sch.transform_layout(%s, %s, %s%s)", s.bn(b), bi, m, padArg(pad))
	return nil
}

func padArg(pad *float64) string {
	if pad == nil {
		return ""
	}
	return ", pad_value=" + pyValue(*pad)
}

func (s *Schedule) transformLayout(b BlockRV, bi BufferIndex, m *IndexMap, pad *float64) error {
	bs, err := s.block("", b)
	if err != nil {
		return err
	}
	blk := bs.realize().Block
	regions, what := blk.Reads, "read"
	if bi.Write {
		regions, what = blk.Writes, "write"
	}
	if bi.Index < 0 || bi.Index >= len(regions) {
		return fmt.Errorf("block %q has %d %s regions, no %s %d", blk.Name, len(regions), what, what, bi.Index)
	}
	buf := regions[bi.Index].Buffer
	if isParam(s.fn, buf) {
		return fmt.Errorf("%q is a parameter of the function: changing its layout would change the function's signature (transform the layout of a cache_read or cache_write copy instead)", buf.Name)
	}
	if m == nil {
		return errors.New("nil index map")
	}
	if len(buf.Shape) == 0 {
		return fmt.Errorf("%q has no dimensions to map", buf.Name)
	}
	if len(m.Vars) != len(buf.Shape) {
		return fmt.Errorf("index map %s takes %d indices, %q has %d dimensions", m, len(m.Vars), buf.Name, len(buf.Shape))
	}
	shape, padded, err := imageShape(m, buf)
	if err != nil {
		return err
	}
	if padded && pad == nil {
		return fmt.Errorf("index map %s is not onto its image's shape %s over %q of shape %s: it pads the buffer; give a pad value", m, shapeString(shape), buf.Name, shapeString(buf.Shape))
	}
	nb := ir.NewBuffer(buf.Name, buf.DType, shape, buf.StorageScope())
	body := remapBuffer(s.fn.Body, buf, nb, m)
	if padded {
		if body, err = s.pad(body, buf, nb, m, ir.Const(nb.DType, *pad), s.storedAt(buf)); err != nil {
			return err
		}
	}
	return s.commit("transform_layout", body)
}

// storedAt returns the iteration variables at which the one block
// writing buf stores it, one per dimension, or nil.
func (s *Schedule) storedAt(buf *ir.Buffer) []*ir.Var {
	var w []*ir.Block
	ir.Visit(s.fn.Body, func(n ir.Node) bool {
		if b, ok := n.(*ir.Block); ok && writes(b, buf) {
			w = append(w, b)
		}
		return true
	})
	if len(w) != 1 {
		return nil
	}
	st, ok := w[0].Body.(*ir.BufferStore)
	if !ok || st.Buffer != buf {
		return nil
	}
	vars, err := wholeBufferVars(w[0], st.Indices, buf)
	if err != nil {
		return nil
	}
	return vars
}

// pad makes the padding of nb hold value. When the buffer's one writer
// is a spatial block storing it once per element, under loops that bind
// its iteration variables one each and hold nothing else, the writer's
// domain grows until the map covers the new shape and it stores value
// where the old indices are out of range (TVM pads in the producer so).
// Otherwise a block named buffer_pad fills the new buffer with value
// before the first writer.
func (s *Schedule) pad(body ir.Stmt, buf, nb *ir.Buffer, m *IndexMap, value ir.Expr, old []*ir.Var) (ir.Stmt, error) {
	var writers [][]ir.Stmt
	var walk func(path []ir.Stmt)
	walk = func(path []ir.Stmt) {
		st := path[len(path)-1]
		if br, ok := st.(*ir.BlockRealize); ok && writes(br.Block, nb) {
			writers = append(writers, slices.Clone(path))
		}
		for _, c := range children(st) {
			walk(append(path, c))
		}
	}
	walk([]ir.Stmt{body})
	if len(writers) == 0 {
		return nil, fmt.Errorf("no block writes %q: there is nothing to pad", buf.Name)
	}
	st := site{path: writers[0]}
	if len(writers) == 1 {
		if nbody, ok := padInProducer(body, st, buf, nb, m, value, old); ok {
			return nbody, nil
		}
	}
	scope := st.scope()
	top := topOf(st, scope)
	name := s.uniqueName(buf.Name + "_pad")
	fill := fillNest(name, nb, value)
	newScope := *scope
	nblk := *scope.Block
	nblk.Body = replace(scope.Block.Body, map[ir.Stmt]ir.Stmt{top: ir.Seq(fill, top)})
	newScope.Block = &nblk
	return replace(body, map[ir.Stmt]ir.Stmt{scope: &newScope}), nil
}

// padInProducer grows the writer's domain (see pad), or reports false.
func padInProducer(body ir.Stmt, st site, buf, nb *ir.Buffer, m *IndexMap, value ir.Expr, old []*ir.Var) (ir.Stmt, bool) {
	br := st.realize()
	blk := br.Block
	store, ok := blk.Body.(*ir.BufferStore)
	if spatialStore(blk) != nil || !ok || store.Buffer != nb || len(blk.Writes) != 1 {
		return nil, false
	}
	if c, ok := ir.IsConstInt(br.Predicate); !ok || c == 0 {
		return nil, false
	}
	dims := make([]int64, len(buf.Shape))
	for d, e := range buf.Shape {
		dims[d], _ = ir.IsConstInt(e)
	}
	box := make([]int64, len(nb.Shape))
	for i, e := range nb.Shape {
		box[i], _ = ir.IsConstInt(e)
	}
	ext := growDomain(m, dims, box)
	if ext == nil {
		return nil, false
	}
	// Each iteration variable bound to its own loop of extent the old
	// dimension; these loops are the innermost ones, perfectly nested.
	nest, loopOf, ok := perfectNest(st)
	if !ok {
		return nil, false
	}
	// old[d], the variable that indexed old dimension d, was found
	// before the remap.
	vmap := map[*ir.Var]int{}
	for d, v := range old {
		vmap[v] = d
	}
	if len(old) != len(buf.Shape) || len(vmap) != len(blk.IterVars) {
		return nil, false
	}
	var cond ir.Expr = ir.BoolImm(true)
	nblk := *blk
	nblk.IterVars = slices.Clone(blk.IterVars)
	exts := make([]int64, len(blk.IterVars))
	for i, iv := range blk.IterVars {
		d := vmap[iv.Var]
		exts[i] = ext[d]
		if ext[d] == dims[d] {
			continue
		}
		t := iv.Dom.Extent.DType()
		nblk.IterVars[i].Dom = ir.RangeFromExtent(ir.NewIntImm(t, ext[d]))
		cond = conjoin(cond, ir.LT(iv.Var, ir.NewIntImm(t, dims[d])))
	}
	nblk.Body = &ir.BufferStore{Buffer: nb, Value: ir.NewIfThenElse(cond, store.Value, value), Indices: store.Indices}
	nbr := &ir.BlockRealize{IterValues: br.IterValues, Predicate: br.Predicate, Block: &nblk}
	return replace(body, map[ir.Stmt]ir.Stmt{nest[0]: rebuildNest(nest, loopOf, exts, nbr)}), true
}

// perfectNest returns the loops binding the iteration variables of the
// block at st, one loop each, when they are its innermost loops, nested
// with nothing else between them, each from 0 over the variable's domain
// and serial; loopOf[i] binds variable i.
func perfectNest(st site) (nest, loopOf []*ir.For, ok bool) {
	br := st.realize()
	blk := br.Block
	loops := st.loops()
	k := len(blk.IterVars)
	if len(loops) < k || k == 0 {
		return nil, nil, false
	}
	nest = loops[len(loops)-k:]
	for i, f := range nest {
		var next ir.Stmt = br
		if i+1 < k {
			next = nest[i+1]
		}
		if f.Body != next {
			return nil, nil, false
		}
	}
	loopOf = make([]*ir.For, k)
	for i, iv := range blk.IterVars {
		v, ok := br.IterValues[i].(*ir.Var)
		j := slices.IndexFunc(nest, func(f *ir.For) bool { return f.Var == v })
		if !ok || j < 0 || slices.Contains(loopOf, nest[j]) {
			return nil, nil, false
		}
		f := nest[j]
		if mn, ok := ir.IsConstInt(f.Min); !ok || mn != 0 || !ir.Equal(f.Extent, iv.Dom.Extent) || f.Kind != ir.ForSerial {
			return nil, nil, false
		}
		loopOf[i] = f
	}
	return nest, loopOf, true
}

// rebuildNest returns the nest around inner, the loop binding variable i
// running over exts[i].
func rebuildNest(nest, loopOf []*ir.For, exts []int64, inner ir.Stmt) ir.Stmt {
	for i := len(nest) - 1; i >= 0; i-- {
		c := *nest[i]
		if v := slices.Index(loopOf, nest[i]); v >= 0 {
			c.Extent = ir.NewIntImm(c.Extent.DType(), exts[v])
		}
		c.Body = inner
		inner = &c
	}
	return inner
}

// growDomain returns old-index extents, at least dims, over which m is a
// bijection onto the box, or nil: each dimension grows as far as the
// image stays in the box.
func growDomain(m *IndexMap, dims, box []int64) []int64 {
	ext := slices.Clone(dims)
	out := make([]int64, len(m.Indices))
	eval, err := m.compile()
	if err != nil {
		return nil
	}
	inBox := func(pt []int64) bool {
		if !eval(pt, out) {
			return false
		}
		for i, x := range out {
			if x < 0 || x >= box[i] {
				return false
			}
		}
		return true
	}
	total := int64(1)
	for _, b := range box {
		total *= b
	}
	for d := range ext {
		for {
			// The slice of points with dimension d at ext[d].
			ok := true
			pt := make([]int64, len(ext))
			n := int64(1)
			for e := range ext {
				if e != d {
					n *= ext[e]
				}
			}
			if n*int64(len(ext)) > maxCheckedPoints || ext[d] >= total {
				return nil
			}
			for k := int64(0); k < n && ok; k++ {
				r := k
				for e := len(ext) - 1; e >= 0; e-- {
					if e == d {
						pt[e] = ext[d]
						continue
					}
					pt[e] = r % ext[e]
					r /= ext[e]
				}
				ok = inBox(pt)
			}
			if !ok {
				break
			}
			ext[d]++
		}
	}
	n := int64(1)
	for _, e := range ext {
		n *= e
	}
	if n != total {
		return nil
	}
	seen := make(map[int64]bool, n)
	pt := make([]int64, len(ext))
	for k := int64(0); k < n; k++ {
		r := k
		for e := len(ext) - 1; e >= 0; e-- {
			pt[e] = r % ext[e]
			r /= ext[e]
		}
		if !inBox(pt) {
			return nil
		}
		key := int64(0)
		for i, x := range out {
			key = key*box[i] + x
		}
		if seen[key] {
			return nil
		}
		seen[key] = true
	}
	return ext
}

// imageShapes remembers imageShape's answers by map and shape: a tuner
// replays the same layouts on the same buffers many times.
var imageShapes sync.Map // string → imageResult

type imageResult struct {
	shape  []ir.Expr
	padded bool
	err    error
}

// imageShape returns the shape of the image of buf's indices under m and
// whether the image leaves holes in it (padding). It fails when m is not
// injective or maps below 0.
func imageShape(m *IndexMap, buf *ir.Buffer) ([]ir.Expr, bool, error) {
	for _, e := range buf.Shape {
		if _, ok := ir.IsConstInt(e); !ok {
			return computeImageShape(m, buf) // the answer holds buf's own variables
		}
	}
	key := fmt.Sprintf("%s|%s|%s|%s", m, shapeString(buf.Shape), buf.Shape[0].DType(), buf.Name)
	if r, ok := imageShapes.Load(key); ok {
		r := r.(imageResult)
		return r.shape, r.padded, r.err
	}
	shape, padded, err := computeImageShape(m, buf)
	imageShapes.Store(key, imageResult{shape, padded, err})
	return shape, padded, err
}

func computeImageShape(m *IndexMap, buf *ir.Buffer) ([]ir.Expr, bool, error) {
	dims := make([]int64, len(buf.Shape))
	total := int64(1)
	for d, e := range buf.Shape {
		c, ok := ir.IsConstInt(e)
		if !ok {
			return permutedShape(m, buf)
		}
		dims[d] = c
		if c <= 0 {
			return nil, false, fmt.Errorf("%q has the empty dimension %d", buf.Name, d)
		}
		if total > maxCheckedPoints/c {
			return nil, false, fmt.Errorf("%q has more than %d elements: too many to check that index map %s is injective", buf.Name, maxCheckedPoints, m)
		}
		total *= c
	}
	eval, err := m.compile()
	if err != nil {
		return nil, false, fmt.Errorf("index map %s: %w", m, err)
	}
	k := len(m.Indices)
	hi := make([]int64, k)
	out := make([]int64, k)
	// walk calls f at every index of the old shape, in row-major order.
	walk := func(f func(n int64, point []int64) error) error {
		point := make([]int64, len(dims))
		for n := int64(0); n < total; n++ {
			if err := f(n, point); err != nil {
				return err
			}
			for d := len(dims) - 1; d >= 0; d-- {
				if point[d]++; point[d] < dims[d] {
					break
				}
				point[d] = 0
			}
		}
		return nil
	}
	err = walk(func(_ int64, point []int64) error {
		if !eval(point, out) {
			return fmt.Errorf("index map %s divides by zero at %v", m, point)
		}
		for i, x := range out {
			if x < 0 {
				return fmt.Errorf("index map %s maps %v of %q to %v, below 0", m, point, buf.Name, out)
			}
			hi[i] = max(hi[i], x)
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	// Injective: the images, as numbers in the new shape, are distinct.
	size := int64(1)
	for _, h := range hi {
		if size > math.MaxInt64/(h+1) {
			return nil, false, fmt.Errorf("index map %s: the new shape overflows", m)
		}
		size *= h + 1
	}
	if size < total {
		size = total // not injective: found below
	}
	if size > 16*maxCheckedPoints {
		return nil, false, fmt.Errorf("index map %s: the new shape of %q has %d elements, too many to check the map", m, buf.Name, size)
	}
	key := func() int64 {
		n := int64(0)
		for i, x := range out {
			n = n*(hi[i]+1) + x
		}
		return n
	}
	seen := make([]uint64, (size+63)/64)
	err = walk(func(n int64, point []int64) error {
		eval(point, out)
		kk := key()
		if seen[kk/64]&(1<<(kk%64)) == 0 {
			seen[kk/64] |= 1 << (kk % 64)
			return nil
		}
		// The earlier index with the same image, for the message.
		dup, at := slices.Clone(out), slices.Clone(point)
		var prev []int64
		_ = walk(func(q int64, p []int64) error {
			if eval(p, out); q < n && prev == nil && slices.Equal(out, dup) {
				prev = slices.Clone(p)
			}
			return nil
		})
		return fmt.Errorf("index map %s is not injective over %q: %v and %v both map to %v", m, buf.Name, prev, at, dup)
	})
	if err != nil {
		return nil, false, err
	}
	t := buf.Shape[0].DType()
	shape := make([]ir.Expr, k)
	for i, h := range hi {
		shape[i] = ir.NewIntImm(t, h+1)
	}
	return shape, size != total, nil
}

// permutedShape handles a symbolic shape: m must permute the indices.
func permutedShape(m *IndexMap, buf *ir.Buffer) ([]ir.Expr, bool, error) {
	shape := make([]ir.Expr, len(m.Indices))
	used := map[*ir.Var]bool{}
	for i, e := range m.Indices {
		v, ok := e.(*ir.Var)
		d := slices.Index(m.Vars, v)
		if !ok || d < 0 || used[v] || len(m.Indices) != len(m.Vars) {
			return nil, false, fmt.Errorf("%q has the symbolic shape %s: its index map must permute the indices, not %s", buf.Name, shapeString(buf.Shape), m)
		}
		used[v] = true
		shape[i] = buf.Shape[d]
	}
	return shape, false, nil
}

func shapeString(shape []ir.Expr) string {
	parts := make([]string, len(shape))
	for i, e := range shape {
		parts[i] = e.String()
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// remapBuffer replaces old by nb in body, accesses at m of their
// indices: loads and stores (simplified with the block's iteration
// domains), regions (a point region maps to a point, others to the whole
// new buffer) and allocations.
func remapBuffer(body ir.Stmt, old, nb *ir.Buffer, m *IndexMap) ir.Stmt {
	return rewrite(&ir.Rewriter{Stmt: func(st ir.Stmt) ir.Stmt {
		br, ok := st.(*ir.BlockRealize)
		if !ok {
			return st
		}
		blk := *br.Block
		bnd := bounds{}
		for _, iv := range blk.IterVars {
			lo, ok1 := ir.IsConstInt(iv.Dom.Min)
			ext, ok2 := ir.IsConstInt(iv.Dom.Extent)
			if ok1 && ok2 && ext > 0 {
				bnd[iv.Var] = [2]int64{lo, lo + ext - 1}
			}
		}
		mapIdx := func(idx []ir.Expr) []ir.Expr {
			out := m.apply(idx)
			for i, e := range out {
				out[i] = bnd.simplify(e)
			}
			return out
		}
		r := &ir.Rewriter{
			Expr: func(e ir.Expr) ir.Expr {
				if l, ok := e.(*ir.BufferLoad); ok && l.Buffer == old {
					return &ir.BufferLoad{Buffer: nb, Indices: mapIdx(l.Indices)}
				}
				return e
			},
			Stmt: func(st ir.Stmt) ir.Stmt {
				if w, ok := st.(*ir.BufferStore); ok && w.Buffer == old {
					return &ir.BufferStore{Buffer: nb, Value: w.Value, Indices: mapIdx(w.Indices)}
				}
				return st
			},
		}
		blk.Body = rewrite(r, blk.Body)
		if blk.Init != nil {
			blk.Init = rewrite(r, blk.Init)
		}
		mapRegions := func(rs []ir.BufferRegion) []ir.BufferRegion {
			out := slices.Clone(rs)
			for i, rg := range rs {
				if rg.Buffer != old {
					continue
				}
				point := make([]ir.Expr, len(rg.Region))
				isPoint := true
				for d, x := range rg.Region {
					c, ok := ir.IsConstInt(x.Extent)
					isPoint = isPoint && ok && c == 1
					point[d] = x.Min
				}
				if isPoint {
					out[i] = ir.PointRegion(nb, mapIdx(point)...)
				} else {
					out[i] = nb.FullRegion()
				}
			}
			return out
		}
		blk.Reads, blk.Writes = mapRegions(blk.Reads), mapRegions(blk.Writes)
		if i := slices.Index(blk.AllocBuffers, old); i >= 0 {
			blk.AllocBuffers = slices.Clone(blk.AllocBuffers)
			blk.AllocBuffers[i] = nb
		}
		return &ir.BlockRealize{IterValues: br.IterValues, Predicate: br.Predicate, Block: &blk}
	}}, body)
}

// fillNest returns loops ax0 … over buf's shape around a block named name
// that stores value in every element.
func fillNest(name string, buf *ir.Buffer, value ir.Expr) ir.Stmt {
	return pointNest(name, buf.Shape, func(idx []ir.Expr) (ir.Stmt, []ir.BufferRegion, []ir.Expr) {
		return buf.Store(value, idx...), nil, idx
	}, buf)
}

// CacheReadLayout is CacheRead followed by TransformLayout of the copy's
// buffer: the copy is stored in the layout m gives (packed panels:
// lambda k, n: (n // 16, k, n % 16)), and readers read it there. Both
// steps are in the trace.
func (s *Schedule) CacheReadLayout(b BlockRV, readIndex int, scope string, m *IndexMap, pad *float64) (BlockRV, error) {
	saved := s.Copy()
	c, err := s.CacheRead(b, readIndex, scope)
	if err != nil {
		return BlockRV{}, err
	}
	if err := s.TransformLayout(c, BufferIndex{Write: true}, m, pad); err != nil {
		*s = *saved
		return BlockRV{}, fmt.Errorf("cache_read: %w", err)
	}
	return c, nil
}

// CacheWriteLayout is CacheWrite followed by TransformLayout of the
// cache buffer: block b computes into the layout m gives, and the
// copy-back block returns the values to the output's layout.
func (s *Schedule) CacheWriteLayout(b BlockRV, writeIndex int, scope string, m *IndexMap, pad *float64) (BlockRV, error) {
	saved := s.Copy()
	c, err := s.CacheWrite(b, writeIndex, scope)
	if err != nil {
		return BlockRV{}, err
	}
	if err := s.TransformLayout(c, BufferIndex{Write: false}, m, pad); err != nil {
		*s = *saved
		return BlockRV{}, fmt.Errorf("cache_write: %w", err)
	}
	return c, nil
}
