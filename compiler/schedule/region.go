package schedule

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// scopeBlocks returns the sites of the block realizes directly in the
// scope block (not nested in another block), in program order.
func (s *Schedule) scopeBlocks(scope *ir.BlockRealize) []site {
	root := findPath(s.fn.Body, func(st ir.Stmt) bool { return st == ir.Stmt(scope) })
	var out []site
	var walk func(path []ir.Stmt)
	walk = func(path []ir.Stmt) {
		st := path[len(path)-1]
		if br, ok := st.(*ir.BlockRealize); ok && br != scope {
			out = append(out, site{path: slices.Clone(path)})
			return
		}
		for _, c := range children(st) {
			walk(append(path, c))
		}
	}
	walk(root)
	return out
}

// reads and writes report whether a block accesses buffer b, by its
// declared regions.
func reads(b *ir.Block, buf *ir.Buffer) bool {
	return slices.ContainsFunc(b.Reads, func(r ir.BufferRegion) bool { return r.Buffer == buf })
}

func writes(b *ir.Block, buf *ir.Buffer) bool {
	return slices.ContainsFunc(b.Writes, func(r ir.BufferRegion) bool { return r.Buffer == buf })
}

// isParam reports whether buf is a buffer of f's parameters.
func isParam(f *ir.PrimFunc, buf *ir.Buffer) bool {
	for _, b := range f.BufferMap {
		if b == buf {
			return true
		}
	}
	return false
}

// topOf returns the statement of the scope block's body (an element of
// its SeqStmt, or the body itself) that holds the site.
func topOf(st site, scope *ir.BlockRealize) ir.Stmt {
	for i, p := range st.path {
		if p != ir.Stmt(scope) {
			continue
		}
		top := st.path[i+1]
		if _, ok := top.(*ir.SeqStmt); ok && i+2 < len(st.path) {
			top = st.path[i+2]
		}
		return top
	}
	return nil
}

// order returns the position of statement x in a pre-order walk of body.
func order(body ir.Stmt, x ir.Stmt) int {
	n, at := 0, -1
	var walk func(s ir.Stmt)
	walk = func(s ir.Stmt) {
		if at >= 0 || s == nil {
			return
		}
		if s == x {
			at = n
			return
		}
		n++
		for _, c := range children(s) {
			walk(c)
		}
	}
	walk(body)
	return at
}

// withAlloc returns the scope realize with buf added to its block's
// allocations and body as its body.
func withAlloc(scope *ir.BlockRealize, body ir.Stmt, add []*ir.Buffer, drop *ir.Buffer) *ir.BlockRealize {
	blk := *scope.Block
	blk.Body = body
	blk.AllocBuffers = slices.DeleteFunc(slices.Clone(blk.AllocBuffers), func(b *ir.Buffer) bool { return b == drop })
	blk.AllocBuffers = append(blk.AllocBuffers, add...)
	return &ir.BlockRealize{IterValues: scope.IterValues, Predicate: scope.Predicate, Block: &blk}
}

// copyNest returns loops ax0 … over dst's shape around a block named
// name that stores src[v…] into dst[v…].
func copyNest(name string, src, dst *ir.Buffer) ir.Stmt {
	return pointNest(name, dst.Shape, func(idx []ir.Expr) (ir.Stmt, []ir.BufferRegion, []ir.Expr) {
		return dst.Store(src.Load(idx...), idx...), []ir.BufferRegion{ir.PointRegion(src, idx...)}, idx
	}, dst)
}

// pointNest returns loops ax0 … over shape around a block named name
// with one spatial variable v0 … per dimension: body gives the block's
// statement, its read regions and the point of dst it writes, from the
// variables.
func pointNest(name string, shape []ir.Expr, body func(idx []ir.Expr) (ir.Stmt, []ir.BufferRegion, []ir.Expr), dst *ir.Buffer) ir.Stmt {
	n := len(shape)
	ivs := make([]ir.IterVar, n)
	loops := make([]*ir.Var, n)
	vals := make([]ir.Expr, n)
	idx := make([]ir.Expr, n)
	for d, ext := range shape {
		t := ext.DType()
		loops[d] = ir.NewVar(fmt.Sprintf("ax%d", d), t)
		v := ir.NewVar(fmt.Sprintf("v%d", d), t)
		ivs[d] = ir.IterVar{Var: v, Dom: ir.RangeFromExtent(ext), Kind: ir.IterSpatial}
		vals[d] = loops[d]
		idx[d] = v
	}
	st, reads, at := body(idx)
	blk := &ir.Block{Name: name, IterVars: ivs, Reads: reads, Writes: []ir.BufferRegion{ir.PointRegion(dst, at...)}, Body: st}
	var s ir.Stmt = &ir.BlockRealize{IterValues: vals, Predicate: ir.BoolImm(true), Block: blk}
	for d := n - 1; d >= 0; d-- {
		s = ir.NewFor(loops[d], ir.NewIntImm(loops[d].Type, 0), shape[d], ir.ForSerial, s)
	}
	return s
}

// replaceBuffer returns the realize with every use of buffer from in its
// block (regions, loads, stores) replaced by to. With loadsOnly, stores
// and write regions keep from.
func replaceBuffer(br *ir.BlockRealize, from, to *ir.Buffer, loadsOnly bool) *ir.BlockRealize {
	if !loadsOnly {
		r := &ir.Rewriter{Buffer: func(b *ir.Buffer) *ir.Buffer {
			if b == from {
				return to
			}
			return b
		}}
		return rewrite(r, br).(*ir.BlockRealize)
	}
	r := &ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
		if l, ok := e.(*ir.BufferLoad); ok && l.Buffer == from {
			return &ir.BufferLoad{Buffer: to, Indices: l.Indices}
		}
		return e
	}}
	blk := *br.Block
	blk.Body = rewrite(r, blk.Body)
	if blk.Init != nil {
		blk.Init = rewrite(r, blk.Init)
	}
	blk.Reads = slices.Clone(blk.Reads)
	for i, rg := range blk.Reads {
		if rg.Buffer == from {
			blk.Reads[i] = ir.BufferRegion{Buffer: to, Region: rg.Region}
		}
	}
	return &ir.BlockRealize{IterValues: br.IterValues, Predicate: br.Predicate, Block: &blk}
}

// accessSpan returns, for each dimension of region r of a block realized
// by br, the symbolic range of indices it covers when the variables in dom
// take their spans; ok is false where the range could not be bounded.
func accessSpan(br *ir.BlockRealize, r ir.BufferRegion, dom map[*ir.Var]span) ([]span, []bool) {
	vmap := map[*ir.Var]ir.Expr{}
	for i, iv := range br.Block.IterVars {
		vmap[iv.Var] = br.IterValues[i]
	}
	out := make([]span, len(r.Region))
	ok := make([]bool, len(r.Region))
	for d, rg := range r.Region {
		lo := toAffine(ir.SubstituteExpr(rg.Min, vmap))
		hi := lo.add(toAffine(rg.Extent), 1).add(constAffine(lo.t, 1), -1)
		sl, ok1 := relax(lo, dom)
		sh, ok2 := relax(hi, dom)
		out[d] = span{lo: sl.lo, hi: sh.hi}
		ok[d] = ok1 && ok2
	}
	return out, ok
}

// unionSpan merges b into a when their difference is constant.
func unionSpan(a, b span) (span, bool) {
	dl, ok1 := b.lo.add(a.lo, -1).isConst()
	dh, ok2 := b.hi.add(a.hi, -1).isConst()
	if !ok1 || !ok2 {
		return span{}, false
	}
	if dl < 0 {
		a.lo = b.lo
	}
	if dh > 0 {
		a.hi = b.hi
	}
	return a, true
}

// oneToOne maps the dimensions of a point region to the block's iteration
// variables: dims[d] is the index of the iteration variable that region
// dimension d is, or the function fails.
func oneToOne(b *ir.Block, r ir.BufferRegion) ([]int, bool) {
	dims := make([]int, len(r.Region))
	used := map[int]bool{}
	for d, rg := range r.Region {
		if c, ok := ir.IsConstInt(rg.Extent); !ok || c != 1 {
			return nil, false
		}
		v, ok := rg.Min.(*ir.Var)
		if !ok {
			return nil, false
		}
		idx := slices.IndexFunc(b.IterVars, func(iv ir.IterVar) bool { return iv.Var == v })
		if idx < 0 || used[idx] {
			return nil, false
		}
		used[idx] = true
		dims[d] = idx
	}
	return dims, true
}

// regionString prints a region for messages: B[v_i, v_j:v_j + 2].
func regionString(r ir.BufferRegion) string {
	s := r.Buffer.Name + "["
	for d, rg := range r.Region {
		if d > 0 {
			s += ", "
		}
		if c, ok := ir.IsConstInt(rg.Extent); ok && c == 1 {
			s += rg.Min.String()
		} else {
			s += fmt.Sprintf("%s:%s", rg.Min, ir.Add(rg.Min, rg.Extent))
		}
	}
	return s + "]"
}
