package topi

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/arith"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
)

// Tensor manipulation: transpose (permute_dims), reshape, flatten,
// concatenate, split, strided_slice, take, expand_dims and squeeze.

// Transpose permutes the dimensions of x (Relax's permute_dims, stage
// T_transpose): output dimension i is input dimension axes[i]. nil axes
// reverse the dimensions.
func Transpose(x *te.Tensor, axes []int64) (*te.Tensor, error) {
	const op = "permute_dims"
	if err := checkInputs(op, x); err != nil {
		return nil, err
	}
	n := len(x.Shape)
	perm := make([]int, n)
	if axes == nil {
		for i := range perm {
			perm[i] = n - 1 - i
		}
	} else {
		if len(axes) != n {
			return nil, fmt.Errorf("%s: %d axes for a tensor of shape %s", op, len(axes), shapeStr(x.Shape))
		}
		var err error
		if perm, err = normAxes(op, axes, n); err != nil {
			return nil, err
		}
	}
	out := make([]ir.Expr, n)
	for i, p := range perm {
		out[i] = x.Shape[p]
	}
	return finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		in := make([]ir.Expr, n)
		for i, p := range perm {
			in[p] = idx[i]
		}
		return x.At(in...)
	}, "T_transpose", names("ax", n)...))
}

// ResolveShape replaces one -1 in newShape by the size that keeps x's
// element count and checks that constant counts agree.
func ResolveShape(op string, shape, newShape []ir.Expr) ([]ir.Expr, error) {
	out := append([]ir.Expr{}, newShape...)
	infer := -1
	for i, d := range newShape {
		if d == nil {
			return nil, fmt.Errorf("%s: dimension %d of the new shape is missing", op, i)
		}
		v, ok := constDim(d)
		switch {
		case ok && v == -1 && infer >= 0:
			return nil, fmt.Errorf("%s: more than one -1 in the new shape %s", op, shapeStr(newShape))
		case ok && v == -1:
			infer = i
		case ok && v < 0:
			return nil, fmt.Errorf("%s: negative dimension %d in the new shape %s", op, v, shapeStr(newShape))
		}
	}
	total := product(shape)
	tn, tok := constDim(total)
	if infer >= 0 {
		rest := append(append([]ir.Expr{}, newShape[:infer]...), newShape[infer+1:]...)
		p := product(rest)
		pn, pok := constDim(p)
		switch {
		case tok && pok && (pn == 0 || tn%pn != 0):
			return nil, fmt.Errorf("%s: cannot reshape %s to %s", op, shapeStr(shape), shapeStr(newShape))
		case tok && pok:
			out[infer] = iconst(newShape[infer], tn/pn)
		default:
			out[infer] = divideDims(shape, rest)
		}
		return out, nil
	}
	pn, pok := constDim(product(newShape))
	if tok && pok && tn != pn {
		return nil, fmt.Errorf("%s: cannot reshape %s (%d elements) to %s (%d elements)", op, shapeStr(shape), tn, shapeStr(newShape), pn)
	}
	return out, nil
}

// divideDims returns product(num) / product(den), cancelling equal
// symbolic factors and dividing constants where they divide.
func divideDims(num, den []ir.Expr) ir.Expr {
	left := slices.Clone(num)
	var rest []ir.Expr
	for _, d := range den {
		if _, ok := constDim(d); ok {
			rest = append(rest, d)
			continue
		}
		if i := slices.IndexFunc(left, func(e ir.Expr) bool { return ir.DimEqual(e, d) }); i >= 0 {
			left = slices.Delete(left, i, i+1)
			continue
		}
		rest = append(rest, d)
	}
	var sym, symDen []ir.Expr
	cn, cd := int64(1), int64(1)
	for _, e := range left {
		if v, ok := constDim(e); ok {
			cn *= v
		} else {
			sym = append(sym, e)
		}
	}
	for _, e := range rest {
		if v, ok := constDim(e); ok {
			cd *= v
		} else {
			symDen = append(symDen, e)
		}
	}
	like := ir.Expr(ir.I64(0))
	if len(num) > 0 {
		like = num[0]
	}
	if cd != 0 && cn%cd == 0 {
		cn, cd = cn/cd, 1
	}
	n := product(append(sym, iconst(like, cn)))
	if cd != 1 {
		symDen = append(symDen, iconst(like, cd))
	}
	if len(symDen) == 0 {
		return n
	}
	return ir.FoldDim(ir.FloorDiv(n, product(symDen)))
}

// reindex maps indices over shape `from` to the indices of the same
// row-major element over shape `to`, simplified with the indices' ranges.
func reindex(idx, from, to []ir.Expr) []ir.Expr {
	an := arith.NewAnalyzer()
	simplify := func(e ir.Expr) ir.Expr { return an.Simplify(e) }
	for i, e := range idx {
		v, ok := e.(*ir.Var)
		if !ok {
			// Tensor elements inside compute closures are not plain IR.
			simplify = func(e ir.Expr) ir.Expr { return e }
			break
		}
		an.Bind(v, ir.RangeFromExtent(from[i]))
	}
	var lin ir.Expr
	for i, d := range from {
		if lin == nil {
			lin = idx[i]
			continue
		}
		lin = ir.Add(foldMul(lin, d), idx[i])
	}
	if lin == nil {
		lin = ir.I64(0)
	}
	out := make([]ir.Expr, len(to))
	for j := len(to) - 1; j >= 0; j-- {
		if j == 0 {
			out[0] = simplify(lin)
			break
		}
		d := to[j]
		out[j] = simplify(ir.FloorMod(lin, d))
		lin = ir.FloorDiv(lin, d)
	}
	return out
}

// Reshape returns x with the new shape (stage T_reshape); one dimension
// may be -1. The element count must not change.
func Reshape(x *te.Tensor, newShape []ir.Expr) (*te.Tensor, error) {
	const op = "reshape"
	if err := checkInputs(op, x); err != nil {
		return nil, err
	}
	out, err := ResolveShape(op, x.Shape, newShape)
	if err != nil {
		return nil, err
	}
	return finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		return x.At(reindex(idx, out, x.Shape)...)
	}, "T_reshape", names("ax", len(out))...))
}

// Flatten returns x as a 1-D tensor (Relax's flatten; stage T_reshape).
func Flatten(x *te.Tensor) (*te.Tensor, error) {
	if err := checkInputs("flatten", x); err != nil {
		return nil, err
	}
	return Reshape(x, []ir.Expr{product(x.Shape)})
}

// Concat joins ts along axis (stage T_concat). A nil axis joins the
// flattened tensors. The tensors must agree in dtype, rank and every
// dimension but axis.
func Concat(ts []*te.Tensor, axis *int64) (*te.Tensor, error) {
	const op = "concat"
	if len(ts) == 0 {
		return nil, fmt.Errorf("%s: no tensors to concatenate", op)
	}
	if err := checkInputs(op, ts...); err != nil {
		return nil, err
	}
	if err := sameDType(op, ts...); err != nil {
		return nil, err
	}
	shapes := make([][]ir.Expr, len(ts))
	loads := make([]func(idx []ir.Expr) ir.Expr, len(ts))
	ax := 0
	if axis == nil {
		for i, t := range ts {
			shapes[i] = []ir.Expr{product(t.Shape)}
			loads[i] = func(idx []ir.Expr) ir.Expr { return t.At(reindex(idx, shapes[i], t.Shape)...) }
		}
	} else {
		rank := len(ts[0].Shape)
		var err error
		if ax, err = normAxis(op, *axis, rank); err != nil {
			return nil, err
		}
		for i, t := range ts {
			if len(t.Shape) != rank {
				return nil, fmt.Errorf("%s: tensors of ranks %d and %d", op, rank, len(t.Shape))
			}
			for d := range t.Shape {
				if d != ax && !ir.DimEqual(t.Shape[d], ts[0].Shape[d]) {
					return nil, fmt.Errorf("%s: shapes %s and %s differ outside axis %d", op, shapeStr(ts[0].Shape), shapeStr(t.Shape), ax)
				}
			}
			shapes[i] = t.Shape
			loads[i] = func(idx []ir.Expr) ir.Expr { return t.At(idx...) }
		}
	}
	offsets := make([]ir.Expr, len(ts)+1)
	offsets[0] = iconst(shapes[0][ax], 0)
	for i, s := range shapes {
		offsets[i+1] = ir.FoldDim(ir.Add(offsets[i], s[ax]))
	}
	out := append([]ir.Expr{}, shapes[0]...)
	out[ax] = offsets[len(ts)]
	return finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		at := func(i int) ir.Expr {
			sub := append([]ir.Expr{}, idx...)
			if v, ok := constDim(offsets[i]); !ok || v != 0 {
				sub[ax] = ir.Sub(idx[ax], offsets[i])
			}
			return loads[i](sub)
		}
		n := len(ts)
		ret := at(n - 1)
		for i := n - 2; i >= 0; i-- {
			ret = ir.NewIfThenElse(ir.LT(idx[ax], offsets[i+1]), at(i), ret)
		}
		return ret
	}, "T_concat", names("ax", len(out))...))
}

// Split cuts x along axis into sections equal parts (sections > 0) or,
// when indices is not nil, at the increasing indices. The parts are
// stages T_split_sections (or T_split), T_split_sections_1, ….
func Split(x *te.Tensor, sections int64, indices []int64, axis int64) ([]*te.Tensor, error) {
	const op = "split"
	if err := checkInputs(op, x); err != nil {
		return nil, err
	}
	ax, err := normAxis(op, axis, len(x.Shape))
	if err != nil {
		return nil, err
	}
	dim := x.Shape[ax]
	type part struct{ begin, size ir.Expr }
	var parts []part
	stage := "T_split"
	if indices == nil {
		stage = "T_split_sections"
		if sections <= 0 {
			return nil, fmt.Errorf("%s: %d sections", op, sections)
		}
		if d, ok := constDim(dim); ok && d%sections != 0 {
			return nil, fmt.Errorf("%s: dimension %d of shape %s does not split into %d equal sections", op, ax, shapeStr(x.Shape), sections)
		}
		size := ir.FoldDim(ir.FloorDiv(dim, iconst(dim, sections)))
		for i := int64(0); i < sections; i++ {
			parts = append(parts, part{ir.FoldDim(ir.Mul(size, iconst(dim, i))), size})
		}
	} else {
		prev := int64(0)
		for _, v := range indices {
			if v < prev {
				return nil, fmt.Errorf("%s: split indices %v are not increasing", op, indices)
			}
			parts = append(parts, part{iconst(dim, prev), iconst(dim, v-prev)})
			prev = v
		}
		last := ir.FoldDim(ir.Sub(dim, iconst(dim, prev)))
		if d, ok := constDim(last); ok && d < 0 {
			return nil, fmt.Errorf("%s: split index %d past dimension %d of shape %s", op, prev, ax, shapeStr(x.Shape))
		}
		parts = append(parts, part{iconst(dim, prev), last})
	}
	outs := make([]*te.Tensor, len(parts))
	for i, p := range parts {
		shape := append([]ir.Expr{}, x.Shape...)
		shape[ax] = p.size
		name := stage
		if i > 0 {
			name = fmt.Sprintf("%s_%d", stage, i)
		}
		t, err := finish(te.Compute(shape, func(idx []ir.Expr) ir.Expr {
			sub := append([]ir.Expr{}, idx...)
			if v, ok := constDim(p.begin); !ok || v != 0 {
				sub[ax] = ir.Add(idx[ax], p.begin)
			}
			return x.At(sub...)
		}, name, names("ax", len(shape))...))
		if err != nil {
			return nil, err
		}
		outs[i] = t
	}
	return outs, nil
}

// sliceStartLen returns where x[begin:end:stride] starts over a dimension
// of n and how many elements it has (numpy's clamping rules).
func sliceStartLen(n, begin, end, stride int64) (int64, int64) {
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
			return begin, 0
		}
		return begin, (end - begin + stride - 1) / stride
	}
	begin, end = clamp(begin, -1, n-1), clamp(end, -1, n-1)
	if begin <= end {
		return begin, 0
	}
	return begin, (begin - end - stride - 1) / -stride
}

// StridedSlice slices x along axes: x[begin:end:stride] on each (stage
// T_strided_slice_with_axes). Negative begin and end count from the end;
// out-of-range values clamp as in numpy. nil strides are all 1. Sliced
// dimensions must be constants.
func StridedSlice(x *te.Tensor, axes, begin, end, strides []int64) (*te.Tensor, error) {
	const op = "strided_slice"
	if err := checkInputs(op, x); err != nil {
		return nil, err
	}
	if len(begin) != len(axes) || len(end) != len(axes) || strides != nil && len(strides) != len(axes) {
		return nil, fmt.Errorf("%s: axes, begin, end and strides differ in length", op)
	}
	ax, err := normAxes(op, axes, len(x.Shape))
	if err != nil {
		return nil, err
	}
	out := append([]ir.Expr{}, x.Shape...)
	starts := make([]ir.Expr, len(x.Shape))
	steps := make([]int64, len(x.Shape))
	for i, a := range ax {
		stride := int64(1)
		if strides != nil {
			stride = strides[i]
		}
		if stride == 0 {
			return nil, fmt.Errorf("%s: stride 0 on axis %d", op, axes[i])
		}
		n, ok := constDim(x.Shape[a])
		if !ok {
			return nil, fmt.Errorf("%s: dimension %d of shape %s is not a constant", op, a, shapeStr(x.Shape))
		}
		start, length := sliceStartLen(n, begin[i], end[i], stride)
		out[a] = iconst(x.Shape[a], length)
		starts[a] = iconst(x.Shape[a], start)
		steps[a] = stride
	}
	return finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		sub := append([]ir.Expr{}, idx...)
		for d, s := range starts {
			if s == nil {
				continue
			}
			var e ir.Expr = idx[d]
			if steps[d] != 1 {
				e = ir.Mul(e, iconst(idx[d], steps[d]))
			}
			if v, _ := constDim(s); v != 0 {
				e = ir.Add(s, e)
			}
			sub[d] = e
		}
		return x.At(sub...)
	}, "T_strided_slice_with_axes", names("ax", len(out))...))
}

// Take gathers x's entries at indices along axis (stage T_take); a nil
// axis indexes the flattened x. mode "clip" (the default, "") clamps
// indices into range, "wrap" takes them modulo the dimension (so -1 is
// the last), "fast" trusts them.
func Take(x, indices *te.Tensor, axis *int64, mode string) (*te.Tensor, error) {
	const op = "take"
	if err := checkInputs(op, x, indices); err != nil {
		return nil, err
	}
	if !indices.DType.IsInt() {
		return nil, fmt.Errorf("%s: indices have dtype %s, want an integer type", op, indices.DType)
	}
	if mode == "" {
		mode = "clip"
	}
	if mode != "clip" && mode != "wrap" && mode != "fast" {
		return nil, fmt.Errorf("%s: unknown mode %q (want clip, wrap or fast)", op, mode)
	}
	fix := func(v ir.Expr, dim ir.Expr) ir.Expr {
		v = ir.NewCast(dim.DType(), v)
		switch mode {
		case "clip":
			return ir.Min(ir.Max(v, iconst(dim, 0)), ir.Sub(dim, iconst(dim, 1)))
		case "wrap":
			return ir.FloorMod(v, dim)
		}
		return v
	}
	ni := len(indices.Shape)
	if axis == nil {
		total := product(x.Shape)
		flat := []ir.Expr{total}
		return finish(te.Compute(indices.Shape, func(idx []ir.Expr) ir.Expr {
			i := fix(indices.At(idx...), total)
			return x.At(reindex([]ir.Expr{i}, flat, x.Shape)...)
		}, "T_take", names("ax", ni)...))
	}
	ax, err := normAxis(op, *axis, len(x.Shape))
	if err != nil {
		return nil, err
	}
	out := append(append(append([]ir.Expr{}, x.Shape[:ax]...), indices.Shape...), x.Shape[ax+1:]...)
	return finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		i := fix(indices.At(idx[ax:ax+ni]...), x.Shape[ax])
		sub := append(append(append([]ir.Expr{}, idx[:ax]...), i), idx[ax+ni:]...)
		return x.At(sub...)
	}, "T_take", names("ax", len(out))...))
}

// ExpandDims inserts dimensions of 1 at axes, positions in the result
// (Relax's legalization: stage expand_dims, indices i0…).
func ExpandDims(x *te.Tensor, axes []int64) (*te.Tensor, error) {
	const op = "expand_dims"
	if err := checkInputs(op, x); err != nil {
		return nil, err
	}
	n := len(x.Shape) + len(axes)
	ax, err := normAxes(op, axes, n)
	if err != nil {
		return nil, err
	}
	isNew := make([]bool, n)
	for _, a := range ax {
		isNew[a] = true
	}
	out := make([]ir.Expr, 0, n)
	var keep []int
	j := 0
	for i := 0; i < n; i++ {
		if isNew[i] {
			var like ir.Expr
			if len(x.Shape) > 0 {
				like = x.Shape[0]
			}
			out = append(out, iconst(like, 1))
			continue
		}
		out = append(out, x.Shape[j])
		keep = append(keep, i)
		j++
	}
	return finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		sub := make([]ir.Expr, len(keep))
		for i, k := range keep {
			sub[i] = idx[k]
		}
		return x.At(sub...)
	}, "expand_dims", names("i", n)...))
}

// Squeeze drops the dimensions of 1 at axes, or every constant dimension
// of 1 when axes is nil (stage T_squeeze).
func Squeeze(x *te.Tensor, axes []int64) (*te.Tensor, error) {
	const op = "squeeze"
	if err := checkInputs(op, x); err != nil {
		return nil, err
	}
	drop := make([]bool, len(x.Shape))
	if axes == nil {
		for i, d := range x.Shape {
			drop[i] = isOne(d)
		}
	} else {
		ax, err := normAxes(op, axes, len(x.Shape))
		if err != nil {
			return nil, err
		}
		for i, a := range ax {
			if !isOne(x.Shape[a]) {
				return nil, fmt.Errorf("%s: axis %d of shape %s is not 1", op, axes[i], shapeStr(x.Shape))
			}
			drop[a] = true
		}
	}
	var out []ir.Expr
	var kept []int
	for i, d := range x.Shape {
		if !drop[i] {
			out = append(out, d)
			kept = append(kept, i)
		}
	}
	return finish(te.Compute(out, func(idx []ir.Expr) ir.Expr {
		sub := make([]ir.Expr, len(x.Shape))
		for i, d := range x.Shape {
			sub[i] = iconst(d, 0)
		}
		for i, k := range kept {
			sub[k] = idx[i]
		}
		return x.At(sub...)
	}, "T_squeeze", names("ax", len(out))...))
}
