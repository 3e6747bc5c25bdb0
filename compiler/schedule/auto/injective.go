package auto

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// The generic CPU rule, for functions no matmul or convolution rule
// took: the glue between the heavy kernels (bias adds, normalizations,
// reshapes, transposes, slices, softmax, reductions).
//
//   - Cheap intermediates are inlined: a spatial block whose value is
//     loads and arithmetic (no math call such as exp or sqrt, which
//     would be computed again by every reader) and whose readers are
//     all spatial (not a reduction, which would compute it again at
//     every step) and read it without dividing indices (not a reshape
//     of it) is substituted into them, so a chain of elementwise steps
//     is one pass over memory with no intermediate buffer.
//   - Each remaining spatial block has its innermost loop split into
//     vectors (when the vector's lanes divide it) and vectorized; its
//     stores are contiguous there, being the output's last axis.
//   - Row reductions (a sum or maximum along the innermost loop) keep
//     a vector of partial results over the row and combine its lanes
//     at the end (reduction_cpu.go).
//   - A block whose work (iterations, reductions included) reaches
//     genericParallelFactor × Options.ParallelFlops runs in parallel
//     over its outer spatial loops, fused into one.
//
// It only touches functions whose every block is unscheduled (each loop
// serial and binding one iteration variable, in order), so functions a
// tuning database scheduled, and functions it already scheduled, are
// left as they are.

// genericParallelFactor scales Options.ParallelFlops for the generic
// rule: its loop nests do little arithmetic per element, so a fork/join
// (and, on a loaded machine, waiting for the slower thread) pays off only
// on more work than a matmul's. Measured on mobilenet_v2's depthwise
// convolutions (0.7 to 3.6 million multiply-adds), two threads were
// slower than one on a machine shared with other work.
const genericParallelFactor = 4

// parallelChunks is the number of iterations a parallel loop is given
// (by fusing outer loops) so that two or more threads share it evenly.
const parallelChunks = 16

// scheduleGeneric applies the generic rule to f and reports whether it
// changed anything.
func scheduleGeneric(f *ir.PrimFunc, opts Options) (*scheduled, bool, error) {
	// The rule applies where its own picks change the function; then it
	// applies whatever is chosen.
	if opts.Decide != nil {
		d := opts
		d.Decide = nil
		if _, ok, err := genericRule(f, d); err != nil || !ok {
			return nil, ok, err
		}
		g, _, err := genericRule(f, opts)
		return g, err == nil, err
	}
	return genericRule(f, opts)
}

// genericRule is scheduleGeneric with opts's choices.
func genericRule(f *ir.PrimFunc, opts Options) (*scheduled, bool, error) {
	blocks := topBlocks(f)
	if len(blocks) == 0 {
		return nil, false, nil
	}
	for _, br := range blocks {
		if !unscheduled(f, br) {
			return nil, false, nil
		}
	}
	s, err := schedule.New(f)
	if err != nil {
		return nil, false, err
	}
	changed, asked := false, false
	// A loop nest's schedule is kept where it asked for a choice (to keep
	// the choice in the trace) even when it changed nothing.
	opts.Decide = &noting{d: opts.Decide, asked: &asked}
	for _, br := range blocks[:len(blocks)-1] {
		if !isSpatial(br.Block) || !cheap(br.Block.Body) || !inlinable(s.Func(), br) {
			continue
		}
		inline, err := opts.chooseBool(s, RuleGeneric+"/"+br.Block.Name+"/inline", true)
		if err != nil {
			return nil, false, err
		}
		if !inline {
			continue
		}
		// A refusal (the block writes a parameter, or is not one to one)
		// leaves the schedule as it was.
		c := s.Copy()
		b, err := c.GetBlock(br.Block.Name)
		if err != nil {
			return nil, false, err
		}
		if c.ComputeInline(b) == nil {
			s, changed = c, true
		}
	}
	for _, br := range topBlocks(s.Func()) {
		c := s.Copy()
		asked = false
		ok, err := loopNest(c, br, opts)
		if err != nil {
			return nil, false, fmt.Errorf("block %q: %w", br.Block.Name, err)
		}
		if ok || asked {
			s, changed = c, changed || ok
		}
	}
	rows, err := vectorRowsOn(s, opts, RuleGeneric)
	if err != nil {
		return nil, false, err
	}
	return done(s), changed || rows > 0, nil
}

// unscheduled reports a block directly under serial loops of constant
// extent, one per iteration variable in order, each binding its
// variable, with the spatial variables first.
func unscheduled(f *ir.PrimFunc, br *ir.BlockRealize) bool {
	b := br.Block
	if len(br.IterValues) != len(b.IterVars) || !isTrue(br.Predicate) || len(b.IterVars) == 0 {
		return false
	}
	reduce := false
	for i, iv := range b.IterVars {
		switch iv.Kind {
		case ir.IterSpatial:
			if reduce {
				return false
			}
		case ir.IterReduce:
			reduce = true
		default:
			return false
		}
		v, ok := br.IterValues[i].(*ir.Var)
		if !ok {
			return false
		}
		if _, ok := loopExtent(f, v); !ok {
			return false
		}
	}
	// Every loop above the block binds one of its variables, in order.
	var loops []*ir.For
	ir.Visit(f.Body, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.For:
			if containsBlock(n, br) {
				loops = append(loops, n)
				return true
			}
			return false
		case *ir.BlockRealize:
			return n != br
		}
		return true
	})
	if len(loops) != len(b.IterVars) {
		return false
	}
	for i, l := range loops {
		if l.Kind != ir.ForSerial || l.Var != br.IterValues[i] {
			return false
		}
	}
	return true
}

func containsBlock(n ir.Node, br *ir.BlockRealize) bool {
	found := false
	ir.Visit(n, func(m ir.Node) bool {
		if m == br {
			found = true
		}
		return !found
	})
	return found
}

// inlinable reports whether br may be inlined into its readers: every
// block of f that reads what br writes is spatial (inlined into a
// reduction, a producer such as a padding would be computed again at
// every step of it) and reads it at indices without division or modulo
// (a reshape's reads: inlined there, a transpose's gather would need a
// division per element and no longer vectorize).
func inlinable(f *ir.PrimFunc, br *ir.BlockRealize) bool {
	st, ok := br.Block.Body.(*ir.BufferStore)
	if !ok {
		return false
	}
	for _, r := range topBlocks(f) {
		if r.Block.Name == br.Block.Name {
			continue
		}
		ok := true
		ir.Visit(r.Block, func(n ir.Node) bool {
			if l, isLoad := n.(*ir.BufferLoad); isLoad && l.Buffer.Data == st.Buffer.Data {
				ok = isSpatial(r.Block) && !divides(l.Indices)
			}
			return ok
		})
		if !ok {
			return false
		}
	}
	return true
}

// divides reports an index that divides or takes a remainder.
func divides(idx []ir.Expr) bool {
	found := false
	for _, e := range idx {
		ir.Visit(e, func(n ir.Node) bool {
			if b, ok := n.(*ir.Binary); ok {
				switch b.Op {
				case ir.OpDiv, ir.OpMod, ir.OpFloorDiv, ir.OpFloorMod:
					found = true
				}
			}
			return !found
		})
	}
	return found
}

// cheap reports a block body that computes with loads, arithmetic,
// casts and selects only.
func cheap(body ir.Stmt) bool {
	ok := true
	ir.Visit(body, func(n ir.Node) bool {
		if _, call := n.(*ir.Call); call {
			ok = false
		}
		return ok
	})
	return ok
}

// loopNest vectorizes and parallelizes the loops of one block (see the
// rule above) and reports whether it changed them.
func loopNest(s *schedule.Schedule, br *ir.BlockRealize, opts Options) (bool, error) {
	b, err := s.GetBlock(br.Block.Name)
	if err != nil {
		return false, err
	}
	loops, err := s.GetLoops(b)
	if err != nil {
		return false, err
	}
	n := len(loops)
	exts := make([]int64, n)
	work := int64(1)
	spatial := 0
	for i, iv := range br.Block.IterVars {
		e, ok := ir.IsConstInt(iv.Dom.Extent)
		if !ok || e < 1 || n != len(br.Block.IterVars) {
			return false, nil
		}
		exts[i], work = e, work*e
		if iv.Kind == ir.IterSpatial {
			spatial++
		}
	}
	changed := false
	site := func(what string) string { return RuleGeneric + "/" + br.Block.Name + "/" + what }
	outer, outerExts := loops[:spatial], exts[:spatial]
	if spatial == n {
		st, ok := br.Block.Body.(*ir.BufferStore)
		size := int64(0)
		if ok {
			size = int64(st.Buffer.DType.Size())
		}
		lanes, err := chooseLanes(s, site("vector"), exts[n-1], size, opts)
		if err != nil {
			return false, err
		}
		if lanes > 1 {
			parts, err := s.Split(loops[n-1], -1, lanes)
			if err != nil {
				return false, err
			}
			if err := s.Vectorize(parts[1]); err != nil {
				return false, err
			}
			outer = append(append([]schedule.LoopRV{}, loops[:n-1]...), parts[0])
			outerExts = append(append([]int64{}, exts[:n-1]...), exts[n-1]/lanes)
			changed = true
		} else if n > 1 {
			outer, outerExts = loops[:n-1], exts[:n-1]
		}
	}
	if opts.ParallelFlops > 0 && len(outer) > 0 {
		// The fewest outer loops that make enough chunks for the threads
		// to balance (the rule's own pick); the loops inside stay as they
		// are (plain indices, contiguous runs). Any number of them may be
		// chosen, or none.
		k, chunks := 0, int64(1)
		for k < len(outer) && chunks < parallelChunks {
			chunks *= outerExts[k]
			k++
		}
		if work < genericParallelFactor*opts.ParallelFlops {
			k = 0
		}
		k64, err := opts.choose(s, site("parallel"), upTo0(int64(len(outer))), int64(k))
		if err != nil || k64 == 0 {
			return changed, err
		}
		k = int(k64)
		par := outer[0]
		if k > 1 {
			if par, err = s.Fuse(outer[:k]...); err != nil {
				return false, err
			}
		}
		if ext := parallelExtent(s, par); ext >= 2 {
			if err := s.Parallel(par); err != nil {
				return false, err
			}
			changed = true
		}
	}
	return changed, nil
}

// upTo0 lists 0 to n.
func upTo0(n int64) []int64 { return append([]int64{0}, upTo(n)...) }

// chooseLanes chooses the lanes of the vectors a loop of extent ext over
// elements of size bytes is split into: the vector's (the rule's own
// pick, where they divide ext), fewer (a power of two dividing ext), or
// none (1: the loop stays scalar).
func chooseLanes(s *schedule.Schedule, site string, ext, size int64, opts Options) (int64, error) {
	if size <= 0 {
		return 1, nil
	}
	lanes := opts.VectorBytes / size
	cands := []int64{1}
	for l := lanes; l >= 2; l /= 2 {
		if ext%l == 0 {
			cands = append(cands, l)
		}
	}
	def := int64(1)
	if lanes > 1 && ext%lanes == 0 {
		def = lanes
	}
	return opts.choose(s, site, cands, def)
}

// noting is a Decider that passes each choice on to d (the default one
// when nil) and notes in asked that one was made.
type noting struct {
	d     Decider
	asked *bool
}

func (n *noting) Choose(s *schedule.Schedule, site string, cands []int64, def int) (int64, error) {
	*n.asked = true
	d := n.d
	if d == nil {
		d = DefaultDecider{}
	}
	return d.Choose(s, site, cands, def)
}

// parallelExtent is loop l's constant extent (0 when unknown).
func parallelExtent(s *schedule.Schedule, l schedule.LoopRV) int64 {
	f, err := s.LoopFor(l)
	if err != nil {
		return 0
	}
	e, _ := ir.IsConstInt(f.Extent)
	return e
}
