package transform

import (
	"sort"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/compiler/arith"
	"github.com/kiln-ml/kiln/compiler/ir"
)

// SyncThreads is the name of the call_extern of a block-wide barrier
// (CUDA's __syncthreads()) that InsertBarriers places.
const SyncThreads = "__syncthreads"

// InsertBarriers places a block-wide barrier (an Evaluate of
// call_extern(SyncThreads)) in a lowered GPU kernel wherever a thread may
// access shared memory that another thread wrote, or write shared memory
// that another thread read, since the last barrier, and nowhere else.
//
// The threads of a block run the statements outside their threadIdx loops
// together; each threadIdx loop nest (one with no threadIdx loop inside) is
// a unit of per-thread work. Between two units, a barrier goes in when the
// later one reads a shared buffer an earlier one wrote (a read after a
// write), writes one an earlier one read (a write after a read) or wrote
// (a write after a write), unless every access involved is to the same
// element by the same thread: its indices, with each thread axis's loop
// variable named after the axis, are equal, depend only on the thread axes
// and on variables fixed for the whole sequence, and give each thread of
// the block its own element (checked by evaluating them for every thread,
// up to 1024, at two values of the other variables). In a serial loop the
// accesses of one iteration are checked against the next's (a barrier
// goes at the end of the body when they conflict). Shared buffers are
// those of scope "shared" and "shared.dyn".
func InsertBarriers(f *ir.PrimFunc) *ir.PrimFunc {
	b := &barriers{canon: map[string]*ir.Var{}, threadVar: map[*ir.Var]*ir.Var{}, extent: map[string]int64{},
		shared: map[*ir.Var]bool{}, injective: map[string]bool{}}
	// The extents of the thread axes first: injectivity needs all of them.
	ir.Visit(f.Body, func(n ir.Node) bool {
		if l, ok := n.(*ir.For); ok && l.Kind == ir.ForThreadBinding && l.ThreadTag != "" {
			b.bind(l)
		}
		return true
	})
	ir.Visit(f.Body, func(n ir.Node) bool {
		if a, ok := n.(*ir.Allocate); ok {
			switch a.Buffer.StorageScope() {
			case "shared", "shared.dyn":
				b.shared[a.Buffer.Data] = true
			}
		}
		return true
	})
	if len(b.shared) == 0 {
		return f
	}
	body, _ := b.block(f.Body, syncState{})
	return f.WithBody(body)
}

// access is one load or store of a shared buffer by a unit.
type access struct {
	buf *ir.Var
	idx []ir.Expr // with thread variables replaced by their axis's
	// pure is set when idx depends only on thread axes and variables
	// fixed outside the unit: each thread touches one known element.
	pure bool
}

// syncState is what happened since the last barrier.
type syncState struct{ writes, reads []access }

func (s syncState) union(o syncState) syncState {
	return syncState{writes: append(append([]access(nil), s.writes...), o.writes...), reads: append(append([]access(nil), s.reads...), o.reads...)}
}

type barriers struct {
	canon     map[string]*ir.Var  // thread axis → its canonical variable
	threadVar map[*ir.Var]*ir.Var // loop variable → canonical variable
	extent    map[string]int64    // threadIdx axis → its extent
	shared    map[*ir.Var]bool
	injective map[string]bool // memo of injective, by printed indices
}

// bind names loop f's variable after its thread axis.
func (b *barriers) bind(f *ir.For) {
	if _, ok := b.canon[f.ThreadTag]; !ok {
		b.canon[f.ThreadTag] = ir.NewVar(f.ThreadTag, f.Var.Type)
	}
	b.threadVar[f.Var] = b.canon[f.ThreadTag]
	if e, ok := ir.IsConstInt(f.Extent); ok && isThreadIdx(f) {
		b.extent[f.ThreadTag] = e
	}
}

// maxEnumerate bounds the thread tuples injective evaluates.
const maxEnumerate = 1024

// isInjective reports whether idx (with thread variables canonical) names
// a different element for each thread of a block, for a few values of the
// other variables: only then are equal indices the same thread's element.
func (b *barriers) isInjective(idx []ir.Expr) bool {
	key := ""
	for _, e := range idx {
		key += e.String() + ";"
	}
	if v, ok := b.injective[key]; ok {
		return v
	}
	var tags []string
	total := int64(1)
	for tag, e := range b.extent {
		tags = append(tags, tag)
		total *= e
	}
	sort.Strings(tags)
	ok := total <= maxEnumerate
	var others []*ir.Var
	seen := map[*ir.Var]bool{}
	for _, e := range idx {
		ir.Visit(e, func(n ir.Node) bool {
			if v, isVar := n.(*ir.Var); isVar && !seen[v] {
				seen[v] = true
				isThread := false
				for _, c := range b.canon {
					isThread = isThread || c == v
				}
				if !isThread {
					others = append(others, v)
				}
			}
			return true
		})
	}
	an := arith.NewAnalyzer()
	for _, sample := range []int64{0, 3} {
		if !ok {
			break
		}
		got := map[string]bool{}
		for t := int64(0); t < total && ok; t++ {
			vmap := map[*ir.Var]ir.Expr{}
			rest := t
			for _, tag := range tags {
				vmap[b.canon[tag]] = ir.NewIntImm(b.canon[tag].Type, rest%b.extent[tag])
				rest /= b.extent[tag]
			}
			for _, v := range others {
				if _, set := vmap[v]; !set {
					vmap[v] = ir.NewIntImm(v.Type, sample)
				}
			}
			k := ""
			for _, e := range idx {
				c, isConst := ir.IsConstInt(an.Simplify(ir.SubstituteExpr(e, vmap)))
				if !isConst {
					ok = false
					break
				}
				k += strconv.FormatInt(c, 10) + ","
			}
			if got[k] {
				ok = false
			}
			got[k] = true
		}
	}
	b.injective[key] = ok
	return ok
}

// conflict reports whether a and b, from different units, may be
// different threads' accesses to one element.
func conflict(a, b access) bool {
	if a.buf != b.buf {
		return false
	}
	if !a.pure || !b.pure || len(a.idx) != len(b.idx) {
		return true
	}
	for i := range a.idx {
		if !ir.StructuralEqual(a.idx[i], b.idx[i]) {
			return true
		}
	}
	return false
}

// hazard reports whether unit u (its reads and writes) must wait for a
// barrier after st.
func hazard(st, u syncState) bool {
	for _, w := range st.writes {
		for _, r := range u.reads {
			if conflict(w, r) {
				return true
			}
		}
		for _, w2 := range u.writes {
			if conflict(w, w2) {
				return true
			}
		}
	}
	for _, r := range st.reads {
		for _, w := range u.writes {
			if conflict(r, w) {
				return true
			}
		}
	}
	return false
}

func syncStmt() ir.Stmt { return &ir.Evaluate{Value: ir.NewCallExtern(ir.Void, SyncThreads)} }

func isThreadIdx(f *ir.For) bool {
	return f.Kind == ir.ForThreadBinding && strings.HasPrefix(f.ThreadTag, "threadIdx.")
}

// hasThreadLoop reports whether s contains a threadIdx loop.
func hasThreadLoop(s ir.Stmt) bool {
	found := false
	ir.Visit(s, func(n ir.Node) bool {
		if l, ok := n.(*ir.For); ok && isThreadIdx(l) {
			found = true
		}
		return !found
	})
	return found
}

// block rewrites a statement the threads of a block run together, given
// the state before it, and returns the state after it.
func (b *barriers) block(s ir.Stmt, st syncState) (ir.Stmt, syncState) {
	switch n := s.(type) {
	case *ir.SeqStmt:
		var out []ir.Stmt
		for _, c := range n.Seq {
			var c2 ir.Stmt
			c2, st = b.block(c, st)
			if seq, ok := c2.(*ir.SeqStmt); ok {
				out = append(out, seq.Seq...)
				continue
			}
			out = append(out, c2)
		}
		return &ir.SeqStmt{Seq: out}, st
	case *ir.For:
		if n.Kind == ir.ForThreadBinding {
			if n.ThreadTag != "" {
				b.bind(n)
			}
			if !isThreadIdx(n) || hasThreadLoop(n.Body) {
				body, st2 := b.block(n.Body, st)
				c := *n
				c.Body = body
				return &c, st2
			}
			return b.unit(n, st)
		}
		if !hasThreadLoop(n.Body) {
			return b.unit(n, st)
		}
		// A serial loop around units: check the body against the state
		// before it, then its end against its start (the next iteration).
		body, end := b.block(n.Body, st)
		first := b.accesses(n.Body, map[*ir.Var]bool{n.Var: true})
		if hazard(end, first) {
			body = ir.Seq(body, syncStmt())
			end = syncState{}
		}
		c := *n
		c.Body = body
		return &c, end
	case *ir.LetStmt:
		body, st2 := b.block(n.Body, st)
		return &ir.LetStmt{Var: n.Var, Value: n.Value, Body: body}, st2
	case *ir.Allocate:
		body, st2 := b.block(n.Body, st)
		return &ir.Allocate{Buffer: n.Buffer, Body: body}, st2
	case *ir.AttrStmt:
		body, st2 := b.block(n.Body, st)
		return &ir.AttrStmt{Node: n.Node, Key: n.Key, Value: n.Value, Body: body}, st2
	case *ir.IfThenElse:
		if !hasThreadLoop(n) {
			return b.unit(n, st)
		}
		then, st1 := b.block(n.Then, st)
		var els ir.Stmt
		st2 := st
		if n.Else != nil {
			els, st2 = b.block(n.Else, st)
		}
		return &ir.IfThenElse{Cond: n.Cond, Then: then, Else: els}, st1.union(st2)
	}
	return b.unit(s, st)
}

// unit handles per-thread work: a barrier before it when it conflicts with
// what came since the last one.
func (b *barriers) unit(s ir.Stmt, st syncState) (ir.Stmt, syncState) {
	u := b.accesses(s, nil)
	if len(u.reads) == 0 && len(u.writes) == 0 {
		return s, st
	}
	if hazard(st, u) {
		return ir.Seq(syncStmt(), s), u
	}
	return s, st.union(u)
}

// accesses lists the shared-memory accesses of s. Indices that use a
// variable defined inside s, or one of varying, are not pure.
func (b *barriers) accesses(s ir.Stmt, varying map[*ir.Var]bool) syncState {
	inner := map[*ir.Var]bool{}
	for v := range varying {
		inner[v] = true
	}
	ir.Visit(s, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.For:
			if n.Kind == ir.ForThreadBinding && n.ThreadTag != "" {
				b.bind(n)
			} else {
				inner[n.Var] = true
			}
		case *ir.LetStmt:
			inner[n.Var] = true
		case *ir.Let:
			inner[n.Var] = true
		}
		return true
	})
	vmap := map[*ir.Var]ir.Expr{}
	for v, c := range b.threadVar {
		vmap[v] = c
	}
	var st syncState
	record := func(buf *ir.Buffer, idx []ir.Expr, write bool) {
		if !b.shared[buf.Data] {
			return
		}
		a := access{buf: buf.Data, pure: true}
		for _, e := range idx {
			ce := ir.SubstituteExpr(e, vmap)
			ir.Visit(ce, func(n ir.Node) bool {
				switch n := n.(type) {
				case *ir.Var:
					if inner[n] {
						a.pure = false
					}
				case *ir.BufferLoad, *ir.Ramp:
					a.pure = false
				}
				return a.pure
			})
			a.idx = append(a.idx, ce)
		}
		if a.pure {
			a.pure = b.isInjective(a.idx)
		}
		if write {
			st.writes = append(st.writes, a)
		} else {
			st.reads = append(st.reads, a)
		}
	}
	ir.Visit(s, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.BufferStore:
			record(n.Buffer, n.Indices, true)
		case *ir.BufferLoad:
			record(n.Buffer, n.Indices, false)
		}
		return true
	})
	return st
}
