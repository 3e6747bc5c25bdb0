package schedule

import "fmt"

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
	case "blockize":
		return func() (any, error) {
			l, err := r.loop(a, 0, "target")
			if err != nil {
				return nil, err
			}
			return s.Blockize(l)
		}, true
	case "tensorize":
		return func() (any, error) {
			l, err := r.loop(a, 0, "block_or_loop")
			if err != nil {
				return nil, err
			}
			name, err := a.str(1, "tensor_intrin")
			if err != nil {
				return nil, err
			}
			return nil, s.Tensorize(l, name)
		}, true
	case "pad_einsum":
		return func() (any, error) {
			b, err := r.block(a, 0, "block")
			if err != nil {
				return nil, err
			}
			p, err := a.ints(1, "padding", false)
			if err != nil {
				return nil, err
			}
			return nil, s.PadEinsum(b, p)
		}, true
	case "transform_layout":
		return func() (any, error) {
			b, err := r.block(a, 0, "block")
			if err != nil {
				return nil, err
			}
			bi, err := a.bufferIndex(1, "buffer")
			if err != nil {
				return nil, err
			}
			v, err := a.get(2, "index_map")
			if err != nil {
				return nil, err
			}
			if v.kind != 'm' {
				return nil, fmt.Errorf("transform_layout: index_map is %s, want a lambda", v.describe())
			}
			pad, err := a.optFloat(3, "pad_value")
			if err != nil {
				return nil, err
			}
			return nil, s.TransformLayout(b, bi, v.index, pad)
		}, true
	}
	return nil, false
}

// bufferIndex reads ("read", i) or ("write", i).
func (a *args) bufferIndex(i int, name string) (BufferIndex, error) {
	v, err := a.get(i, name)
	if err != nil {
		return BufferIndex{}, err
	}
	if v.kind != 'l' || len(v.list) != 2 || v.list[0].kind != 's' || v.list[1].kind != 'i' || v.list[0].str != "read" && v.list[0].str != "write" {
		return BufferIndex{}, fmt.Errorf("%s: %s is %s, want (\"read\", i) or (\"write\", i)", a.prim, name, v.describe())
	}
	return BufferIndex{Write: v.list[0].str == "write", Index: int(v.list[1].num)}, nil
}

// optFloat reads a number or None; absent is None.
func (a *args) optFloat(i int, name string) (*float64, error) {
	if !a.has(i, name) {
		return nil, nil
	}
	v, _ := a.get(i, name)
	switch v.kind {
	case '0':
		return nil, nil
	case 'i':
		f := float64(v.num)
		return &f, nil
	case 'f':
		return &v.flt, nil
	}
	return nil, fmt.Errorf("%s: %s is %s, want a number or None", a.prim, name, v.describe())
}
