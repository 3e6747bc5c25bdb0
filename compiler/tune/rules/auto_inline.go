package rules

import (
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// autoInline inlines injective producers into their consumers
// (MetaSchedule's AutoInline): a block that is not a reduction, whose
// iteration variables are all spatial, that writes one buffer which is
// not a parameter of the function. compute_inline decides whether the
// inlining is legal; a block it refuses stays where it is. It makes no
// choices.
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
