package transform

import (
	"sort"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// StorageRewrite plans allocations. Within each region (the function body,
// and the body of each parallel, vectorized or thread-bound loop, whose
// iterations need their own storage) every allocation of constant size is
// hoisted to the start of the region, out of serial and unrolled loops and
// conditionals, so it is made once rather than once per iteration. Hoisted
// allocations that are never used are dropped, and allocations of the same
// dtype and scope whose uses lie in disjoint statements of the region's
// top-level sequence share one block of memory sized for the largest.
// Allocations whose size is not constant stay where they are.
func StorageRewrite(f *ir.PrimFunc) (*ir.PrimFunc, error) {
	return f.WithBody(hoistRegion(f.Body)), nil
}

func isRegionLoop(k ir.ForKind) bool {
	return k == ir.ForParallel || k == ir.ForVectorized || k == ir.ForThreadBinding
}

// hoistRegion hoists the constant-size allocations of one region.
func hoistRegion(s ir.Stmt) ir.Stmt {
	var lifted []*ir.Buffer
	r := &ir.Rewriter{}
	r.PreStmt = func(s ir.Stmt) (ir.Stmt, bool) {
		if fr, ok := s.(*ir.For); ok && isRegionLoop(fr.Kind) {
			c := *fr
			c.Body = hoistRegion(fr.Body)
			return &c, true
		}
		return nil, false
	}
	r.Stmt = func(s ir.Stmt) ir.Stmt {
		if a, ok := s.(*ir.Allocate); ok && constSize(a.Buffer) >= 0 {
			lifted = append(lifted, a.Buffer)
			return a.Body
		}
		return s
	}
	body := seqSafe(r).RewriteStmt(s)
	if len(lifted) == 0 {
		return body
	}
	allocs, remap := planReuse(lifted, body)
	if len(remap) > 0 {
		// Uses of a buffer's data variable itself (a ptx_mma operand)
		// follow the buffer into the memory it now shares.
		data := map[*ir.Var]ir.Expr{}
		for b, nb := range remap {
			if nb.Data != b.Data {
				data[b.Data] = nb.Data
			}
		}
		body = seqSafe(&ir.Rewriter{Buffer: func(b *ir.Buffer) *ir.Buffer {
			if nb, ok := remap[b]; ok {
				return nb
			}
			return b
		}, Expr: func(e ir.Expr) ir.Expr {
			if v, ok := e.(*ir.Var); ok {
				if nv, ok := data[v]; ok {
					return nv
				}
			}
			return e
		}}).RewriteStmt(body)
	}
	for i := len(allocs) - 1; i >= 0; i-- {
		body = &ir.Allocate{Buffer: allocs[i], Body: body}
	}
	return body
}

// constSize is the number of elements of a buffer with a constant shape,
// or -1.
func constSize(b *ir.Buffer) int64 {
	n := int64(1)
	for _, s := range b.Shape {
		v, ok := ir.IsConstInt(s)
		if !ok || v < 0 {
			return -1
		}
		n *= v
	}
	return n
}

// planReuse decides which lifted buffers share memory. It returns the
// allocations to make and, for buffers that now live in another's memory
// (or whose allocation grew), their replacement views.
func planReuse(lifted []*ir.Buffer, body ir.Stmt) ([]*ir.Buffer, map[*ir.Buffer]*ir.Buffer) {
	stmts := []ir.Stmt{body}
	if seq, ok := body.(*ir.SeqStmt); ok {
		stmts = seq.Seq
	}
	type life struct{ first, last int }
	lives := map[*ir.Var]*life{}
	for _, b := range lifted {
		lives[b.Data] = nil
	}
	for i, s := range stmts {
		ir.Visit(s, func(n ir.Node) bool {
			var v *ir.Var
			switch n := n.(type) {
			case *ir.BufferLoad:
				v = n.Buffer.Data
			case *ir.BufferStore:
				v = n.Buffer.Data
			case *ir.Var:
				v = n
			}
			if l, ok := lives[v]; ok {
				if l == nil {
					lives[v] = &life{i, i}
				} else {
					l.last = i
				}
			}
			return true
		})
	}
	type slot struct {
		buf     *ir.Buffer // the allocation
		size    int64
		last    int
		members []*ir.Buffer
	}
	var slots []*slot
	order := make([]*ir.Buffer, 0, len(lifted))
	for _, b := range lifted {
		if lives[b.Data] != nil {
			order = append(order, b)
		}
	}
	sort.SliceStable(order, func(i, j int) bool { return lives[order[i].Data].first < lives[order[j].Data].first })
	for _, b := range order {
		l := lives[b.Data]
		var pick *slot
		for _, s := range slots {
			if s.buf.DType == b.DType && s.buf.StorageScope() == b.StorageScope() && s.last < l.first {
				pick = s
				break
			}
		}
		if pick == nil {
			pick = &slot{buf: b}
			slots = append(slots, pick)
		}
		pick.members = append(pick.members, b)
		pick.size = max(pick.size, constSize(b))
		pick.last = max(pick.last, l.last)
	}
	remap := map[*ir.Buffer]*ir.Buffer{}
	allocs := make([]*ir.Buffer, 0, len(slots))
	for _, s := range slots {
		alloc := s.buf
		if len(s.members) > 1 || len(alloc.Shape) != 1 {
			c := *alloc
			c.Shape = []ir.Expr{ir.NewIntImm(sizeType(alloc), s.size)}
			c.Strides, c.ElemOffset = nil, nil
			alloc = &c
		}
		allocs = append(allocs, alloc)
		for _, m := range s.members {
			if m == alloc {
				continue
			}
			view := *m
			view.Data = alloc.Data
			remap[m] = &view
		}
	}
	return allocs, remap
}

func sizeType(b *ir.Buffer) ir.DType {
	if len(b.Shape) > 0 {
		return b.Shape[0].DType()
	}
	return ir.Int32
}
