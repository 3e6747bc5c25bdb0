package auto

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Scheduled reports whether f carries a schedule of its own, one that a
// default schedule must not replace, and names the first sign of it. A
// function is scheduled when it has
//
//   - a loop that is not serial (parallel, vectorized, unrolled, bound to
//     a thread axis) or that carries annotations (Schedule.Parallel,
//     Vectorize, Unroll, Bind, Annotate; te's s[C].parallel);
//   - a buffer in a scope other than global (CacheRead, CacheWrite);
//   - a block bound to anything but the variables of the loops around
//     it, one each, in the loops' order (Split, Fuse, Reorder,
//     ComputeAt), or under a predicate (a split that does not divide);
//   - a reduction block without its init (DecomposeReduction).
//
// Inlining a block (ComputeInline) leaves no sign: a function whose only
// change is an inlined block is taken as unscheduled.
func Scheduled(f *ir.PrimFunc) (bool, string) {
	sign := ""
	var walk func(n ir.Node, loops []*ir.Var)
	walk = func(n ir.Node, loops []*ir.Var) {
		ir.Visit(n, func(m ir.Node) bool {
			if sign != "" {
				return false
			}
			switch m := m.(type) {
			case *ir.For:
				if m.Kind != ir.ForSerial {
					sign = fmt.Sprintf("loop %s is %s", m.Var.Name, m.Kind)
				} else if len(m.Annotations) > 0 {
					sign = fmt.Sprintf("loop %s is annotated", m.Var.Name)
				}
				if sign == "" {
					walk(m.Body, append(loops[:len(loops):len(loops)], m.Var))
				}
				return false
			case *ir.Allocate:
				if s := m.Buffer.StorageScope(); s != "global" {
					sign = fmt.Sprintf("buffer %s is in scope %q", m.Buffer.Name, s)
				}
			case *ir.BlockRealize:
				if m.Block == nil {
					return true
				}
				if m.Block == ir.RootBlock(f.Body) {
					sign = allocSign(m.Block)
					return sign == ""
				}
				if sign = blockSign(m, loops); sign == "" {
					walk(m.Block.Body, nil)
					if m.Block.Init != nil {
						walk(m.Block.Init, nil)
					}
				}
				return false
			}
			return true
		})
	}
	if f.Body != nil {
		walk(f.Body, nil)
	}
	return sign != "", sign
}

// blockSign names what in br's binding shows a schedule, or "" when it is
// bound as written: each iteration variable to its own variable of the
// loops around it (since the enclosing block), in their order.
func blockSign(br *ir.BlockRealize, loops []*ir.Var) string {
	b := br.Block
	if s := allocSign(b); s != "" {
		return s
	}
	if !isTrue(br.Predicate) {
		return fmt.Sprintf("block %q runs under a predicate", b.Name)
	}
	reduce := false
	for _, iv := range b.IterVars {
		reduce = reduce || iv.Kind == ir.IterReduce
	}
	if reduce && b.Init == nil {
		return fmt.Sprintf("block %q is a reduction without its init", b.Name)
	}
	at := map[*ir.Var]int{}
	for i, v := range loops {
		at[v] = i
	}
	last := -1
	for i, e := range br.IterValues {
		if c, ok := e.(*ir.IntImm); ok && i < len(b.IterVars) && isUnitDomain(b.IterVars[i], c) {
			continue
		}
		v, ok := e.(*ir.Var)
		if !ok {
			return fmt.Sprintf("block %q is bound to %s", b.Name, e)
		}
		pos, ok := at[v]
		if !ok {
			// A variable of no loop here (a block under a compute_at's
			// loops binds those).
			return fmt.Sprintf("block %q is bound to %s, not a loop of its own", b.Name, v.Name)
		}
		if pos <= last {
			return fmt.Sprintf("block %q's loops are reordered", b.Name)
		}
		last = pos
	}
	return ""
}

// allocSign names a buffer b allocates outside global memory, or "".
func allocSign(b *ir.Block) string {
	for _, buf := range b.AllocBuffers {
		if s := buf.StorageScope(); s != "global" {
			return fmt.Sprintf("buffer %s is in scope %q", buf.Name, s)
		}
	}
	return ""
}

// isUnitDomain reports an iteration variable of extent 1 bound to its
// only value (how a scalar block is written).
func isUnitDomain(iv ir.IterVar, c *ir.IntImm) bool {
	ext, ok := iv.Dom.Extent.(*ir.IntImm)
	min, _ := iv.Dom.Min.(*ir.IntImm)
	return ok && ext.Value == 1 && min != nil && min.Value == c.Value
}
