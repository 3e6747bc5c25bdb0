package transform

import (
	"maps"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// A "local" buffer allocated inside a GPU kernel is private to each
// thread (CUDA gives every thread its own, and
// the interpreter does too): a thread touches only the elements its own
// thread indices reach. So its region is computed per thread, as TVM's
// compaction does over unified thread variables: the variable of each
// threadIdx loop inside the placement point stands for its axis (one
// canonical variable per tag, with the axis's range), which is not
// relaxed, and the compacted indices subtract a minimum in the axis of
// the loop around each access. An accumulator that lives from one
// threadIdx loop nest to the next (init, products, copy back) keeps only
// one thread's tile.

// perThread reports whether b, allocated at the current placement point,
// is private to each thread: a "local" buffer under a blockIdx loop. The
// threadIdx loops around the placement point fix their thread indices
// there (a warp's loop bound to threadIdx.y); those inside it stand for
// their axes.
func (c *compactor) perThread(b *ir.Buffer) bool {
	if b.StorageScope() != "local" {
		return false
	}
	for _, f := range c.threads {
		if strings.HasPrefix(f.ThreadTag, "blockIdx") {
			return true
		}
	}
	return false
}

// threadAxis returns the canonical variable of the thread axis of loop f
// (a threadIdx loop), bound to the loop's range the first time.
func (c *compactor) threadAxis(f *ir.For) *ir.Var {
	if v, ok := c.axes[f.ThreadTag]; ok {
		return v
	}
	if c.axes == nil {
		c.axes = map[string]*ir.Var{}
	}
	v := ir.NewVar(f.ThreadTag, f.Var.Type)
	c.axes[f.ThreadTag] = v
	c.bind(v, ir.Range{Min: f.Min, Extent: f.Extent})
	return v
}

// axesOutside reports whether e uses the canonical variable of a thread
// axis that no loop around the access binds (in enclosing, by tag).
func (c *compactor) axesOutside(e ir.Expr, enclosing map[string]*ir.Var) bool {
	for tag, v := range c.axes {
		if _, in := enclosing[tag]; !in && usesAnyVar(e, map[*ir.Var]bool{v: true}) {
			return true
		}
	}
	return false
}

// isThreadIdxLoop reports a loop bound to a threadIdx axis.
func isThreadIdxLoop(f *ir.For) bool {
	return f.Kind == ir.ForThreadBinding && strings.HasPrefix(f.ThreadTag, "threadIdx")
}

// narrowAxis narrows the range of a thread axis inside a branch taken
// when cond, t < c for t (simplified) the variable of a threadIdx loop
// (axis maps it to its axis's) and c a constant (the guard of a split of one element
// over the threads: only the first threads run it), and returns what
// restores the range; nil when cond is not of that form.
func (c *compactor) narrowAxis(cond ir.Expr, axis map[*ir.Var]ir.Expr) func() {
	lt, ok := cond.(*ir.Binary)
	if !ok || lt.Op != ir.OpLT {
		return nil
	}
	v, ok := c.a.Simplify(ir.SubstituteExpr(lt.A, axis)).(*ir.Var)
	if !ok || !slices.Contains(slices.Collect(maps.Values(c.axes)), v) {
		return nil
	}
	n, ok := ir.IsConstInt(lt.B)
	if !ok {
		return nil
	}
	lo, hi := c.a.ConstIntBound(v)
	if n < lo+1 || n > hi {
		return nil
	}
	c.a.BindBound(v, lo, n-1)
	return func() { c.a.BindBound(v, lo, hi) }
}
