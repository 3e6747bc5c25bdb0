package rules

import (
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// autoInline inlines injective producers into their consumers
// (MetaSchedule's AutoInline): a block that is not a reduction, whose
// iteration variables are all spatial, that writes one buffer which is
// not a parameter of the function. compute_inline decides whether the
// inlining is legal; a block it refuses stays where it is. A producer
// that calls a math function (exp, sqrt…) and is read by more than one
// block or by a reduction is inlined by choice: inlined, every reader
// computes it again (a softmax's exp, once for the sum and once for the
// quotient); kept, it is computed once and stored. Cheap producers are
// always inlined.
type autoInline struct{}

func init() { Register(autoInline{}, "cpu", "cuda") }

func (autoInline) Name() string { return "auto_inline" }
func (autoInline) Order() int   { return 10 }

func (autoInline) Apply(c *Context, s *schedule.Schedule) error {
	for _, name := range blockNames(s.Func()) {
		b, err := s.GetBlock(name)
		if err != nil {
			continue
		}
		br, err := s.BlockRealize(b)
		if err != nil || !injective(s.Func(), br.Block) {
			continue
		}
		if costly(br.Block) && recomputed(s.Func(), br.Block) {
			// Before this choice existed such producers were inlined.
			keep, err := c.Sampler.ChooseOr(s, "inline/"+name, 2, nil, 0)
			if err != nil {
				return err
			}
			if keep == 1 {
				continue
			}
		}
		// A refusal (the block has no consumer to inline into, or one
		// that reads it in a way compute_inline cannot rewrite) leaves
		// the schedule as it was.
		_ = s.ComputeInline(b)
	}
	return nil
}

// injective reports whether b is a spatial, non-reduction block writing a
// single intermediate buffer.
func injective(f *ir.PrimFunc, b *ir.Block) bool {
	if b.Init != nil || len(b.Writes) != 1 || isParamBuffer(f, b.Writes[0].Buffer) {
		return false
	}
	for _, iv := range b.IterVars {
		if iv.Kind != ir.IterSpatial {
			return false
		}
	}
	_, store := b.Body.(*ir.BufferStore)
	return store
}

// costly reports whether b's value calls a math function (exp, sqrt,
// tanh…), which costs more than the loads and arithmetic around it;
// rounding and absolute values are cheap.
func costly(b *ir.Block) bool {
	found := false
	ir.Visit(b.Body, func(n ir.Node) bool {
		if c, ok := n.(*ir.Call); ok {
			_, math := ir.Intrinsics[c.Op]
			found = math && !cheapIntrinsic[c.Op]
		}
		return !found
	})
	return found
}

var cheapIntrinsic = map[string]bool{"floor": true, "ceil": true, "round": true, "trunc": true, "nearbyint": true, "fabs": true, "abs": true, "copysign": true}

// recomputed reports whether inlining b would compute its value more than
// once per element: more than one block reads its buffer, or a reduction
// does.
func recomputed(f *ir.PrimFunc, b *ir.Block) bool {
	buf := b.Writes[0].Buffer
	readers, reduction := 0, false
	ir.Visit(f.Body, func(n ir.Node) bool {
		r, ok := n.(*ir.Block)
		if !ok || r == b {
			return true
		}
		for _, rd := range r.Reads {
			if rd.Buffer == buf {
				readers++
				reduction = reduction || r.Init != nil
				break
			}
		}
		return true
	})
	return readers > 1 || reduction
}
