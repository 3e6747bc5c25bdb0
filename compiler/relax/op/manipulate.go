package op

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Tensor manipulation: matmul, permute_dims, reshape, flatten, concat,
// split, strided_slice, take, broadcast_to, expand_dims, squeeze and
// shape_of.

func init() {
	mustRegister(&Def{Name: "relax.matmul", Args: []Arg{{Name: "x1"}, {Name: "x2"}},
		Attrs: []Attr{{Name: "out_dtype", Kind: AttrDType, Default: "void"}}, Infer: inferMatmul})
	mustRegister(&Def{Name: "relax.permute_dims", Args: []Arg{{Name: "x"}},
		Attrs: []Attr{{Name: "axes", Kind: AttrOptInts}}, Infer: inferPermuteDims})
	mustRegister(&Def{Name: "relax.reshape", Args: []Arg{{Name: "x"}, {Name: "shape", Kind: ArgShape}}, Infer: inferReshape})
	mustRegister(&Def{Name: "relax.flatten", Args: []Arg{{Name: "x"}}, Infer: inferFlatten})
	mustRegister(&Def{Name: "relax.concat", Args: []Arg{{Name: "tensors", Kind: ArgTensors}},
		Attrs: []Attr{{Name: "axis", Kind: AttrOptInt, Default: int64(0)}}, Infer: inferConcat})
	mustRegister(&Def{Name: "relax.split", Args: []Arg{{Name: "x"}},
		Attrs: []Attr{{Name: "indices_or_sections", Kind: AttrIntOrInts, Default: int64(1)}, {Name: "axis", Kind: AttrInt, Default: int64(0)}},
		Infer: inferSplit})
	mustRegister(&Def{Name: "relax.strided_slice", Args: []Arg{{Name: "x"}},
		Attrs: []Attr{{Name: "axes", Kind: AttrInts, Default: []any{}}, {Name: "begin", Kind: AttrInts, Default: []any{}},
			{Name: "end", Kind: AttrInts, Default: []any{}}, {Name: "strides", Kind: AttrOptInts}},
		Infer: inferStridedSlice})
	mustRegister(&Def{Name: "relax.take", Args: []Arg{{Name: "x"}, {Name: "indices"}},
		Attrs: []Attr{{Name: "axis", Kind: AttrOptInt}}, Infer: inferTake})
	mustRegister(&Def{Name: "relax.broadcast_to", Args: []Arg{{Name: "x"}, {Name: "shape", Kind: ArgShape}}, Infer: inferBroadcastTo})
	mustRegister(&Def{Name: "relax.expand_dims", Args: []Arg{{Name: "x"}},
		Attrs: []Attr{{Name: "axis", Kind: AttrInts, Default: []any{}}}, Infer: inferExpandDims})
	mustRegister(&Def{Name: "relax.squeeze", Args: []Arg{{Name: "x"}},
		Attrs: []Attr{{Name: "axis", Kind: AttrOptInts}}, Infer: inferSqueeze})
	mustRegister(&Def{Name: "relax.shape_of", Args: []Arg{{Name: "x"}}, Infer: inferShapeOf})
}

func inferMatmul(c *ir.RCall) (ir.StructInfo, error) {
	a, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	b, err := tensor(c, 1)
	if err != nil {
		return nil, err
	}
	dt, err := attrDType(c, "out_dtype")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name(c), err)
	}
	if ir.IsVoid(dt) {
		if dt, err = unifyDType(c, a.DType, b.DType); err != nil {
			return nil, err
		}
	}
	if a.NDim == 0 || b.NDim == 0 {
		return nil, fmt.Errorf("%s: shapes %s and %s: operands must have at least one dimension", name(c), shapeStr(a), shapeStr(b))
	}
	if a.NDim < 0 || b.NDim < 0 {
		return ir.TensorNDim(dt, -1), nil
	}
	outNDim := max(a.NDim, b.NDim)
	if a.NDim == 1 {
		outNDim--
	}
	if b.NDim == 1 {
		outNDim--
	}
	if a.Shape == nil || b.Shape == nil {
		return ir.TensorNDim(dt, max(outNDim, 0)), nil
	}
	as, bs := a.Shape, b.Shape
	if len(as) == 1 {
		as = []ir.Expr{i64(1), as[0]}
	}
	if len(bs) == 1 {
		bs = []ir.Expr{bs[0], i64(1)}
	}
	ka, kb := as[len(as)-1], bs[len(bs)-2]
	mismatch := func() error {
		return fmt.Errorf("%s: shapes %s and %s do not match: reduction dimensions %s and %s differ",
			name(c), shapeStr(a), shapeStr(b), ir.DimString(ka), ir.DimString(kb))
	}
	if x, ok := ir.ConstDim(ka); ok {
		if y, ok := ir.ConstDim(kb); ok && x != y {
			return nil, mismatch()
		}
	}
	batch, known, err := broadcastShapes(as[:len(as)-2], bs[:len(bs)-2])
	if err != nil {
		return nil, fmt.Errorf("%s: batch dimensions of shapes %s and %s do not broadcast", name(c), shapeStr(a), shapeStr(b))
	}
	if !known {
		return ir.TensorNDim(dt, outNDim), nil
	}
	out := append([]ir.Expr{}, batch...)
	if a.NDim > 1 {
		out = append(out, as[len(as)-2])
	}
	if b.NDim > 1 {
		out = append(out, bs[len(bs)-1])
	}
	return ir.Tensor(dt, out...), nil
}

func inferPermuteDims(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	axes, given := attrInts(c, "axes")
	if x.NDim < 0 {
		if given {
			return ir.TensorNDim(x.DType, len(axes)), nil
		}
		return x, nil
	}
	perm := make([]int, x.NDim)
	if !given {
		for i := range perm {
			perm[i] = x.NDim - 1 - i
		}
	} else {
		if len(axes) != x.NDim {
			return nil, fmt.Errorf("%s: %d axes for a tensor of shape %s", name(c), len(axes), shapeStr(x))
		}
		if perm, err = normAxes(c, axes, x.NDim); err != nil {
			return nil, err
		}
	}
	if x.Shape == nil {
		return x, nil
	}
	out := make([]ir.Expr, x.NDim)
	for i, p := range perm {
		out[i] = x.Shape[p]
	}
	return ir.Tensor(x.DType, out...), nil
}

// shapeArg returns the values of a shape argument, or nil with its rank.
func shapeArg(c *ir.RCall, i int) ([]ir.Expr, int, error) {
	switch s := ir.StructInfoOf(c.Args[i]).(type) {
	case *ir.ShapeStructInfo:
		return s.Values, s.NDim, nil
	case *ir.ObjectStructInfo:
		return nil, -1, nil
	default:
		return nil, 0, fmt.Errorf("%s: argument %d is %s, want a shape", name(c), i, s)
	}
}

func inferReshape(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	vals, ndim, err := shapeArg(c, 1)
	if err != nil {
		return nil, err
	}
	if vals == nil {
		return ir.TensorNDim(x.DType, ndim), nil
	}
	out := make([]ir.Expr, len(vals))
	copy(out, vals)
	infer := -1
	for i, v := range vals {
		if n, ok := ir.ConstDim(v); ok && n == -1 {
			if infer >= 0 {
				return nil, fmt.Errorf("%s: more than one -1 in the new shape %s", name(c), ir.ShapeString(vals))
			}
			infer = i
		} else if ok && n < 0 {
			return nil, fmt.Errorf("%s: negative dimension %d in the new shape %s", name(c), n, ir.ShapeString(vals))
		}
	}
	if x.Shape == nil {
		if infer >= 0 {
			return ir.TensorNDim(x.DType, len(vals)), nil
		}
		return ir.Tensor(x.DType, out...), nil
	}
	total := product(x.Shape)
	if infer >= 0 {
		rest := make([]ir.Expr, 0, len(vals)-1)
		rest = append(append(rest, vals[:infer]...), vals[infer+1:]...)
		p := product(rest)
		tn, tok := ir.ConstDim(total)
		pn, pok := ir.ConstDim(p)
		switch {
		case tok && pok && (pn == 0 || tn%pn != 0):
			return nil, fmt.Errorf("%s: cannot reshape %s to %s", name(c), shapeStr(x), ir.ShapeString(vals))
		case tok && pok:
			out[infer] = i64(tn / pn)
		default:
			out[infer] = dimDiv(total, p)
		}
		return ir.Tensor(x.DType, out...), nil
	}
	tn, tok := ir.ConstDim(total)
	pn, pok := ir.ConstDim(product(vals))
	if tok && pok && tn != pn {
		return nil, fmt.Errorf("%s: cannot reshape %s (%d elements) to %s (%d elements)", name(c), shapeStr(x), tn, ir.ShapeString(vals), pn)
	}
	return ir.Tensor(x.DType, out...), nil
}

func inferFlatten(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	if x.Shape == nil {
		return ir.TensorNDim(x.DType, 1), nil
	}
	return ir.Tensor(x.DType, product(x.Shape)), nil
}

func inferConcat(c *ir.RCall) (ir.StructInfo, error) {
	var ts []*ir.TensorStructInfo
	switch s := ir.StructInfoOf(c.Args[0]).(type) {
	case *ir.TupleStructInfo:
		for i, f := range s.Fields {
			t, ok := f.(*ir.TensorStructInfo)
			if !ok {
				return nil, fmt.Errorf("%s: field %d is %s, want a tensor", name(c), i, f)
			}
			ts = append(ts, t)
		}
	default:
		return nil, fmt.Errorf("%s: want a tuple of tensors, got %s", name(c), s)
	}
	if len(ts) == 0 {
		return nil, fmt.Errorf("%s: no tensors to concatenate", name(c))
	}
	dt := ir.Void
	var err error
	ndim := -1
	for _, t := range ts {
		if dt, err = unifyDType(c, dt, t.DType); err != nil {
			return nil, err
		}
		if t.NDim >= 0 {
			if ndim >= 0 && t.NDim != ndim {
				return nil, fmt.Errorf("%s: tensors of ranks %d and %d", name(c), ndim, t.NDim)
			}
			ndim = t.NDim
		}
	}
	axisV, hasAxis := attrInt(c, "axis")
	if !hasAxis {
		// axis=None concatenates the flattened tensors.
		var total ir.Expr = i64(0)
		for _, t := range ts {
			if t.Shape == nil {
				return ir.TensorNDim(dt, 1), nil
			}
			total = dimAdd(total, product(t.Shape))
		}
		return ir.Tensor(dt, total), nil
	}
	if ndim < 0 {
		return ir.TensorNDim(dt, -1), nil
	}
	axis, err := normAxis(c, axisV, ndim)
	if err != nil {
		return nil, err
	}
	var out []ir.Expr
	for _, t := range ts {
		if t.Shape == nil {
			return ir.TensorNDim(dt, ndim), nil
		}
		if out == nil {
			out = append([]ir.Expr{}, t.Shape...)
			continue
		}
		for i := range out {
			if i == axis {
				out[i] = dimAdd(out[i], t.Shape[i])
				continue
			}
			x, xok := ir.ConstDim(out[i])
			y, yok := ir.ConstDim(t.Shape[i])
			if xok && yok && x != y {
				strs := make([]string, len(ts))
				for j, t := range ts {
					strs[j] = shapeStr(t)
				}
				return nil, fmt.Errorf("%s: shapes %s differ outside axis %d", name(c), joinAnd(strs), axis)
			}
		}
	}
	return ir.Tensor(dt, out...), nil
}

// maxSections bounds the parts of a split.
const maxSections = 1 << 16

func inferSplit(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	axisV, _ := attrInt(c, "axis")
	if x.NDim < 0 {
		return nil, fmt.Errorf("%s: the rank of the input must be known", name(c))
	}
	axis, err := normAxis(c, axisV, x.NDim)
	if err != nil {
		return nil, err
	}
	var parts [][2]ir.Expr // begin and length of each part
	var dim ir.Expr
	if x.Shape != nil {
		dim = x.Shape[axis]
	}
	if n, ok := attrInt(c, "indices_or_sections"); ok {
		if n <= 0 || n > maxSections {
			return nil, fmt.Errorf("%s: %d sections (want 1 to %d)", name(c), n, maxSections)
		}
		if d, ok := ir.ConstDim(dim); ok && d%n != 0 {
			return nil, fmt.Errorf("%s: dimension %d of shape %s does not split into %d equal sections", name(c), axis, shapeStr(x), n)
		}
		for i := int64(0); i < n; i++ {
			var size ir.Expr
			if dim != nil {
				size = dimDiv(dim, i64(n))
			}
			parts = append(parts, [2]ir.Expr{nil, size})
		}
	} else {
		idx, _ := attrInts(c, "indices_or_sections")
		prev := int64(0)
		for _, v := range idx {
			if v < prev {
				return nil, fmt.Errorf("%s: split indices %v are not increasing", name(c), idx)
			}
			parts = append(parts, [2]ir.Expr{nil, i64(v - prev)})
			prev = v
		}
		var last ir.Expr
		if dim != nil {
			last = dimSub(dim, i64(prev))
			if d, ok := ir.ConstDim(last); ok && d < 0 {
				return nil, fmt.Errorf("%s: split index %d past dimension %d of shape %s", name(c), prev, axis, shapeStr(x))
			}
		}
		parts = append(parts, [2]ir.Expr{nil, last})
	}
	fields := make([]ir.StructInfo, len(parts))
	for i, p := range parts {
		if x.Shape == nil {
			fields[i] = ir.TensorNDim(x.DType, x.NDim)
			continue
		}
		s := append([]ir.Expr{}, x.Shape...)
		s[axis] = p[1]
		fields[i] = ir.Tensor(x.DType, s...)
	}
	return ir.Tuple(fields...), nil
}

// sliceLen is the length of x[begin:end:stride] over a dimension of n.
func sliceLen(n, begin, end, stride int64) int64 {
	clamp := func(v, lo, hi int64) int64 { return max(lo, min(v, hi)) }
	if begin < 0 {
		begin += n
	}
	if end < 0 {
		end += n
	}
	if stride > 0 {
		begin, end = clamp(begin, 0, n), clamp(end, 0, n)
		if end <= begin {
			return 0
		}
		return (end - begin + stride - 1) / stride
	}
	begin, end = clamp(begin, -1, n-1), clamp(end, -1, n-1)
	if begin <= end {
		return 0
	}
	return (begin - end - stride - 1) / -stride
}

func inferStridedSlice(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	axes, _ := attrInts(c, "axes")
	begin, _ := attrInts(c, "begin")
	end, _ := attrInts(c, "end")
	strides, hasStrides := attrInts(c, "strides")
	if len(begin) != len(axes) || len(end) != len(axes) || hasStrides && len(strides) != len(axes) {
		return nil, fmt.Errorf("%s: axes, begin, end and strides differ in length", name(c))
	}
	if x.NDim < 0 {
		return x, nil
	}
	ax, err := normAxes(c, axes, x.NDim)
	if err != nil {
		return nil, err
	}
	if x.Shape == nil {
		return x, nil
	}
	out := append([]ir.Expr{}, x.Shape...)
	for i, a := range ax {
		stride := int64(1)
		if hasStrides {
			stride = strides[i]
		}
		if stride == 0 {
			return nil, fmt.Errorf("%s: stride 0 on axis %d", name(c), axes[i])
		}
		n, ok := ir.ConstDim(x.Shape[a])
		if !ok {
			return ir.TensorNDim(x.DType, x.NDim), nil
		}
		out[a] = i64(sliceLen(n, begin[i], end[i], stride))
	}
	return ir.Tensor(x.DType, out...), nil
}

func inferTake(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	idx, err := tensor(c, 1)
	if err != nil {
		return nil, err
	}
	if !ir.IsVoid(idx.DType) && !idx.DType.IsInt() {
		return nil, fmt.Errorf("%s: indices have dtype %s, want an integer type", name(c), idx.DType)
	}
	axisV, hasAxis := attrInt(c, "axis")
	if !hasAxis {
		if idx.Shape == nil {
			return ir.TensorNDim(x.DType, idx.NDim), nil
		}
		return ir.Tensor(x.DType, idx.Shape...), nil
	}
	if x.NDim < 0 || idx.NDim < 0 {
		return ir.TensorNDim(x.DType, -1), nil
	}
	axis, err := normAxis(c, axisV, x.NDim)
	if err != nil {
		return nil, err
	}
	if x.Shape == nil || idx.Shape == nil {
		return ir.TensorNDim(x.DType, x.NDim-1+idx.NDim), nil
	}
	out := append(append(append([]ir.Expr{}, x.Shape[:axis]...), idx.Shape...), x.Shape[axis+1:]...)
	return ir.Tensor(x.DType, out...), nil
}

func inferBroadcastTo(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	vals, ndim, err := shapeArg(c, 1)
	if err != nil {
		return nil, err
	}
	if vals == nil {
		return ir.TensorNDim(x.DType, ndim), nil
	}
	if x.NDim > len(vals) {
		return nil, fmt.Errorf("%s: cannot broadcast shape %s to %s", name(c), shapeStr(x), ir.ShapeString(vals))
	}
	if x.Shape != nil {
		for i, d := range x.Shape {
			t := vals[len(vals)-len(x.Shape)+i]
			a, aok := ir.ConstDim(d)
			b, bok := ir.ConstDim(t)
			if aok && bok && a != 1 && a != b {
				return nil, fmt.Errorf("%s: cannot broadcast shape %s to %s", name(c), shapeStr(x), ir.ShapeString(vals))
			}
		}
	}
	return ir.Tensor(x.DType, vals...), nil
}

func inferExpandDims(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	axes, _ := attrInts(c, "axis")
	if x.NDim < 0 {
		return x, nil
	}
	n := x.NDim + len(axes)
	ax, err := normAxes(c, axes, n)
	if err != nil {
		return nil, err
	}
	if x.Shape == nil {
		return ir.TensorNDim(x.DType, n), nil
	}
	isNew := make([]bool, n)
	for _, a := range ax {
		isNew[a] = true
	}
	out := make([]ir.Expr, 0, n)
	j := 0
	for i := 0; i < n; i++ {
		if isNew[i] {
			out = append(out, i64(1))
			continue
		}
		out = append(out, x.Shape[j])
		j++
	}
	return ir.Tensor(x.DType, out...), nil
}

func inferSqueeze(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	axes, given := attrInts(c, "axis")
	if x.NDim < 0 {
		return x, nil
	}
	drop := make([]bool, x.NDim)
	if given {
		ax, err := normAxes(c, axes, x.NDim)
		if err != nil {
			return nil, err
		}
		for _, a := range ax {
			if x.Shape != nil {
				if n, ok := ir.ConstDim(x.Shape[a]); ok && n != 1 {
					return nil, fmt.Errorf("%s: axis %d of shape %s is not 1", name(c), axes[0], shapeStr(x))
				}
			}
			drop[a] = true
		}
	} else {
		if x.Shape == nil {
			return ir.TensorNDim(x.DType, -1), nil
		}
		for i, d := range x.Shape {
			n, ok := ir.ConstDim(d)
			if !ok {
				return ir.TensorNDim(x.DType, -1), nil
			}
			drop[i] = n == 1
		}
	}
	kept := 0
	var out []ir.Expr
	for i, dropped := range drop {
		if dropped {
			continue
		}
		kept++
		if x.Shape != nil {
			out = append(out, x.Shape[i])
		}
	}
	if x.Shape == nil {
		return ir.TensorNDim(x.DType, kept), nil
	}
	return ir.Tensor(x.DType, out...), nil
}

func inferShapeOf(c *ir.RCall) (ir.StructInfo, error) {
	x, err := tensor(c, 0)
	if err != nil {
		return nil, err
	}
	if x.Shape != nil {
		return ir.ShapeOf(x.Shape...), nil
	}
	return &ir.ShapeStructInfo{NDim: x.NDim}, nil
}
