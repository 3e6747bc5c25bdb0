package transform

import (
	"strings"

	"github.com/kiln-ml/kiln/compiler/arith"
	"github.com/kiln-ml/kiln/compiler/ir"
)

// maxCompactDepth bounds the substitutions that take a region's minimum
// from the variables of the loops inside the allocation to those outside
// (a loop's minimum may use an enclosing loop's variable).
const maxCompactDepth = 64

// maxSymbolicCompact is the largest extent a dimension of symbolic size is
// shrunk to: a larger "constant" extent comes from a dtype's range (a loop
// of symbolic extent), not from the program, and the full size is better.
const maxSymbolicCompact = 1 << 16

// CompactBuffers shrinks each buffer allocated inside the function to the
// region its accesses touch, and places the allocation at the innermost
// statement that holds all of them (TVM's CompactBufferAllocation with
// PlanAndUpdateBufferAllocationLocation).
//
// Placement goes down through sequences (when one statement holds every
// access), bindings, conditionals and parallel loops as lower_blocks
// does, and also into a serial or unrolled loop when the regions its
// iterations touch are disjoint (one dimension's minimum moves by at least
// the region's extent per iteration), so no value flows from one
// iteration to the next (a loop of one iteration is always entered). Vectorized loops are never entered, and
// thread-bound loops are entered only by buffers that are not "shared"
// (a shared buffer is entered by blockIdx loops only).
//
// At the placement point, every dimension's accessed region is computed by
// relaxing the variables of the loops inside it over their ranges (and,
// for a "shared" buffer, threadIdx variables too): its minimum is the
// first access's index with those variables at their minimum, plus a
// constant; its extent a constant from compiler/arith's bounds. A
// dimension whose extent cannot be proved constant, or is not smaller
// than the buffer's, keeps its full size. A "local" buffer allocated in a
// GPU kernel outside its threadIdx loops is private to each thread, and
// its region is one thread's (see compact_thread.go). Accesses are
// rewritten to index − minimum. Buffers with strides, an element offset, or whose data
// is used other than by loads and stores of the same shape (a declared
// view, an address) are left as they are.
//
// compact_buffers runs after lower_blocks (it works on Allocate
// statements and plain loops) and before flatten_buffers (it needs the
// buffer's dimensions).
func CompactBuffers(f *ir.PrimFunc) (*ir.PrimFunc, error) {
	c := &compactor{a: arith.NewAnalyzer(), known: map[*ir.Var]int{}}
	return f.WithBody(c.stmt(f.Body)), nil
}

// compactor walks a function keeping the enclosing loops' ranges in a.
type compactor struct {
	a *arith.Analyzer
	// known counts the enclosing bindings of each variable (loops, lets).
	known map[*ir.Var]int
	// threads maps the variables of enclosing thread-bound loops to their
	// loops (a shared buffer's region is relaxed over threadIdx).
	threads map[*ir.Var]*ir.For
	// axes are the canonical variables of the thread axes, by tag, for
	// the regions of per-thread buffers (compact_thread.go).
	axes map[string]*ir.Var
}

// stmt compacts the allocations under s.
func (c *compactor) stmt(s ir.Stmt) ir.Stmt {
	r := &ir.Rewriter{}
	r.PreStmt = func(s ir.Stmt) (ir.Stmt, bool) {
		switch s := s.(type) {
		case *ir.For:
			c.bind(s.Var, ir.Range{Min: s.Min, Extent: s.Extent})
			if s.Kind == ir.ForThreadBinding {
				if c.threads == nil {
					c.threads = map[*ir.Var]*ir.For{}
				}
				c.threads[s.Var] = s
			}
			body := r.RewriteStmt(s.Body)
			delete(c.threads, s.Var)
			c.unbind(s.Var)
			if body == s.Body {
				return s, true
			}
			n := *s
			n.Body = body
			return &n, true
		case *ir.LetStmt:
			c.bindValue(s.Var, s.Value)
			body := r.RewriteStmt(s.Body)
			c.unbind(s.Var)
			if body == s.Body {
				return s, true
			}
			return &ir.LetStmt{Var: s.Var, Value: s.Value, Body: body}, true
		case *ir.Allocate:
			body := r.RewriteStmt(s.Body)
			return c.allocate(s.Buffer, body), true
		}
		return nil, false
	}
	return seqSafe(r).RewriteStmt(s)
}

// allocate returns the allocation of b around body, compacted and placed.
func (c *compactor) allocate(b *ir.Buffer, body ir.Stmt) ir.Stmt {
	if !compactable(b, body) {
		return &ir.Allocate{Buffer: b, Body: body}
	}
	return c.place(b, body)
}

// compactable reports a buffer whose data is used only by loads and
// stores through buffers of its shape, with no strides or offset.
func compactable(b *ir.Buffer, body ir.Stmt) bool {
	if len(b.Strides) != 0 || (b.ElemOffset != nil && !isZeroConst(b.ElemOffset)) || len(b.Shape) == 0 {
		return false
	}
	ok := true
	same := func(o *ir.Buffer) bool {
		if o == b {
			return true
		}
		if len(o.Shape) != len(b.Shape) || len(o.Strides) != 0 || (o.ElemOffset != nil && !isZeroConst(o.ElemOffset)) || o.DType != b.DType {
			return false
		}
		for i := range o.Shape {
			if !ir.StructuralEqual(o.Shape[i], b.Shape[i]) {
				return false
			}
		}
		return true
	}
	ir.Visit(body, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.BufferLoad:
			if n.Buffer.Data == b.Data && (!same(n.Buffer) || len(n.Indices) != len(b.Shape)) {
				ok = false
			}
		case *ir.BufferStore:
			if n.Buffer.Data == b.Data && (!same(n.Buffer) || len(n.Indices) != len(b.Shape)) {
				ok = false
			}
		case *ir.DeclBuffer:
			if n.Buffer.Data == b.Data {
				ok = false
			}
		case *ir.Allocate:
			if n.Buffer.Data == b.Data {
				ok = false
			}
		case *ir.Var:
			if n == b.Data {
				ok = false
			}
		}
		return ok
	})
	return ok
}

// place puts the (compacted) allocation of b as deep inside s as it may
// go and returns the new statement.
func (c *compactor) place(b *ir.Buffer, s ir.Stmt) ir.Stmt {
	switch s := s.(type) {
	case *ir.SeqStmt:
		at := -1
		for i, x := range s.Seq {
			if usesData(x, b.Data) {
				if at >= 0 {
					return c.compactAt(b, s)
				}
				at = i
			}
		}
		if at < 0 {
			return c.compactAt(b, s)
		}
		seq := append([]ir.Stmt(nil), s.Seq...)
		seq[at] = c.place(b, s.Seq[at])
		return &ir.SeqStmt{Seq: seq}
	case *ir.For:
		if exprUsesData(s.Min, b.Data) || exprUsesData(s.Extent, b.Data) || !c.mayEnter(b, s) {
			return c.compactAt(b, s)
		}
		c.bind(s.Var, ir.Range{Min: s.Min, Extent: s.Extent})
		defer c.unbind(s.Var)
		if s.Kind == ir.ForThreadBinding {
			if c.threads == nil {
				c.threads = map[*ir.Var]*ir.For{}
			}
			c.threads[s.Var] = s
			defer delete(c.threads, s.Var)
		}
		n := *s
		n.Body = c.place(b, s.Body)
		return &n
	case *ir.LetStmt:
		if exprUsesData(s.Value, b.Data) || bufferUsesVar(b, s.Var) {
			return c.compactAt(b, s)
		}
		c.bindValue(s.Var, s.Value)
		defer c.unbind(s.Var)
		return &ir.LetStmt{Var: s.Var, Value: s.Value, Body: c.place(b, s.Body)}
	case *ir.IfThenElse:
		inThen, inElse := usesData(s.Then, b.Data), s.Else != nil && usesData(s.Else, b.Data)
		if exprUsesData(s.Cond, b.Data) || inThen == inElse {
			return c.compactAt(b, s)
		}
		if inThen {
			return &ir.IfThenElse{Cond: s.Cond, Then: c.place(b, s.Then), Else: s.Else}
		}
		return &ir.IfThenElse{Cond: s.Cond, Then: s.Then, Else: c.place(b, s.Else)}
	case *ir.Allocate:
		if bufferUsesVar(s.Buffer, b.Data) {
			return c.compactAt(b, s)
		}
		return &ir.Allocate{Buffer: s.Buffer, Body: c.place(b, s.Body)}
	}
	return c.compactAt(b, s)
}

// mayEnter reports whether the allocation of b may move inside loop f.
func (c *compactor) mayEnter(b *ir.Buffer, f *ir.For) bool {
	shared := strings.HasPrefix(b.StorageScope(), "shared")
	switch f.Kind {
	case ir.ForParallel:
		return true
	case ir.ForThreadBinding:
		return !shared || strings.HasPrefix(f.ThreadTag, "blockIdx")
	case ir.ForSerial, ir.ForUnrolled:
		if ext, ok := ir.IsConstInt(f.Extent); ok && ext == 1 {
			return true // one iteration: nothing flows to the next
		}
		if f.Annotations["recomputed_iterations"] == true {
			// schedule.SplitOverlap's loop: each iteration writes what it
			// reads, its regions overlapping the one before's.
			return true
		}
		// Disjoint per-iteration regions: look at the region touched by
		// one iteration, with the loop variable fixed.
		c.bind(f.Var, ir.Range{Min: f.Min, Extent: f.Extent})
		defer c.unbind(f.Var)
		reg := c.region(b, f.Body)
		if reg == nil {
			return false
		}
		next := map[*ir.Var]ir.Expr{f.Var: ir.Add(f.Var, ir.NewIntImm(f.Var.Type, 1))}
		for _, d := range reg {
			if !d.ok || !d.compacts {
				continue
			}
			m := d.min()
			step, ok := ir.IsConstInt(c.a.Simplify(ir.Sub(ir.SubstituteExpr(m, next), m)))
			if ok && (step >= d.extent() || -step >= d.extent()) {
				return true
			}
		}
	}
	return false
}

// dimRegion is the region of one dimension: [base+lo, base+hi].
type dimRegion struct {
	ok       bool    // the region is known
	compacts bool    // the region is smaller than the dimension
	base     ir.Expr // in variables defined outside the placement point
	lo, hi   int64
}

func (d dimRegion) min() ir.Expr {
	if d.lo == 0 {
		return d.base
	}
	return ir.Add(d.base, ir.NewIntImm(d.base.DType(), d.lo))
}

func (d dimRegion) extent() int64 { return d.hi - d.lo + 1 }

// region computes the region of b that s touches, relaxing the variables
// of the loops inside s; nil when s does not touch b. Variables outside s
// must be bound in c.a.
func (c *compactor) region(b *ir.Buffer, s ir.Stmt) []dimRegion {
	reg := make([]dimRegion, len(b.Shape))
	for i := range reg {
		reg[i].ok = true
	}
	seen := false
	inner := map[*ir.Var]bool{} // variables defined inside s
	relax := map[*ir.Var]ir.Expr{}
	if strings.HasPrefix(b.StorageScope(), "shared") {
		for v, f := range c.threads {
			if strings.HasPrefix(f.ThreadTag, "threadIdx") {
				relax[v] = f.Min
			}
		}
	}
	perThread := c.perThread(b)
	axis := map[*ir.Var]ir.Expr{}     // threadIdx loop variable → its axis's
	enclosing := map[string]*ir.Var{} // axes of the threadIdx loops around the access
	access := func(idx []ir.Expr) {
		seen = true
		for d, e := range idx {
			r := &reg[d]
			if !r.ok {
				continue
			}
			if perThread {
				e = ir.SubstituteExpr(e, axis)
			}
			if e.DType().Lanes != 1 {
				r.ok = false
				continue
			}
			if r.base == nil {
				base := e
				for range maxCompactDepth {
					nb := ir.SubstituteExpr(base, relax)
					if nb == base {
						break
					}
					base = nb
				}
				base = c.a.Simplify(base)
				if usesAnyVar(base, inner) || usesAnyVar(base, relax) || c.axesOutside(base, enclosing) {
					r.ok = false
					continue
				}
				r.base = base
				r.lo, r.hi = 1, 0 // empty
			}
			if c.axesOutside(r.base, enclosing) {
				r.ok = false
				continue
			}
			off := c.a.Simplify(ir.Sub(e, r.base))
			lo, hi := c.a.ConstIntBound(off)
			if lo == arith.NegInf || hi == arith.PosInf || !c.boundedVars(off, inner) {
				r.ok = false
				continue
			}
			if r.lo > r.hi {
				r.lo, r.hi = lo, hi
			} else {
				r.lo, r.hi = min(r.lo, lo), max(r.hi, hi)
			}
		}
	}
	var walk func(n ir.Node) bool
	walk = func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.For:
			ir.Visit(n.Min, walk)
			ir.Visit(n.Extent, walk)
			if perThread && isThreadIdxLoop(n) {
				v := c.threadAxis(n)
				axis[n.Var], enclosing[n.ThreadTag] = v, v
				ir.Visit(n.Body, walk)
				delete(axis, n.Var)
				delete(enclosing, n.ThreadTag)
				return false
			}
			c.a.Bind(n.Var, ir.Range{Min: n.Min, Extent: n.Extent})
			inner[n.Var] = true
			relax[n.Var] = n.Min
			ir.Visit(n.Body, walk)
			delete(relax, n.Var)
			c.a.Unbind(n.Var)
			return false
		case *ir.LetStmt:
			ir.Visit(n.Value, walk)
			c.a.BindValue(n.Var, n.Value)
			inner[n.Var] = true
			ir.Visit(n.Body, walk)
			c.a.Unbind(n.Var)
			return false
		case *ir.Let:
			inner[n.Var] = true
		case *ir.IfThenElse:
			if perThread {
				if restore := c.narrowAxis(n.Cond, axis); restore != nil {
					ir.Visit(n.Cond, walk)
					ir.Visit(n.Then, walk)
					restore()
					if n.Else != nil {
						ir.Visit(n.Else, walk)
					}
					return false
				}
			}
		case *ir.BufferLoad:
			if n.Buffer.Data == b.Data {
				access(n.Indices)
			}
		case *ir.BufferStore:
			if n.Buffer.Data == b.Data {
				access(n.Indices)
			}
		}
		return true
	}
	ir.Visit(s, walk)
	if !seen {
		return nil
	}
	for i := range reg {
		r := &reg[i]
		if !r.ok || r.base == nil || r.lo > r.hi {
			r.ok = false
			continue
		}
		ext := r.extent()
		full, isConst := ir.IsConstInt(b.Shape[i])
		r.compacts = ext > 0 && (isConst && ext < full || !isConst && ext <= maxSymbolicCompact)
	}
	return reg
}

// boundedVars reports whether every variable of e is bound by a loop or
// a binding (outside the placement point, or inside: inner), so its bounds
// come from the program rather than from its dtype.
func (c *compactor) boundedVars(e ir.Expr, inner map[*ir.Var]bool) bool {
	ok := true
	ir.Visit(e, func(n ir.Node) bool {
		if v, isVar := n.(*ir.Var); isVar && !inner[v] && c.known[v] == 0 {
			ok = false
		}
		return ok
	})
	return ok
}

// usesAnyVar reports whether e uses a variable of vars.
func usesAnyVar[T any](e ir.Expr, vars map[*ir.Var]T) bool {
	found := false
	ir.Visit(e, func(n ir.Node) bool {
		if v, ok := n.(*ir.Var); ok {
			if _, in := vars[v]; in {
				found = true
			}
		}
		return !found
	})
	return found
}

// compactAt allocates b around s, shrunk to the region s touches.
func (c *compactor) compactAt(b *ir.Buffer, s ir.Stmt) ir.Stmt {
	reg := c.region(b, s)
	shrink := false
	for _, d := range reg {
		shrink = shrink || (d.ok && d.compacts)
	}
	if !shrink {
		return &ir.Allocate{Buffer: b, Body: s}
	}
	nb := *b
	nb.Shape = make([]ir.Expr, len(b.Shape))
	mins := make([]ir.Expr, len(b.Shape))
	for i, d := range reg {
		if d.ok && d.compacts {
			nb.Shape[i] = ir.NewIntImm(b.Shape[i].DType(), d.extent())
			mins[i] = c.a.Simplify(d.min())
		} else {
			nb.Shape[i] = b.Shape[i]
		}
	}
	// The thread axes' variables of a per-thread buffer's minima are
	// those of the loops around each access.
	axisVar := map[*ir.Var]ir.Expr{}
	shift := func(idx []ir.Expr) []ir.Expr {
		out := make([]ir.Expr, len(idx))
		for i, e := range idx {
			out[i] = e
			if mins[i] != nil && !isZeroConst(mins[i]) {
				out[i] = c.a.Simplify(ir.Sub(e, ir.SubstituteExpr(mins[i], axisVar)))
			}
		}
		return out
	}
	r := &ir.Rewriter{}
	r.PreStmt = func(s ir.Stmt) (ir.Stmt, bool) {
		switch s := s.(type) {
		case *ir.For:
			if v, ok := c.axes[s.ThreadTag]; ok && isThreadIdxLoop(s) {
				outer, had := axisVar[v]
				axisVar[v] = s.Var
				defer func() {
					if had {
						axisVar[v] = outer
					} else {
						delete(axisVar, v)
					}
				}()
			}
			mn, ext := r.RewriteExpr(s.Min), r.RewriteExpr(s.Extent)
			c.a.Bind(s.Var, ir.Range{Min: s.Min, Extent: s.Extent})
			body := r.RewriteStmt(s.Body)
			c.a.Unbind(s.Var)
			n := *s
			n.Min, n.Extent, n.Body = mn, ext, body
			return &n, true
		case *ir.LetStmt:
			v := r.RewriteExpr(s.Value)
			c.a.BindValue(s.Var, s.Value)
			body := r.RewriteStmt(s.Body)
			c.a.Unbind(s.Var)
			return &ir.LetStmt{Var: s.Var, Value: v, Body: body}, true
		}
		return nil, false
	}
	r.Expr = func(e ir.Expr) ir.Expr {
		if l, ok := e.(*ir.BufferLoad); ok && l.Buffer.Data == b.Data {
			return &ir.BufferLoad{Buffer: &nb, Indices: shift(l.Indices)}
		}
		return e
	}
	r.Stmt = func(s ir.Stmt) ir.Stmt {
		if st, ok := s.(*ir.BufferStore); ok && st.Buffer.Data == b.Data {
			return &ir.BufferStore{Buffer: &nb, Value: st.Value, Indices: shift(st.Indices)}
		}
		return s
	}
	return &ir.Allocate{Buffer: &nb, Body: seqSafe(r).RewriteStmt(s)}
}

// bind records an enclosing loop's variable.
func (c *compactor) bind(v *ir.Var, r ir.Range) {
	c.a.Bind(v, r)
	c.known[v]++
}

// bindValue records an enclosing let binding.
func (c *compactor) bindValue(v *ir.Var, e ir.Expr) {
	c.a.BindValue(v, e)
	c.known[v]++
}

// unbind forgets the innermost binding of v.
func (c *compactor) unbind(v *ir.Var) {
	c.a.Unbind(v)
	if c.known[v]--; c.known[v] <= 0 {
		delete(c.known, v)
	}
}
