package auto

import (
	"errors"
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// GPUOptions tune the default GPU schedules.
type GPUOptions struct {
	// ThreadsPerBlock is the block size of the fallback rule; 0 means 256.
	ThreadsPerBlock int64
}

// GPUFunc gives f a GPU schedule with the fallback rule (DLight's
// Fallback): the one block of f that has loops gets its spatial loops
// fused and split into blockIdx.x and threadIdx.x (a predicate guards the
// tail when the block size does not divide the extent); its reduction
// loops stay serial inside each thread. It returns an error naming the
// block when the rule does not apply: a function with several blocks
// (each would be its own kernel launch) or with reduction loops outside
// the spatial ones.
func GPUFunc(f *ir.PrimFunc, opts GPUOptions) (*ir.PrimFunc, error) {
	if opts.ThreadsPerBlock <= 0 {
		opts.ThreadsPerBlock = 256
	}
	s, err := schedule.New(f)
	if err != nil {
		return nil, err
	}
	var blocks []*ir.BlockRealize
	ir.Visit(f.Body, func(n ir.Node) bool {
		if br, ok := n.(*ir.BlockRealize); ok && br.Block != ir.RootBlock(f.Body) {
			blocks = append(blocks, br)
			return false
		}
		return true
	})
	switch {
	case len(blocks) == 0:
		return nil, errors.New("gpu schedule: the function has no block to schedule")
	case len(blocks) > 1:
		return nil, fmt.Errorf("gpu schedule: the function has %d blocks (%q, %q…); the fallback rule schedules one kernel per function", len(blocks), blocks[0].Block.Name, blocks[1].Block.Name)
	}
	br := blocks[0]
	b, err := s.GetBlock(br.Block.Name)
	if err != nil {
		return nil, err
	}
	loops, err := s.GetLoops(b)
	if err != nil {
		return nil, err
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
			return nil, fmt.Errorf("gpu schedule: block %q: spatial loop %q is inside a reduction loop", br.Block.Name, l.Var().Name)
		}
	}
	if len(spatial) == 0 {
		return nil, fmt.Errorf("gpu schedule: block %q has no spatial loop to bind to threads", br.Block.Name)
	}
	fused := spatial[0]
	if len(spatial) > 1 {
		if fused, err = s.Fuse(spatial...); err != nil {
			return nil, fmt.Errorf("gpu schedule: block %q: %w", br.Block.Name, err)
		}
	}
	threads := opts.ThreadsPerBlock
	if e, ok := loopExtent(s.Func(), fused.Var()); ok && e < threads {
		threads = e
	}
	split, err := s.Split(fused, -1, threads)
	if err != nil {
		return nil, fmt.Errorf("gpu schedule: block %q: %w", br.Block.Name, err)
	}
	if err := s.Bind(split[0], "blockIdx.x"); err != nil {
		return nil, fmt.Errorf("gpu schedule: block %q: %w", br.Block.Name, err)
	}
	if err := s.Bind(split[1], "threadIdx.x"); err != nil {
		return nil, fmt.Errorf("gpu schedule: block %q: %w", br.Block.Name, err)
	}
	return s.Func(), nil
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
