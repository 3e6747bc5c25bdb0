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

// GPUFunc gives f a GPU schedule: a function that is one sum over a
// reduction loop of at least 64 (a GEMV, a row sum) gets the cross-thread
// rule (see rowReduction); a function of row reductions and elementwise
// blocks over the same rows (softmax, layer norm) gets one block of threads
// per row (see rowPipeline); otherwise spatial producers that can be inlined
// into their consumers are; a first remaining block that is a 2-D matmul
// of float16 or bfloat16 operands whose sizes tensor cores tile gets the
// tensor-core rule (ptx_mma m16n8k16 on warp tiles staged through shared
// memory, see mmaMatmulRule) when the blocks after it are elementwise
// epilogues; another 2-D matmul large enough for 64 threads gets the
// shared-memory matmul rule (tiles of
// A and B staged in shared memory, register tiles of up to 4×4 per
// thread, 16×16 threads per block, see sharedMatmul) when the blocks after
// it are elementwise epilogues, else the register-only matmul rule (see
// bindMatmul); otherwise
// the fallback rule (DLight's Fallback): the block gets its spatial loops fused and split
// into blockIdx.x and threadIdx.x (a predicate guards the tail when the
// block size does not divide the extent), its reduction loops stay serial
// inside each thread; every later block (an epilogue such as a bias add
// after a matmul) is moved under that block's threadIdx.x loop, so each
// thread finishes the elements it computed and the intermediate buffer
// becomes private to the thread. It returns an error naming the block when
// the rule does not apply: a later block that reads more of the
// intermediate than its thread produced (a reduction over it), or
// reduction loops outside the spatial ones.
func GPUFunc(f *ir.PrimFunc, opts GPUOptions) (*ir.PrimFunc, error) {
	if opts.ThreadsPerBlock <= 0 {
		opts.ThreadsPerBlock = 256
	}
	if g := rowReduction(f); g != nil {
		return g, nil
	}
	if g := rowPipeline(f); g != nil {
		return g, nil
	}
	s, err := schedule.New(f)
	if err != nil {
		return nil, err
	}
	blocks := topBlocks(s.Func())
	if len(blocks) == 0 {
		return nil, errors.New("gpu schedule: the function has no block to schedule")
	}
	if len(blocks) > 1 {
		for _, br := range blocks[:len(blocks)-1] {
			if !isSpatial(br.Block) {
				continue
			}
			c := s.Copy()
			b, err := c.GetBlock(br.Block.Name)
			if err != nil {
				return nil, err
			}
			if c.ComputeInline(b) == nil {
				s = c
			}
		}
		blocks = topBlocks(s.Func())
	}
	if g := mmaMatmulRule(s.Func(), blocks); g != nil {
		return g, nil
	}
	if g := sharedMatmul(s.Func(), blocks); g != nil {
		return g, nil
	}
	thread, matmul, err := bindMatmul(s, blocks[0])
	if err != nil {
		return nil, fmt.Errorf("gpu schedule: matmul %q: %w", blocks[0].Block.Name, err)
	}
	if !matmul {
		if thread, err = bindFallback(s, blocks[0], opts); err != nil {
			return nil, err
		}
	}
	for _, br := range blocks[1:] {
		b, err := s.GetBlock(br.Block.Name)
		if err != nil {
			return nil, err
		}
		if err := s.ReverseComputeAt(b, thread); err != nil {
			return nil, fmt.Errorf("gpu schedule: block %q cannot run in the threads of block %q (one kernel per function): %w", br.Block.Name, blocks[0].Block.Name, err)
		}
	}
	return s.Func(), nil
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
			return none, fmt.Errorf("gpu schedule: block %q: spatial loop %q is inside a reduction loop", br.Block.Name, l.Var().Name)
		}
	}
	if len(spatial) == 0 {
		return none, fmt.Errorf("gpu schedule: block %q has no spatial loop to bind to threads", br.Block.Name)
	}
	fused := spatial[0]
	if len(spatial) > 1 {
		if fused, err = s.Fuse(spatial...); err != nil {
			return none, fmt.Errorf("gpu schedule: block %q: %w", br.Block.Name, err)
		}
	}
	threads := opts.ThreadsPerBlock
	if e, ok := loopExtent(s.Func(), fused.Var()); ok && e < threads {
		threads = e
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
