package onnx

import (
	"fmt"
	"math"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Shape-manipulating operators. Shapes are static after import, so
// Reshape, Flatten, Squeeze and Unsqueeze all become R.reshape to the
// computed shape, and a known input is computed on the host.

func registerShapeOps() {
	reg("Constant", 7, convertConstant)
	reg("Shape", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		s := x.shape()
		r := int64(len(s))
		start, end := n.attrInt("start", 0), n.attrInt("end", r)
		start, end = clampIndex(start, r), clampIndex(end, r)
		if end < start {
			end = start
		}
		return []*value{constant(intTensor(s[start:end]))}, nil
	})
	reg("Size", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		return []*value{constant(intTensor([]int64{numElements(x.shape())}, []int64{}...))}, nil
	})
	reg("Reshape", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		var target []int64
		if n.opset < 5 {
			target, _ = n.attrInts("shape")
		} else {
			t, err := n.knownInput(1, "shape")
			if err != nil {
				return nil, err
			}
			if t == nil {
				return nil, fmt.Errorf("input 1 (shape) is missing")
			}
			target = t.Ints()
		}
		shape, err := reshapeTarget(x.shape(), target, n.attrInt("allowzero", 0) != 0)
		if err != nil {
			return nil, err
		}
		return ret(im.reshape(x, shape))
	})
	reg("Flatten", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		s := x.shape()
		axis := n.attrInt("axis", 1)
		if axis < 0 {
			axis += int64(len(s))
		}
		if axis < 0 || axis > int64(len(s)) {
			return nil, fmt.Errorf("axis %d is out of range for rank %d", n.attrInt("axis", 1), len(s))
		}
		return ret(im.reshape(x, []int64{numElements(s[:axis]), numElements(s[axis:])}))
	})
	reg("Squeeze", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		axes, has, err := axesOf(n, 13, 1)
		if err != nil {
			return nil, err
		}
		s := x.shape()
		drop := map[int]bool{}
		if has {
			ax, err := normAxes(axes, len(s))
			if err != nil {
				return nil, err
			}
			for _, a := range ax {
				if s[a] != 1 {
					return nil, fmt.Errorf("cannot squeeze axis %d of size %d", a, s[a])
				}
				drop[a] = true
			}
		} else {
			for i, d := range s {
				if d == 1 {
					drop[i] = true
				}
			}
		}
		var out []int64
		for i, d := range s {
			if !drop[i] {
				out = append(out, d)
			}
		}
		return ret(im.reshape(x, out))
	})
	reg("Unsqueeze", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		axes, has, err := axesOf(n, 13, 1)
		if err != nil {
			return nil, err
		}
		if !has {
			return nil, fmt.Errorf("axes are missing")
		}
		s := x.shape()
		rank := len(s) + len(axes)
		ax, err := normAxes(axes, rank)
		if err != nil {
			return nil, err
		}
		out := make([]int64, 0, rank)
		k := 0
		for i := range rank {
			if slices.Contains(ax, i) {
				out = append(out, 1)
			} else {
				out = append(out, s[k])
				k++
			}
		}
		return ret(im.reshape(x, out))
	})
	reg("Transpose", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		r := x.rank()
		perm, ok := n.attrInts("perm")
		if !ok {
			for i := r - 1; i >= 0; i-- {
				perm = append(perm, int64(i))
			}
		}
		p, err := normAxes(perm, r)
		if err != nil || len(p) != r {
			return nil, fmt.Errorf("perm %v is not a permutation of %d axes", perm, r)
		}
		if x.known() && x.c.NumElements() <= foldLimit {
			return []*value{constant(hostTranspose(x.c, p))}, nil
		}
		return ret(im.emit("relax.permute_dims", map[string]any{"axes": anyInts(p)}, x))
	})
	reg("Concat", 7, func(im *importer, n *node) ([]*value, error) {
		if len(n.in) == 0 {
			return nil, fmt.Errorf("no inputs")
		}
		first, err := n.need(0)
		if err != nil {
			return nil, err
		}
		axis, err := normAxis(n.attrInt("axis", 0), first.rank())
		if err != nil {
			return nil, err
		}
		allKnown := true
		var parts []*value
		for i := range n.in {
			v, err := n.need(i)
			if err != nil {
				return nil, err
			}
			if v.rank() != first.rank() {
				return nil, fmt.Errorf("input %d has rank %d, input 0 has %d", i, v.rank(), first.rank())
			}
			if numElements(v.shape()) == 0 {
				continue
			}
			allKnown = allKnown && v.known()
			parts = append(parts, v)
		}
		if len(parts) == 0 {
			return []*value{first}, nil
		}
		if allKnown {
			ts := make([]*Tensor, len(parts))
			for i, p := range parts {
				ts[i] = p.c
			}
			if t := hostConcat(ts, axis); t.NumElements() <= foldLimit {
				return []*value{constant(t)}, nil
			}
		}
		if len(parts) == 1 {
			return parts, nil
		}
		return ret(im.concat(parts, axis))
	})
	reg("Split", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		s := x.shape()
		axis, err := normAxis(n.attrInt("axis", 0), len(s))
		if err != nil {
			return nil, err
		}
		outs := len(n.p.GetOutput())
		var sizes []int64
		if n.opset < 13 {
			sizes, _ = n.attrInts("split")
		} else if t, err := n.knownInput(1, "split"); err != nil {
			return nil, err
		} else if t != nil {
			sizes = t.Ints()
		}
		if sizes == nil {
			if k, ok := n.attrs["num_outputs"]; ok {
				outs = int(k.GetI())
			}
			if outs <= 0 {
				return nil, fmt.Errorf("no outputs")
			}
			chunk := (s[axis] + int64(outs) - 1) / int64(outs)
			for rest := s[axis]; rest > 0 || len(sizes) < outs; rest -= chunk {
				sizes = append(sizes, max(min(chunk, rest), 0))
			}
		}
		var sum int64
		for _, v := range sizes {
			sum += v
		}
		if sum != s[axis] || len(sizes) != len(n.p.GetOutput()) {
			return nil, fmt.Errorf("split sizes %v do not divide axis %d of size %d into %d outputs", sizes, axis, s[axis], len(n.p.GetOutput()))
		}
		var res []*value
		begin := int64(0)
		for _, sz := range sizes {
			v, err := im.slice(x, []int{axis}, []int64{begin}, []int64{begin + sz}, []int64{1})
			if err != nil {
				return nil, err
			}
			res = append(res, v)
			begin += sz
		}
		return res, nil
	})
	reg("Slice", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		s := x.shape()
		var starts, ends, axes, steps []int64
		if n.opset < 10 {
			starts, _ = n.attrInts("starts")
			ends, _ = n.attrInts("ends")
			axes, _ = n.attrInts("axes")
		} else {
			lists := []*[]int64{&starts, &ends, &axes, &steps}
			for i, what := range []string{"starts", "ends", "axes", "steps"} {
				t, err := n.knownInput(i+1, what)
				if err != nil {
					return nil, err
				}
				if t != nil {
					*lists[i] = t.Ints()
				}
			}
		}
		if axes == nil {
			for i := range starts {
				axes = append(axes, int64(i))
			}
		}
		if steps == nil {
			steps = make([]int64, len(starts))
			for i := range steps {
				steps[i] = 1
			}
		}
		if len(ends) != len(starts) || len(axes) != len(starts) || len(steps) != len(starts) {
			return nil, fmt.Errorf("starts, ends, axes and steps differ in length")
		}
		ax, err := normAxes(axes, len(s))
		if err != nil {
			return nil, err
		}
		b, e := make([]int64, len(ax)), make([]int64, len(ax))
		for i, a := range ax {
			if steps[i] == 0 {
				return nil, fmt.Errorf("step 0 on axis %d", a)
			}
			b[i], e[i] = sliceBounds(starts[i], ends[i], steps[i], s[a])
		}
		return ret(im.slice(x, ax, b, e, steps))
	})
	reg("Gather", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		idx, err := n.need(1)
		if err != nil {
			return nil, err
		}
		axis, err := normAxis(n.attrInt("axis", 0), x.rank())
		if err != nil {
			return nil, err
		}
		if x.known() && idx.known() {
			t, err := hostGather(x.c, idx.c, axis)
			if err != nil {
				return nil, err
			}
			if t.NumElements() <= foldLimit {
				return []*value{constant(t)}, nil
			}
		}
		if idx.known() {
			// Negative indices count from the end: normalize them here.
			dim := x.shape()[axis]
			ids := idx.c.Ints()
			t := newTensor(ir.Int64, idx.c.Shape)
			for i, k := range ids {
				if k < -dim || k >= dim {
					return nil, fmt.Errorf("index %d is out of range for axis %d of size %d", k, axis, dim)
				}
				if k < 0 {
					k += dim
				}
				putInt(t.Data, ir.Int64, i, k)
			}
			idx = constant(t)
		} else {
			// Negative indices count from the end: idx + dim where negative.
			neg, err := im.emit("relax.less", nil, idx, scalar(idx.dtype(), 0))
			if err != nil {
				return nil, err
			}
			wrapped, err := im.emit("relax.add", nil, idx, scalar(idx.dtype(), float64(x.shape()[axis])))
			if err != nil {
				return nil, err
			}
			if idx, err = im.emit("relax.where", nil, neg, wrapped, idx); err != nil {
				return nil, err
			}
		}
		return ret(im.emit("relax.take", map[string]any{"axis": int64(axis)}, x, idx))
	})
	reg("Expand", 8, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		t, err := n.knownInput(1, "shape")
		if err != nil {
			return nil, err
		}
		if t == nil {
			return nil, fmt.Errorf("input 1 (shape) is missing")
		}
		shape, err := broadcastShape(x.shape(), t.Ints())
		if err != nil {
			return nil, err
		}
		if x.known() && numElements(shape) <= foldLimit {
			return []*value{constant(hostExpand(x.c, shape))}, nil
		}
		if slices.Equal(shape, x.shape()) {
			return []*value{x}, nil
		}
		return ret(im.emit("relax.broadcast_to", nil, x, &ir.ShapeExpr{Values: ir.Dims(shape...)}))
	})
	reg("ConstantOfShape", 9, func(im *importer, n *node) ([]*value, error) {
		t, err := n.knownInput(0, "shape")
		if err != nil {
			return nil, err
		}
		if t == nil {
			return nil, fmt.Errorf("input 0 (shape) is missing")
		}
		shape := t.Ints()
		if _, err := checkDims(shape); err != nil {
			return nil, err
		}
		fill := scalarTensor(ir.Float32, 0)
		if a, ok := n.attrs["value"]; ok {
			if fill, err = decodeTensor(a.GetT(), ""); err != nil {
				return nil, err
			}
			if fill.NumElements() != 1 {
				return nil, fmt.Errorf("value has %d elements, want 1", fill.NumElements())
			}
		}
		out := newTensor(fill.DType, shape)
		es := fill.DType.Size()
		for i := int64(0); i < out.NumElements(); i++ {
			copy(out.Data[int(i)*es:], fill.Data[:es])
		}
		return []*value{constant(out)}, nil
	})
	reg("Range", 11, func(im *importer, n *node) ([]*value, error) {
		var v [3]*Tensor
		for i, what := range []string{"start", "limit", "delta"} {
			t, err := n.knownInput(i, what)
			if err != nil {
				return nil, err
			}
			if t == nil || t.NumElements() != 1 {
				return nil, fmt.Errorf("input %d (%s) must be a scalar", i, what)
			}
			v[i] = t
		}
		start, limit, delta := v[0].elem(0), v[1].elem(0), v[2].elem(0)
		if delta == 0 {
			return nil, fmt.Errorf("delta is 0")
		}
		count := int64(max(math.Ceil((limit-start)/delta), 0))
		if count > foldLimit*16 {
			return nil, fmt.Errorf("range of %d elements", count)
		}
		out := newTensor(v[0].DType, []int64{count})
		for i := range count {
			if v[0].DType.IsFloat() {
				setElem(out.Data, out.DType, int(i), start+float64(i)*delta)
			} else {
				setIElem(out.Data, out.DType, int(i), v[0].ielem(0)+i*v[2].ielem(0))
			}
		}
		return []*value{constant(out)}, nil
	})
}

// convertConstant turns a Constant node's attribute into a known value.
func convertConstant(im *importer, n *node) ([]*value, error) {
	for name, a := range n.attrs {
		switch name {
		case "value":
			t, err := decodeTensor(a.GetT(), "")
			if err != nil {
				return nil, err
			}
			return []*value{constant(t)}, nil
		case "value_float":
			return []*value{constant(scalarTensor(ir.Float32, float64(a.GetF())))}, nil
		case "value_floats":
			t := newTensor(ir.Float32, []int64{int64(len(a.GetFloats()))})
			for i, f := range a.GetFloats() {
				setElem(t.Data, ir.Float32, i, float64(f))
			}
			return []*value{constant(t)}, nil
		case "value_int":
			return []*value{constant(intTensor([]int64{a.GetI()}, []int64{}...))}, nil
		case "value_ints":
			return []*value{constant(intTensor(a.GetInts()))}, nil
		default:
			return nil, unsupported("Constant with attribute %q", name)
		}
	}
	return nil, fmt.Errorf("Constant has no value attribute")
}

// axesOf reads the axes of Squeeze, Unsqueeze or a reduction: an
// attribute before opset `since`, input i from it on.
func axesOf(n *node, since int64, i int) ([]int64, bool, error) {
	if n.opset < since {
		a, ok := n.attrInts("axes")
		return a, ok, nil
	}
	t, err := n.knownInput(i, "axes")
	if err != nil || t == nil {
		return nil, false, err
	}
	return t.Ints(), true, nil
}

func clampIndex(i, n int64) int64 {
	if i < 0 {
		i += n
	}
	return max(0, min(i, n))
}

// sliceBounds clamps ONNX Slice's start and end for a dimension of n the
// way the operator defines it (end may be INT_MAX or very negative).
func sliceBounds(start, end, step, n int64) (int64, int64) {
	if start < 0 {
		start += n
	}
	if end < 0 {
		end += n
	}
	if step > 0 {
		return max(0, min(start, n)), max(0, min(end, n))
	}
	return max(-1, min(start, n-1)), max(-1, min(end, n-1))
}

// reshapeTarget resolves ONNX Reshape's shape: 0 copies the input's dim
// (unless allowzero), one -1 is inferred.
func reshapeTarget(in, target []int64, allowZero bool) ([]int64, error) {
	out := make([]int64, len(target))
	infer := -1
	known := int64(1)
	for i, d := range target {
		switch {
		case d == -1:
			if infer >= 0 {
				return nil, fmt.Errorf("shape %v has more than one -1", target)
			}
			infer = i
			continue
		case d == 0 && !allowZero:
			if i >= len(in) {
				return nil, fmt.Errorf("shape %v copies dim %d of an input of rank %d", target, i, len(in))
			}
			d = in[i]
		case d < 0:
			return nil, fmt.Errorf("shape %v has a negative dim", target)
		}
		out[i] = d
		known *= d
	}
	total := numElements(in)
	if infer >= 0 {
		if known == 0 || total%known != 0 {
			return nil, fmt.Errorf("cannot reshape %v into %v", in, target)
		}
		out[infer] = total / known
	} else if known != total {
		return nil, fmt.Errorf("cannot reshape %v (%d elements) into %v", in, total, target)
	}
	return out, nil
}

// reshape reshapes x to a static shape (on the host when x is known).
func (im *importer) reshape(x *value, shape []int64) (*value, error) {
	if numElements(shape) != numElements(x.shape()) {
		return nil, fmt.Errorf("cannot reshape %v into %v", x.shape(), shape)
	}
	if x.known() {
		v := constant(x.c.reshaped(shape))
		v.init = x.init
		if v.init {
			v.c.Name = x.c.Name
		}
		return v, nil
	}
	if slices.Equal(shape, x.shape()) {
		return x, nil
	}
	return im.emit("relax.reshape", nil, x, &ir.ShapeExpr{Values: ir.Dims(shape...)})
}

// slice takes x[begin:end:step] on axes (bounds already clamped).
func (im *importer) slice(x *value, axes []int, begin, end, step []int64) (*value, error) {
	if x.known() {
		if t := hostSlice(x.c, axes, begin, end, step); t.NumElements() <= foldLimit {
			return constant(t), nil
		}
	}
	// strided_slice reads a negative end as counting from the end; an end
	// of -1 for a negative step means "through index 0".
	e := slices.Clone(end)
	for i := range e {
		if e[i] < 0 {
			e[i] = math.MinInt32
		}
	}
	return im.emit("relax.strided_slice", map[string]any{
		"axes": anyInts(axes), "begin": anyInts(begin), "end": anyInts(e), "strides": anyInts(step),
	}, x)
}

// concat joins values along axis.
func (im *importer) concat(parts []*value, axis int) (*value, error) {
	fields := make([]ir.RExpr, len(parts))
	for i, p := range parts {
		e, err := im.expr(p)
		if err != nil {
			return nil, err
		}
		fields[i] = e
	}
	return im.emit("relax.concat", map[string]any{"axis": int64(axis)}, &ir.RTuple{Fields: fields})
}
