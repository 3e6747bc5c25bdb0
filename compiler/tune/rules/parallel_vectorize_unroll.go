package rules

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// parallelVectorizeUnroll is MetaSchedule's ParallelVectorizeUnroll for
// CPUs, run last. Every loop nest at the root with enough work (at least
// parallelMinWork iterations) runs its outermost loop in parallel, as
// MetaSchedule parallelizes unconditionally (the outermost loop with more
// than one iteration: a loop the tiling left at one is skipped): the
// choice is only whether that loop runs alone or fused with the loop
// below it. Parallelism is
// not a sampled yes/no because candidates are often timed on one core
// (where it cannot show), and the tuned kernel runs on all. For each
// block: whether its innermost loop is vectorized, and how many
// iterations of its innermost serial loops are unrolled (0, 16, 64 or
// 256: loops are unrolled from the inside out while the product of their
// extents, and of the lanes of a vectorized loop inside them, stays
// within it). A primitive that refuses (a reduction loop
// cannot be parallel or vectorized) leaves the loop as it was.
type parallelVectorizeUnroll struct{}

// parallelMinWork is the fewest iterations of a loop nest worth running
// in parallel.
const parallelMinWork = 4096

var unrollSteps = []int64{0, 16, 64, 256}

func init() { Register(parallelVectorizeUnroll{}, "cpu") }

func (parallelVectorizeUnroll) Name() string { return "parallel_vectorize_unroll" }
func (parallelVectorizeUnroll) Order() int   { return 90 }

func (parallelVectorizeUnroll) Apply(c *Context, s *schedule.Schedule) error {
	names := blockNames(s.Func())
	done := map[*ir.Var]bool{} // loops made parallel
	for _, name := range names {
		b, err := s.GetBlock(name)
		if err != nil {
			continue
		}
		loops, err := s.GetLoops(b)
		if err != nil {
			continue
		}
		// The outermost loop with more than one iteration, unless it or
		// a loop around it runs in parallel already.
		p := firstNonUnit(s, loops)
		if p < 0 || slices.ContainsFunc(loops[:p+1], func(l schedule.LoopRV) bool { return done[l.Var()] }) {
			continue
		}
		nest := perfectPrefix(s, loops[p:])
		if len(nest) == 0 || nestWork(s, loops) < parallelMinWork {
			continue
		}
		done[nest[0].Var()] = true
		fuse := 0
		if len(nest) > 1 {
			if fuse, err = c.Sampler.Choose(s, fmt.Sprintf("parallel_fuse/%s", name), 2, nil); err != nil {
				return err
			}
		}
		if fuse == 1 {
			if f, err := s.Fuse(nest[0], nest[1]); err == nil {
				_ = s.Parallel(f)
			}
			continue
		}
		_ = s.Parallel(nest[0])
	}
	for _, name := range names {
		b, err := s.GetBlock(name)
		if err != nil {
			continue
		}
		loops, err := s.GetLoops(b)
		if err != nil || len(loops) == 0 {
			continue
		}
		inner := loops[len(loops)-1]
		f, err := s.LoopFor(inner)
		if err != nil {
			continue
		}
		ext, ok := ir.IsConstInt(f.Extent)
		if ok && ext > 1 && f.Kind == ir.ForSerial {
			v, err := c.Sampler.Choose(s, fmt.Sprintf("vectorize/%s", name), 2, []float64{1, 3})
			if err != nil {
				return err
			}
			if v == 1 {
				_ = s.Vectorize(inner)
			}
		}
		u, err := c.Sampler.Choose(s, fmt.Sprintf("unroll/%s", name), len(unrollSteps), nil)
		if err != nil {
			return err
		}
		unrollInner(s, loops, unrollSteps[u])
	}
	return nil
}

// firstNonUnit returns the index of the first of loops with more than one
// iteration (-1 when none has).
func firstNonUnit(s *schedule.Schedule, loops []schedule.LoopRV) int {
	for i, l := range loops {
		f, err := s.LoopFor(l)
		if err != nil {
			return -1
		}
		if ext, ok := ir.IsConstInt(f.Extent); !ok || ext > 1 {
			return i
		}
	}
	return -1
}

// nestWork is the product of the constant extents of loops.
func nestWork(s *schedule.Schedule, loops []schedule.LoopRV) int64 {
	w := int64(1)
	for _, l := range loops {
		if f, err := s.LoopFor(l); err == nil {
			if ext, ok := ir.IsConstInt(f.Extent); ok {
				w *= ext
			}
		}
	}
	return w
}

// perfectPrefix returns the outermost loops of loops that nest perfectly
// (each the only statement in the body of the one before), serial with
// constant extents.
func perfectPrefix(s *schedule.Schedule, loops []schedule.LoopRV) []schedule.LoopRV {
	var out []schedule.LoopRV
	for i, l := range loops {
		f, err := s.LoopFor(l)
		if err != nil || f.Kind != ir.ForSerial {
			break
		}
		if _, ok := ir.IsConstInt(f.Extent); !ok {
			break
		}
		out = append(out, l)
		if i+1 >= len(loops) {
			break
		}
		next, ok := f.Body.(*ir.For)
		if !ok || next.Var != loops[i+1].Var() {
			break
		}
	}
	return out
}

// unrollInner unrolls loops from the innermost serial one outwards while
// the product of their extents is at most steps and each loop's body is a
// single loop or block.
func unrollInner(s *schedule.Schedule, loops []schedule.LoopRV, steps int64) {
	if steps == 0 {
		return
	}
	prod := int64(1)
	for i := len(loops) - 1; i >= 0; i-- {
		f, err := s.LoopFor(loops[i])
		if err != nil {
			return
		}
		ext, ok := ir.IsConstInt(f.Extent)
		if !ok {
			return
		}
		if f.Kind == ir.ForVectorized {
			// Not unrolled, but its lanes are the unrolled body's work
			// all the same: left out, a 256-step unroll of a body of 32
			// lanes costs the C compiler seconds a candidate.
			prod *= ext
			continue
		}
		if f.Kind != ir.ForSerial && f.Kind != ir.ForUnrolled {
			return
		}
		switch f.Body.(type) {
		case *ir.For, *ir.BlockRealize:
		default:
			return
		}
		if prod*ext > steps {
			return
		}
		prod *= ext
		if ext > 1 {
			_ = s.Unroll(loops[i])
		}
	}
}
