package auto

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// GPUOptions tune the default GPU schedules.
type GPUOptions struct {
	// ThreadsPerBlock is the block size of the fallback rule; 0 means 256.
	ThreadsPerBlock int64
	// Decide makes the rules' choices (see Decider); nil takes each
	// rule's own pick, the default schedule.
	Decide Decider
}

// topBlocks lists the blocks of f outside every other block but the root,
// in program order.
func topBlocks(f *ir.PrimFunc) []*ir.BlockRealize {
	var blocks []*ir.BlockRealize
	ir.Visit(f.Body, func(n ir.Node) bool {
		if br, ok := n.(*ir.BlockRealize); ok && br.Block != ir.RootBlock(f.Body) {
			blocks = append(blocks, br)
			return false
		}
		return true
	})
	return blocks
}

// isSpatial reports a block with only spatial iteration variables.
func isSpatial(b *ir.Block) bool {
	for _, iv := range b.IterVars {
		if iv.Kind != ir.IterSpatial {
			return false
		}
	}
	return b.Init == nil
}

// bindFallback fuses the spatial loops of br, splits them into blockIdx.x
// and threadIdx.x and returns the threadIdx.x loop.
func bindFallback(s *schedule.Schedule, br *ir.BlockRealize, opts GPUOptions) (schedule.LoopRV, error) {
	var none schedule.LoopRV
	b, err := s.GetBlock(br.Block.Name)
	if err != nil {
		return none, err
	}
	loops, err := s.GetLoops(b)
	if err != nil {
		return none, err
	}
	reduceVars := map[*ir.Var]bool{}
	for i, iv := range br.Block.IterVars {
		if iv.Kind != ir.IterSpatial {
			ir.Visit(br.IterValues[i], func(n ir.Node) bool {
				if v, ok := n.(*ir.Var); ok {
					reduceVars[v] = true
				}
				return true
			})
		}
	}
	var spatial []schedule.LoopRV
	for _, l := range loops {
		if reduceVars[l.Var()] {
			break
		}
		spatial = append(spatial, l)
	}
	for _, l := range loops[len(spatial):] {
		if !reduceVars[l.Var()] {
			return none, skip("gpu schedule: block %q: spatial loop %q is inside a reduction loop", br.Block.Name, l.Var().Name)
		}
	}
	if len(spatial) == 0 {
		return none, skip("gpu schedule: block %q has no spatial loop to bind to threads", br.Block.Name)
	}
	fused := spatial[0]
	if len(spatial) > 1 {
		if fused, err = s.Fuse(spatial...); err != nil {
			return none, fmt.Errorf("gpu schedule: block %q: %w", br.Block.Name, err)
		}
	}
	threads := opts.ThreadsPerBlock
	if e, ok := loopExtent(s.Func(), fused.Var()); ok {
		if e < threads {
			threads = e
		}
		// Any block size from a warp to the most CUDA allows is valid (a
		// predicate guards the tail); one larger than the extent is not
		// offered.
		cands := []int64{threads}
		for _, t := range gpuPowers(32, gpuMaxThreads) {
			if t < e {
				cands = append(cands, t)
			}
		}
		if threads, err = opts.choose(s, "gpu_fallback/"+br.Block.Name+"/threads", cands, threads); err != nil {
			return none, err
		}
	}
	split, err := s.Split(fused, -1, threads)
	if err != nil {
		return none, fmt.Errorf("gpu schedule: block %q: %w", br.Block.Name, err)
	}
	if err := s.Bind(split[0], "blockIdx.x"); err != nil {
		return none, fmt.Errorf("gpu schedule: block %q: %w", br.Block.Name, err)
	}
	if err := s.Bind(split[1], "threadIdx.x"); err != nil {
		return none, fmt.Errorf("gpu schedule: block %q: %w", br.Block.Name, err)
	}
	return split[1], nil
}

// loopExtent returns the constant extent of the loop over v in f.
func loopExtent(f *ir.PrimFunc, v *ir.Var) (int64, bool) {
	var ext int64
	found := false
	ir.Visit(f.Body, func(n ir.Node) bool {
		if l, ok := n.(*ir.For); ok && l.Var == v {
			ext, found = ir.IsConstInt(l.Extent)
			return false
		}
		return !found
	})
	return ext, found
}

// gpuMaxThreads is the most threads a CUDA block has.
const gpuMaxThreads = 1024

// gpuPowers lists the powers of two from lo to hi.
func gpuPowers(lo, hi int64) []int64 {
	var out []int64
	for p := lo; p <= hi; p *= 2 {
		out = append(out, p)
	}
	return out
}

// gpuDivisors lists the divisors of n up to limit, smallest first.
func gpuDivisors(n, limit int64) []int64 {
	var out []int64
	for d := int64(1); d <= limit && d <= n; d++ {
		if n%d == 0 {
			out = append(out, d)
		}
	}
	return out
}
