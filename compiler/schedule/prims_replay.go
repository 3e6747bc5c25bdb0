package schedule

// applyMore replays the primitives of this file's siblings that take
// more than handles, names and numbers.
func (r *replayer) applyMore(a *args) (func() (any, error), bool) {
	s := r.s
	switch a.prim {
	case "reverse_compute_inline":
		return func() (any, error) {
			b, err := r.block(a, 0, "block")
			if err != nil {
				return nil, err
			}
			return nil, s.ReverseComputeInline(b)
		}, true
	}
	return nil, false
}
