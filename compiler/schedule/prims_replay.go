package schedule

// applyMore replays the primitives of this file's siblings that take
// more than handles, names and numbers.
func (r *replayer) applyMore(a *args) (func() (any, error), bool) {
	return nil, false
}
