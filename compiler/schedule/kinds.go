package schedule

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// ThreadTags are the thread axes Bind accepts.
var ThreadTags = []string{"blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z", "vthread", "vthread.x", "vthread.y", "vthread.z"}

// Parallel makes loop l run its iterations in parallel (on kiln's thread
// pool on CPU).
// Every block under l must bind only spatial iteration variables to l: a
// loop carrying a reduction cannot run in parallel.
func (s *Schedule) Parallel(l LoopRV) error {
	if err := s.setKind("parallel", l, ir.ForParallel, ""); err != nil {
		return err
	}
	s.record("sch.parallel(%s)", s.ln(l))
	return nil
}

// Vectorize makes loop l a vector loop. Its extent must be a constant, and
// every block under it must bind only spatial iteration variables to it.
func (s *Schedule) Vectorize(l LoopRV) error {
	if err := s.setKind("vectorize", l, ir.ForVectorized, ""); err != nil {
		return err
	}
	s.record("sch.vectorize(%s)", s.ln(l))
	return nil
}

// Unroll marks loop l to be unrolled by lowering.
func (s *Schedule) Unroll(l LoopRV) error {
	if err := s.setKind("unroll", l, ir.ForUnrolled, ""); err != nil {
		return err
	}
	s.record("sch.unroll(%s)", s.ln(l))
	return nil
}

// Bind binds loop l to the GPU thread axis tag (one of ThreadTags). Every
// block under it must bind only spatial iteration variables to it, except
// on a threadIdx axis: a reduction over threadIdx is a cross-thread
// reduction (TVM's), which lowering turns into a reduction across the
// threads of a block (see transform.LowerCrossThreadReduction).
func (s *Schedule) Bind(l LoopRV, tag string) error {
	if !slices.Contains(ThreadTags, tag) {
		return fmt.Errorf("bind: unknown thread axis %q (want one of %v)", tag, ThreadTags)
	}
	if err := s.setKind("bind", l, ir.ForThreadBinding, tag); err != nil {
		return err
	}
	s.record("sch.bind(%s, %q)", s.ln(l), tag)
	return nil
}

// Annotate sets annotation key of loop l to value (a bool, int64,
// float64 or string), a hint for lowering such as
// "pragma_auto_unroll_max_step".
func (s *Schedule) Annotate(l LoopRV, key string, value any) error {
	switch value.(type) {
	case bool, int64, float64, string:
	default:
		return fmt.Errorf("annotate: value %v of %q has type %T, want bool, int64, float64 or string", value, key, value)
	}
	st, err := s.loop("annotate", l)
	if err != nil {
		return err
	}
	f := *st.loop()
	f.Annotations = maps.Clone(f.Annotations)
	if f.Annotations == nil {
		f.Annotations = map[string]any{}
	}
	f.Annotations[key] = value
	if err := s.commit("annotate", replace(s.fn.Body, map[ir.Stmt]ir.Stmt{st.loop(): &f})); err != nil {
		return err
	}
	s.record("sch.annotate(%s, %q, %s)", s.ln(l), key, pyValue(value))
	return nil
}

func (s *Schedule) setKind(prim string, l LoopRV, kind ir.ForKind, tag string) error {
	st, err := s.loop(prim, l)
	if err != nil {
		return err
	}
	f := st.loop()
	if kind == ir.ForVectorized {
		if _, ok := ir.IsConstInt(f.Extent); !ok {
			return fmt.Errorf("%s: cannot vectorize loop %q: extent %s is not constant", prim, f.Var.Name, f.Extent)
		}
	}
	crossThread := kind == ir.ForThreadBinding && strings.HasPrefix(tag, "threadIdx.")
	if kind != ir.ForUnrolled && !crossThread {
		if err := checkDataParallel(f); err != nil {
			return fmt.Errorf("%s: %w", prim, err)
		}
	}
	if kind == ir.ForThreadBinding {
		for _, anc := range st.loops() {
			if anc.Kind == kind && anc.ThreadTag == tag {
				return fmt.Errorf("%s: loop %q is inside loop %q, already bound to %q", prim, f.Var.Name, anc.Var.Name, tag)
			}
		}
	}
	c := *f
	c.Kind, c.ThreadTag = kind, tag
	return s.commit(prim, replace(s.fn.Body, map[ir.Stmt]ir.Stmt{f: &c}))
}

// checkDataParallel reports a block under f that binds a non-spatial
// iteration variable to an expression of f's variable.
func checkDataParallel(f *ir.For) error {
	v := map[*ir.Var]bool{f.Var: true}
	var err error
	ir.Visit(f.Body, func(n ir.Node) bool {
		br, ok := n.(*ir.BlockRealize)
		if !ok || err != nil {
			return err == nil
		}
		for i, iv := range br.Block.IterVars {
			if iv.Kind != ir.IterSpatial && i < len(br.IterValues) && usesVar(br.IterValues[i], v) {
				err = fmt.Errorf("loop %q is bound to the %s iteration variable %q of block %q", f.Var.Name, iv.Kind, iv.Var.Name, br.Block.Name)
				return false
			}
		}
		return true
	})
	return err
}
