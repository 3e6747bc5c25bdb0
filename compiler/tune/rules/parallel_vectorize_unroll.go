package rules

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// parallelVectorizeUnroll is MetaSchedule's ParallelVectorizeUnroll for
// CPUs, run last. For each loop nest at the root: whether the outermost
// loop runs in parallel, alone or fused with the loop below it. For each
// block: whether its innermost loop is vectorized, and how many
// iterations of its innermost serial loops are unrolled (0, 16, 64 or
// 256: loops are unrolled from the inside out while the product of their
// extents stays within it). A primitive that refuses (a reduction loop
// cannot be parallel or vectorized) leaves the loop as it was.
type parallelVectorizeUnroll struct{}

var unrollSteps = []int64{0, 16, 64, 256}

func init() { Register(parallelVectorizeUnroll{}, "cpu") }

func (parallelVectorizeUnroll) Name() string { return "parallel_vectorize_unroll" }
func (parallelVectorizeUnroll) Order() int   { return 90 }

func (parallelVectorizeUnroll) Apply(c *Context, s *schedule.Schedule) error {
	names := blockNames(s.Func())
	done := map[*ir.Var]bool{}
	for _, name := range names {
		b, err := s.GetBlock(name)
		if err != nil {
			continue
		}
		loops, err := s.GetLoops(b)
		if err != nil || len(loops) == 0 {
			continue
		}
		outer := loops[0]
		if done[outer.Var()] {
			continue
		}
		done[outer.Var()] = true
		nest := perfectPrefix(s, loops)
		n := 2
		if len(nest) > 1 {
			n = 3
		}
		p, err := c.Sampler.Choose(s, fmt.Sprintf("parallel/%s", name), n, nil)
		if err != nil {
			return err
		}
		switch p {
		case 1:
			_ = s.Parallel(outer)
		case 2:
			if f, err := s.Fuse(nest[0], nest[1]); err == nil {
				_ = s.Parallel(f)
			}
		}
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
