package rules

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// randomComputeLocation moves blocks that produce an intermediate buffer
// under a loop of their first consumer (MetaSchedule's
// RandomComputeLocation): the choice is the root (where the block is) or
// one of the consumer's outermost loops (at most maxLocations) that each
// move the part of the buffer the consumer reads (under a loop that does
// not, the producer would compute the same elements again on each of its
// iterations: a row's maximum once per element of the row), and
// compute_at decides whether the move is legal; a refused move leaves the
// block at the root, which a replay reproduces. Only blocks at the root
// whose loops nobody transformed are moved. Blocks are visited consumers
// first (MetaSchedule's post-order): a chain of stages (a softmax's
// maximum, exponentials and sum) can then follow its last consumer under
// one row loop, each producer moving under the loop its consumer moved
// to.
type randomComputeLocation struct{}

const maxLocations = 4

func init() { Register(randomComputeLocation{}, "cpu") }

func (randomComputeLocation) Name() string { return "random_compute_location" }
func (randomComputeLocation) Order() int   { return 30 }

func (randomComputeLocation) Apply(c *Context, s *schedule.Schedule) error {
	names := blockNames(s.Func())
	slices.Reverse(names)
	for _, name := range names {
		b, err := s.GetBlock(name)
		if err != nil {
			continue
		}
		br, err := s.BlockRealize(b)
		if err != nil || len(br.Block.Writes) != 1 || isParamBuffer(s.Func(), br.Block.Writes[0].Buffer) {
			continue
		}
		if _, _, _, ok := loopKinds(s, b); !ok {
			continue
		}
		consumer, ok := firstReader(s, name, br.Block.Writes[0].Buffer)
		if !ok {
			continue
		}
		cb, err := s.GetBlock(consumer)
		if err != nil {
			continue
		}
		loops, err := s.GetLoops(cb)
		if err != nil {
			continue
		}
		cbr, err := s.BlockRealize(cb)
		if err != nil {
			continue
		}
		loops = movingPrefix(cbr, loops, br.Block.Writes[0].Buffer)
		if len(loops) == 0 {
			continue
		}
		loops = loops[:min(len(loops), maxLocations)]
		at, err := c.Sampler.Choose(s, fmt.Sprintf("compute_location/%s", name), len(loops)+1, nil)
		if err != nil {
			return err
		}
		if at > 0 {
			// A refusal keeps the block at the root.
			_ = s.ComputeAt(b, loops[at-1])
		}
	}
	return nil
}

// movingPrefix returns the outermost of loops (the consumer's, around
// cbr) as long as each one binds an iteration variable that indexes the
// consumer's reads of buf.
func movingPrefix(cbr *ir.BlockRealize, loops []schedule.LoopRV, buf *ir.Buffer) []schedule.LoopRV {
	indexing := map[*ir.Var]bool{}
	for _, r := range cbr.Block.Reads {
		if r.Buffer != buf {
			continue
		}
		for _, rg := range r.Region {
			for _, iv := range cbr.Block.IterVars {
				if usesVar(rg.Min, iv.Var) {
					indexing[iv.Var] = true
				}
			}
		}
	}
	for i, l := range loops {
		moves := false
		for k, iv := range cbr.Block.IterVars {
			moves = moves || indexing[iv.Var] && k < len(cbr.IterValues) && usesVar(cbr.IterValues[k], l.Var())
		}
		if !moves {
			return loops[:i]
		}
	}
	return loops
}

// firstReader returns the first block after producer that reads buf.
func firstReader(s *schedule.Schedule, producer string, buf *ir.Buffer) (string, bool) {
	after := false
	found := ""
	ir.Visit(s.Func().Body, func(n ir.Node) bool {
		b, ok := n.(*ir.Block)
		if !ok || found != "" {
			return found == ""
		}
		if b.Name == producer {
			after = true
			return true
		}
		if after {
			for _, r := range b.Reads {
				if r.Buffer == buf {
					found = b.Name
				}
			}
		}
		return true
	})
	return found, found != ""
}
