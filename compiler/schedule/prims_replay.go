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
	case "set_scope":
		return func() (any, error) {
			b, err := r.block(a, 0, "block")
			if err != nil {
				return nil, err
			}
			i, err := a.int(1, "buffer_index")
			if err != nil {
				return nil, err
			}
			scope, err := a.str(2, "storage_scope")
			if err != nil {
				return nil, err
			}
			return nil, s.SetScope(b, int(i), scope)
		}, true
	case "storage_align":
		return func() (any, error) {
			b, err := r.block(a, 0, "block")
			if err != nil {
				return nil, err
			}
			var n [4]int64
			for i, name := range []string{"buffer_index", "axis", "factor", "offset"} {
				if n[i], err = a.int(i+1, name); err != nil {
					return nil, err
				}
			}
			return nil, s.StorageAlign(b, int(n[0]), int(n[1]), n[2], n[3])
		}, true
	case "rfactor":
		return func() (any, error) {
			l, err := r.loop(a, 0, "loop")
			if err != nil {
				return nil, err
			}
			fa, err := a.int(1, "factor_axis")
			if err != nil {
				return nil, err
			}
			return s.RFactor(l, int(fa))
		}, true
	}
	return nil, false
}
