package onnx

import (
	"fmt"
	"math"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/ndarray"
)

// Operators composed from others: logical operators on booleans, Mod,
// Trilu, Tile, EyeLike, CumSum, OneHot, GatherElements, SpaceToDepth,
// DepthToSpace, IsInf, Shrink, BitShift, GatherND, ScatterND and
// ScatterElements.

func init() {
	logical := map[string]func(im *importer, a, b *value) (*value, error){
		"And": func(im *importer, a, b *value) (*value, error) { return im.emit("relax.minimum", nil, a, b) },
		"Or":  func(im *importer, a, b *value) (*value, error) { return im.emit("relax.maximum", nil, a, b) },
		"Xor": func(im *importer, a, b *value) (*value, error) { return im.emit("relax.not_equal", nil, a, b) },
	}
	for name, f := range logical {
		reg(name, 7, func(im *importer, n *node) ([]*value, error) {
			a, err := n.need(0)
			if err != nil {
				return nil, err
			}
			b, err := n.need(1)
			if err != nil {
				return nil, err
			}
			if a.dtype() != ir.Bool || b.dtype() != ir.Bool {
				return nil, fmt.Errorf("%s of %s and %s, want bool", name, a.dtype(), b.dtype())
			}
			return ret(f(im, a, b))
		})
	}
	reg("Not", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		return ret(im.emit("relax.equal", nil, x, scalar(ir.Bool, 0)))
	})
	reg("Sign", 9, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		pos, err := im.emit("relax.greater", nil, x, scalar(x.dtype(), 0))
		if err != nil {
			return nil, err
		}
		neg, err := im.emit("relax.less", nil, x, scalar(x.dtype(), 0))
		if err != nil {
			return nil, err
		}
		p, err := im.cast(pos, x.dtype())
		if err != nil {
			return nil, err
		}
		q, err := im.cast(neg, x.dtype())
		if err != nil {
			return nil, err
		}
		return ret(im.emit("relax.subtract", nil, p, q))
	})
	reg("Mod", 10, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		y, err := n.need(1)
		if err != nil {
			return nil, err
		}
		if fmod := n.attrInt("fmod", 0) != 0; !fmod || !x.dtype().IsFloat() {
			// x − q·y with q = floor(x / y), Python's modulo (the sign
			// of the divisor), or for integer fmod q = x / y truncated,
			// C's % (the sign of the dividend).
			div := "relax.floor_divide"
			if fmod {
				div = "relax.divide"
			}
			q, err := im.emit(div, nil, x, y)
			if err != nil {
				return nil, err
			}
			qy, err := im.emit("relax.multiply", nil, q, y)
			if err != nil {
				return nil, err
			}
			return ret(im.emit("relax.subtract", nil, x, qy))
		}
		// C's fmod: x − trunc(x / y)·y.
		q, err := im.emit("relax.divide", nil, x, y)
		if err != nil {
			return nil, err
		}
		neg, err := im.emit("relax.less", nil, q, scalar(q.dtype(), 0))
		if err != nil {
			return nil, err
		}
		c, err := im.emit("relax.ceil", nil, q)
		if err != nil {
			return nil, err
		}
		f, err := im.emit("relax.floor", nil, q)
		if err != nil {
			return nil, err
		}
		t, err := im.emit("relax.where", nil, neg, c, f)
		if err != nil {
			return nil, err
		}
		ty, err := im.emit("relax.multiply", nil, t, y)
		if err != nil {
			return nil, err
		}
		return ret(im.emit("relax.subtract", nil, x, ty))
	})
	reg("Trilu", 14, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		k := int64(0)
		if t, err := n.knownInput(1, "k"); err != nil {
			return nil, err
		} else if t != nil {
			k = t.ielem(0)
		}
		s := x.shape()
		if len(s) < 2 {
			return nil, fmt.Errorf("Trilu of rank %d, want at least 2", len(s))
		}
		rows, cols := s[len(s)-2], s[len(s)-1]
		upper := n.attrInt("upper", 1) != 0
		mask := newTensor(ir.Bool, []int64{rows, cols})
		for i := range rows {
			for j := range cols {
				keep := j-i >= k
				if !upper {
					keep = j-i <= k
				}
				setElem(mask.Data, ir.Bool, int(i*cols+j), b2f(keep))
			}
		}
		return ret(im.emit("relax.where", nil, constant(mask), x, scalar(x.dtype(), 0)))
	})
	reg("Tile", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		t, err := n.knownInput(1, "repeats")
		if err != nil {
			return nil, err
		}
		if t == nil || int(t.NumElements()) != x.rank() {
			return nil, fmt.Errorf("repeats must have one value per axis")
		}
		for a, r := range t.Ints() {
			if r == 1 {
				continue
			}
			if r < 0 {
				return nil, fmt.Errorf("negative repeat %d", r)
			}
			d := x.shape()[a]
			idx := make([]int64, 0, d*r)
			for range r {
				for i := range d {
					idx = append(idx, i)
				}
			}
			if x, err = im.take(x, idx, a); err != nil {
				return nil, err
			}
		}
		return []*value{x}, nil
	})
	reg("EyeLike", 9, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		s := x.shape()
		if len(s) != 2 {
			return nil, fmt.Errorf("EyeLike of rank %d, want 2", len(s))
		}
		dt := x.dtype()
		if a, ok := n.attrs["dtype"]; ok {
			if dt, err = dtypeOf(int32(a.GetI())); err != nil {
				return nil, err
			}
		}
		k := n.attrInt("k", 0)
		t := newTensor(dt, s)
		for i := range s[0] {
			if j := i + k; j >= 0 && j < s[1] {
				setElem(t.Data, dt, int(i*s[1]+j), 1)
			}
		}
		return []*value{constant(t)}, nil
	})
	reg("CumSum", 11, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		at, err := n.knownInput(1, "axis")
		if err != nil {
			return nil, err
		}
		if at == nil {
			return nil, fmt.Errorf("input 1 (axis) is missing")
		}
		axis, err := normAxis(at.ielem(0), x.rank())
		if err != nil {
			return nil, err
		}
		if !x.dtype().IsFloat() {
			return nil, unsupported("CumSum of %s", x.dtype())
		}
		// Along the axis, the cumulative sum is a product with a
		// triangular matrix of ones: x moved to the last axis · T.
		d := x.shape()[axis]
		tri := newTensor(x.dtype(), []int64{d, d})
		excl, rev := n.attrInt("exclusive", 0) != 0, n.attrInt("reverse", 0) != 0
		for i := range d {
			for j := range d {
				in := i <= j // input i contributes to output j
				if rev {
					in = i >= j
				}
				if excl && i == j {
					in = false
				}
				setElem(tri.Data, tri.DType, int(i*d+j), b2f(in))
			}
		}
		r := x.rank()
		perm, inv := axisLast(r, axis)
		xt := x
		if axis != r-1 {
			if xt, err = im.emit("relax.permute_dims", map[string]any{"axes": anyInts(perm)}, x); err != nil {
				return nil, err
			}
		}
		y, err := im.emit("relax.matmul", nil, xt, constant(tri))
		if err != nil || axis == r-1 {
			return []*value{y}, err
		}
		return ret(im.emit("relax.permute_dims", map[string]any{"axes": anyInts(inv)}, y))
	})
	reg("OneHot", 11, func(im *importer, n *node) ([]*value, error) {
		idx, err := n.need(0)
		if err != nil {
			return nil, err
		}
		dt, err := n.knownInput(1, "depth")
		if err != nil {
			return nil, err
		}
		vals, err := n.need(2)
		if err != nil {
			return nil, err
		}
		if dt == nil || dt.NumElements() != 1 || vals.rank() != 1 || vals.shape()[0] != 2 {
			return nil, fmt.Errorf("depth must be a scalar and values a pair")
		}
		depth := int64(dt.elem(0))
		r := idx.rank() + 1
		axis, err := normAxis(n.attrInt("axis", -1), r)
		if err != nil {
			return nil, err
		}
		// Negative indices count from depth; compare in int64 with an iota
		// laid along the axis.
		ix, err := im.cast(idx, ir.Int64)
		if err != nil {
			return nil, err
		}
		neg, err := im.emit("relax.less", nil, ix, scalar(ir.Int64, 0))
		if err != nil {
			return nil, err
		}
		wrapped, err := im.emit("relax.add", nil, ix, scalar(ir.Int64, float64(depth)))
		if err != nil {
			return nil, err
		}
		if ix, err = im.emit("relax.where", nil, neg, wrapped, ix); err != nil {
			return nil, err
		}
		es := append([]int64{}, idx.shape()...)
		es = append(es[:axis], append([]int64{1}, es[axis:]...)...)
		if ix, err = im.reshape(ix, es); err != nil {
			return nil, err
		}
		iotaShape := make([]int64, r)
		for i := range iotaShape {
			iotaShape[i] = 1
		}
		iotaShape[axis] = depth
		iota := newTensor(ir.Int64, iotaShape)
		for i := range depth {
			putInt(iota.Data, ir.Int64, int(i), i)
		}
		eq, err := im.emit("relax.equal", nil, ix, constant(iota))
		if err != nil {
			return nil, err
		}
		off, err := im.slice(vals, []int{0}, []int64{0}, []int64{1}, []int64{1})
		if err != nil {
			return nil, err
		}
		on, err := im.slice(vals, []int{0}, []int64{1}, []int64{2}, []int64{1})
		if err != nil {
			return nil, err
		}
		return ret(im.emit("relax.where", nil, eq, on, off))
	})
	reg("GatherElements", 11, func(im *importer, n *node) ([]*value, error) {
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
		return ret(im.gatherElements(x, idx, axis))
	})
	reg("GatherND", 11, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		idx, err := n.need(1)
		if err != nil {
			return nil, err
		}
		b := int64(0)
		if n.opset >= 12 {
			b = n.attrInt("batch_dims", 0)
		}
		return ret(im.gatherND(x, idx, b))
	})
	scatterElements := func(im *importer, n *node) ([]*value, error) {
		x, idx, upd, err := scatterInputs(n)
		if err != nil {
			return nil, err
		}
		if !slices.Equal(idx.shape(), upd.shape()) || upd.dtype() != x.dtype() {
			return nil, fmt.Errorf("updates %s%v for indices of shape %v and data of %s", upd.dtype(), upd.shape(), idx.shape(), x.dtype())
		}
		red, err := scatterReduction(n)
		if err != nil {
			return nil, err
		}
		axis, err := normAxis(n.attrInt("axis", 0), x.rank())
		if err != nil {
			return nil, err
		}
		at, err := im.elementIndex(x, idx, axis)
		if err != nil {
			return nil, err
		}
		return ret(im.scatter(x, at, upd, numElements(x.shape()), 1, red))
	}
	reg("ScatterElements", 11, scatterElements)
	reg("Scatter", 9, scatterElements)
	reg("ScatterND", 11, func(im *importer, n *node) ([]*value, error) {
		x, idx, upd, err := scatterInputs(n)
		if err != nil {
			return nil, err
		}
		red, err := scatterReduction(n)
		if err != nil {
			return nil, err
		}
		xs, is := x.shape(), idx.shape()
		if len(is) < 1 || is[len(is)-1] < 1 || is[len(is)-1] > int64(len(xs)) {
			return nil, fmt.Errorf("indices of shape %v for data of shape %v", is, xs)
		}
		k := is[len(is)-1]
		want := append(append([]int64{}, is[:len(is)-1]...), xs[k:]...)
		if !slices.Equal(upd.shape(), want) || upd.dtype() != x.dtype() {
			return nil, fmt.Errorf("updates %s%v, want %s%v", upd.dtype(), upd.shape(), x.dtype(), want)
		}
		at, err := im.rowIndex(x, idx, 0)
		if err != nil {
			return nil, err
		}
		return ret(im.scatter(x, at, upd, numElements(xs[:k]), numElements(xs[k:]), red))
	})
	reg("Hardmax", 13, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		axis, err := normAxis(n.attrInt("axis", -1), x.rank())
		if err != nil {
			return nil, err
		}
		// 1 at the first maximum along the axis: the argmax compared with
		// an iota laid along the axis.
		am, err := im.emit("relax.argmax", map[string]any{"axis": int64(axis), "keepdims": true}, x)
		if err != nil {
			return nil, err
		}
		is := make([]int64, x.rank())
		for i := range is {
			is[i] = 1
		}
		d := x.shape()[axis]
		is[axis] = d
		iota := newTensor(ir.Int64, is)
		for i := range d {
			putInt(iota.Data, ir.Int64, int(i), i)
		}
		eq, err := im.emit("relax.equal", nil, am, constant(iota))
		if err != nil {
			return nil, err
		}
		return ret(im.cast(eq, x.dtype()))
	})
	reg("NegativeLogLikelihoodLoss", 12, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		t, err := n.need(1)
		if err != nil {
			return nil, err
		}
		return ret(im.nllLoss(n, x, t, n.input(2)))
	})
	reg("SoftmaxCrossEntropyLoss", 12, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		t, err := n.need(1)
		if err != nil {
			return nil, err
		}
		lp, err := im.emit("relax.nn.log_softmax", map[string]any{"axis": int64(1)}, x)
		if err != nil {
			return nil, err
		}
		loss, err := im.nllLoss(n, lp, t, n.input(2))
		if err != nil {
			return nil, err
		}
		return []*value{loss, lp}, nil
	})
	reg("IsInf", 10, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		dt := x.dtype()
		big, ok := map[uint8]float64{16: 65504, 32: math.MaxFloat32, 64: math.MaxFloat64}[dt.Bits]
		if !dt.IsFloat() || !ok {
			return nil, unsupported("IsInf of %s", dt)
		}
		// An infinity is beyond the largest finite value of its dtype
		// (a comparison with an infinite constant is left out).
		pos, neg := n.attrInt("detect_positive", 1) != 0, n.attrInt("detect_negative", 1) != 0
		switch {
		case pos && neg:
			a, err := im.emit("relax.abs", nil, x)
			if err != nil {
				return nil, err
			}
			return ret(im.emit("relax.greater", nil, a, scalar(dt, big)))
		case pos:
			return ret(im.emit("relax.greater", nil, x, scalar(dt, big)))
		case neg:
			return ret(im.emit("relax.less", nil, x, scalar(dt, -big)))
		}
		// Neither: false everywhere (NaN included).
		a, err := im.emit("relax.abs", nil, x)
		if err != nil {
			return nil, err
		}
		return ret(im.emit("relax.less", nil, a, scalar(dt, -1)))
	})
	reg("BitShift", 11, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		s, err := n.need(1)
		if err != nil {
			return nil, err
		}
		dt := x.dtype()
		if dt.Code != ndarray.UInt || s.dtype() != dt {
			return nil, fmt.Errorf("BitShift of %s by %s, want the same unsigned integer type", dt, s.dtype())
		}
		// x << s is x * 2^s (wrapping as the shift does), x >> s is
		// x / 2^s; 2^s fits the type for every shift the type allows.
		p, err := im.emit("relax.power", nil, scalar(dt, 2), s)
		if err != nil {
			return nil, err
		}
		switch d := n.attrString("direction", ""); d {
		case "LEFT":
			return ret(im.emit("relax.multiply", nil, x, p))
		case "RIGHT":
			return ret(im.emit("relax.divide", nil, x, p))
		default:
			return nil, fmt.Errorf("BitShift direction %q, want LEFT or RIGHT", d)
		}
	})
	reg("Shrink", 9, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		dt := x.dtype()
		if !dt.IsFloat() {
			return nil, unsupported("Shrink of %s", dt)
		}
		// y = x + bias where x < -lambd, x - bias where x > lambd, else 0.
		lambd, bias := n.attrFloat("lambd", 0.5), n.attrFloat("bias", 0)
		lo, err := im.emit("relax.less", nil, x, scalar(dt, -lambd))
		if err != nil {
			return nil, err
		}
		hi, err := im.emit("relax.greater", nil, x, scalar(dt, lambd))
		if err != nil {
			return nil, err
		}
		up, err := im.emit("relax.add", nil, x, scalar(dt, bias))
		if err != nil {
			return nil, err
		}
		down, err := im.emit("relax.subtract", nil, x, scalar(dt, bias))
		if err != nil {
			return nil, err
		}
		inner, err := im.emit("relax.where", nil, hi, down, scalar(dt, 0))
		if err != nil {
			return nil, err
		}
		return ret(im.emit("relax.where", nil, lo, up, inner))
	})
	for name, toDepth := range map[string]bool{"SpaceToDepth": true, "DepthToSpace": false} {
		reg(name, 7, func(im *importer, n *node) ([]*value, error) {
			x, err := n.need(0)
			if err != nil {
				return nil, err
			}
			s := x.shape()
			b := n.attrInt("blocksize", 0)
			if len(s) != 4 || b <= 0 {
				return nil, fmt.Errorf("want 4-D data and a positive blocksize")
			}
			nn, c, h, w := s[0], s[1], s[2], s[3]
			var shape1, shape2 []int64
			var perm []int
			switch {
			case toDepth:
				shape1, perm, shape2 = []int64{nn, c, h / b, b, w / b, b}, []int{0, 3, 5, 1, 2, 4}, []int64{nn, c * b * b, h / b, w / b}
			case n.attrString("mode", "DCR") == "CRD":
				shape1, perm, shape2 = []int64{nn, c / (b * b), b, b, h, w}, []int{0, 1, 4, 2, 5, 3}, []int64{nn, c / (b * b), h * b, w * b}
			default:
				shape1, perm, shape2 = []int64{nn, b, b, c / (b * b), h, w}, []int{0, 3, 4, 1, 5, 2}, []int64{nn, c / (b * b), h * b, w * b}
			}
			r, err := im.reshape(x, shape1)
			if err != nil {
				return nil, err
			}
			t, err := im.emit("relax.permute_dims", map[string]any{"axes": anyInts(perm)}, r)
			if err != nil {
				return nil, err
			}
			return ret(im.reshape(t, shape2))
		})
	}
	for name, f := range map[string]func(im *importer, x *value) (*value, error){
		"Tan": func(im *importer, x *value) (*value, error) {
			s, err := im.emit("relax.sin", nil, x)
			if err != nil {
				return nil, err
			}
			c, err := im.emit("relax.cos", nil, x)
			if err != nil {
				return nil, err
			}
			return im.emit("relax.divide", nil, s, c)
		},
		"Sinh": func(im *importer, x *value) (*value, error) { return im.expPair(x, -1) },
		"Cosh": func(im *importer, x *value) (*value, error) { return im.expPair(x, 1) },
		"IsNaN": func(im *importer, x *value) (*value, error) {
			return im.emit("relax.not_equal", nil, x, x)
		},
	} {
		since := int64(9)
		if name == "Tan" {
			since = 7
		}
		reg(name, since, func(im *importer, n *node) ([]*value, error) {
			x, err := n.need(0)
			if err != nil {
				return nil, err
			}
			if !x.dtype().IsFloat() {
				return nil, unsupported("%s of %s", name, x.dtype())
			}
			return ret(f(im, x))
		})
	}
}

// expPair is (eˣ + sign·e⁻ˣ)/2: cosh for sign 1, sinh for −1.
func (im *importer) expPair(x *value, sign float64) (*value, error) {
	e, err := im.emit("relax.exp", nil, x)
	if err != nil {
		return nil, err
	}
	nx, err := im.emit("relax.negative", nil, x)
	if err != nil {
		return nil, err
	}
	en, err := im.emit("relax.exp", nil, nx)
	if err != nil {
		return nil, err
	}
	opName := "relax.add"
	if sign < 0 {
		opName = "relax.subtract"
	}
	s, err := im.emit(opName, nil, e, en)
	if err != nil {
		return nil, err
	}
	return im.emit("relax.multiply", nil, s, scalar(x.dtype(), 0.5))
}

// take gathers constant indices along axis.
func (im *importer) take(x *value, idx []int64, axis int) (*value, error) {
	if x.known() {
		if t, err := hostGather(x.c, intTensor(idx), axis); err == nil && t.NumElements() <= foldLimit {
			return constant(t), nil
		}
	}
	return im.emit("relax.take", map[string]any{"axis": int64(axis)}, x, constant(intTensor(idx)))
}

// gatherElements is ONNX's GatherElements: out[p] = x[p with p[axis] =
// idx[p]], a take from the flat data at base[p] + idx[p]·stride, base
// being p's flat index with p[axis] = 0.
func (im *importer) gatherElements(x, idx *value, axis int) (*value, error) {
	flatIdx, err := im.elementIndex(x, idx, axis)
	if err != nil {
		return nil, err
	}
	flat, err := im.reshape(x, []int64{numElements(x.shape())})
	if err != nil {
		return nil, err
	}
	return im.emit("relax.take", map[string]any{"axis": int64(0)}, flat, flatIdx)
}

// elementIndex is, for each element of idx (of x's rank), the flat
// offset in x of the element it names along axis (GatherElements and
// ScatterElements); negative indices count from the end.
func (im *importer) elementIndex(x, idx *value, axis int) (*value, error) {
	xs, is := x.shape(), idx.shape()
	if len(is) != len(xs) {
		return nil, fmt.Errorf("indices of rank %d for data of rank %d", len(is), len(xs))
	}
	str := stridesOf(xs)
	base := newTensor(ir.Int64, is)
	istr := stridesOf(is)
	for f := range numElements(is) {
		off := int64(0)
		for d := range is {
			if d != axis {
				off += f / istr[d] % is[d] * str[d]
			}
		}
		putInt(base.Data, ir.Int64, int(f), off)
	}
	ix, err := im.cast(idx, ir.Int64)
	if err != nil {
		return nil, err
	}
	neg, err := im.emit("relax.less", nil, ix, scalar(ir.Int64, 0))
	if err != nil {
		return nil, err
	}
	wrapped, err := im.emit("relax.add", nil, ix, scalar(ir.Int64, float64(xs[axis])))
	if err != nil {
		return nil, err
	}
	if ix, err = im.emit("relax.where", nil, neg, wrapped, ix); err != nil {
		return nil, err
	}
	scaled, err := im.emit("relax.multiply", nil, ix, scalar(ir.Int64, float64(str[axis])))
	if err != nil {
		return nil, err
	}
	return im.emit("relax.add", nil, scaled, constant(base))
}

// gatherND is GatherND of x by idx with b batch dimensions: each row of
// idx (its last axis, k long) picks x[batch…, row…] (a slice of rank
// rank(x)-b-k). The rows become indices into x flattened over its first
// b+k axes, taken at once.
func (im *importer) gatherND(x, idx *value, b int64) (*value, error) {
	flatIdx, err := im.rowIndex(x, idx, b)
	if err != nil {
		return nil, err
	}
	xs, k := x.shape(), idx.shape()[len(idx.shape())-1]
	flat, err := im.reshape(x, append([]int64{numElements(xs[:b+k])}, xs[b+k:]...))
	if err != nil {
		return nil, err
	}
	return im.emit("relax.take", map[string]any{"axis": int64(0)}, flat, flatIdx)
}

// rowIndex is, for each row of idx (its last axis), the offset of the
// slice it names in x flattened over its first b+k axes (GatherND and
// ScatterND); negative indices count from the end.
func (im *importer) rowIndex(x, idx *value, b int64) (*value, error) {
	xs, is := x.shape(), idx.shape()
	q, r := int64(len(is)), int64(len(xs))
	if q < 1 || b < 0 || b >= q || b >= r {
		return nil, fmt.Errorf("batch_dims %d for data of rank %d and indices of rank %d", b, r, q)
	}
	k := is[q-1]
	if k < 1 || b+k > r {
		return nil, fmt.Errorf("index rows of length %d for data of rank %d with batch_dims %d", k, r, b)
	}
	for d := range b {
		if is[d] != xs[d] {
			return nil, fmt.Errorf("batch dim %d is %d in the indices and %d in the data", d, is[d], xs[d])
		}
	}
	// dims and strides of the indexed axes, laid along the rows' axis.
	dims, strides := newTensor(ir.Int64, []int64{k}), newTensor(ir.Int64, []int64{k})
	st := int64(1)
	for j := k - 1; j >= 0; j-- {
		putInt(dims.Data, ir.Int64, int(j), xs[b+j])
		putInt(strides.Data, ir.Int64, int(j), st)
		st *= xs[b+j]
	}
	// base: the offset of each row's batch in the flattened data.
	rows := is[:q-1]
	base := newTensor(ir.Int64, rows)
	rstr := stridesOf(rows)
	for f := range numElements(rows) {
		bi := int64(0)
		for d := range b {
			bi = bi*xs[d] + f/rstr[d]%rows[d]
		}
		putInt(base.Data, ir.Int64, int(f), bi*st)
	}
	ix, err := im.cast(idx, ir.Int64)
	if err != nil {
		return nil, err
	}
	neg, err := im.emit("relax.less", nil, ix, scalar(ir.Int64, 0))
	if err != nil {
		return nil, err
	}
	wrapped, err := im.emit("relax.add", nil, ix, constant(dims))
	if err != nil {
		return nil, err
	}
	if ix, err = im.emit("relax.where", nil, neg, wrapped, ix); err != nil {
		return nil, err
	}
	scaled, err := im.emit("relax.multiply", nil, ix, constant(strides))
	if err != nil {
		return nil, err
	}
	off, err := im.emit("relax.sum", map[string]any{"axis": anyInts([]int64{q - 1}), "keepdims": false}, scaled)
	if err != nil {
		return nil, err
	}
	return im.emit("relax.add", nil, off, constant(base))
}

// scatterRows writes the rows of upd [U, S] into the rows of data
// [R, S] that at [U] names (ScatterND and ScatterElements): replacing
// them (reduction "none"; of duplicate indices the sum lands) or adding
// to them ("add"). Every update is compared with every row, so the work
// is U·R·S.
func (im *importer) scatterRows(data, at, upd *value, reduction string) (*value, error) {
	ds, us := data.shape(), upd.shape()
	r, u, sl := ds[0], us[0], ds[1]
	iota := newTensor(ir.Int64, []int64{1, r})
	for i := range r {
		putInt(iota.Data, ir.Int64, int(i), i)
	}
	at2, err := im.reshape(at, []int64{u, 1})
	if err != nil {
		return nil, err
	}
	m, err := im.emit("relax.equal", nil, at2, constant(iota)) // [U, R]
	if err != nil {
		return nil, err
	}
	m3, err := im.reshape(m, []int64{u, r, 1})
	if err != nil {
		return nil, err
	}
	u3, err := im.reshape(upd, []int64{u, 1, sl})
	if err != nil {
		return nil, err
	}
	switch reduction {
	case "mul":
		// The updates landing on a row multiplied together (1 where
		// none lands), times the data.
		g := im.builder()
		p := g.prod(g.op("where", nil, m3, u3, scalar(data.dtype(), 1)), []int{0}, false)
		return g.one(g.op("multiply", nil, data, p))
	case "max", "min":
		g := im.builder()
		d3 := g.reshape(data, []int64{1, r, sl})
		return g.one(g.op(reduction, map[string]any{"axis": anyInts([]int64{0}), "keepdims": false}, g.op("where", nil, m3, u3, d3)))
	}
	picked, err := im.emit("relax.where", nil, m3, u3, scalar(data.dtype(), 0)) // [U, R, S]
	if err != nil {
		return nil, err
	}
	contrib, err := im.emit("relax.sum", map[string]any{"axis": anyInts([]int64{0}), "keepdims": false}, picked)
	if err != nil {
		return nil, err
	}
	if reduction == "add" {
		return im.emit("relax.add", nil, data, contrib)
	}
	mi, err := im.cast(m, ir.Int64)
	if err != nil {
		return nil, err
	}
	hits, err := im.emit("relax.sum", map[string]any{"axis": anyInts([]int64{0}), "keepdims": false}, mi)
	if err != nil {
		return nil, err
	}
	hit, err := im.emit("relax.greater", nil, hits, scalar(ir.Int64, 0))
	if err != nil {
		return nil, err
	}
	hit2, err := im.reshape(hit, []int64{r, 1})
	if err != nil {
		return nil, err
	}
	return im.emit("relax.where", nil, hit2, contrib, data)
}

// scatterInputs returns a Scatter operator's data, indices and updates.
func scatterInputs(n *node) (x, idx, upd *value, err error) {
	if x, err = n.need(0); err != nil {
		return nil, nil, nil, err
	}
	if idx, err = n.need(1); err != nil {
		return nil, nil, nil, err
	}
	upd, err = n.need(2)
	return x, idx, upd, err
}

// scatter is scatterRows of x seen as r rows of sl elements, at naming a
// row for each sl-element row of upd; the result has x's shape.
func (im *importer) scatter(x, at, upd *value, r, sl int64, reduction string) (*value, error) {
	nu := numElements(upd.shape()) / sl
	at1, err := im.reshape(at, []int64{nu})
	if err != nil {
		return nil, err
	}
	u2, err := im.reshape(upd, []int64{nu, sl})
	if err != nil {
		return nil, err
	}
	d2, err := im.reshape(x, []int64{r, sl})
	if err != nil {
		return nil, err
	}
	out, err := im.scatterRows(d2, at1, u2, reduction)
	if err != nil {
		return nil, err
	}
	return im.reshape(out, x.shape())
}

// scatterReduction reads a Scatter operator's reduction attribute, the
// ones kiln imports.
func scatterReduction(n *node) (string, error) {
	red := n.attrString("reduction", "none")
	switch {
	case red == "mul" && n.opset >= 16, (red == "max" || red == "min") && n.opset >= 18:
		return red, nil
	}
	if red != "none" && red != "add" {
		return "", unsupported("%s with reduction %q", n.p.GetOpType(), red)
	}
	return red, nil
}

// nllLoss is NegativeLogLikelihoodLoss of x [N, C, d…] (log-probabilities)
// and targets t [N, d…]: −x[n, t, d…]·w[t], zero where t is ignore_index,
// reduced by none, sum or mean (over the weights taken).
func (im *importer) nllLoss(n *node, x, t, w *value) (*value, error) {
	xs, ts := x.shape(), t.shape()
	if len(xs) < 2 || len(ts) != len(xs)-1 {
		return nil, fmt.Errorf("input of shape %v and target of shape %v do not fit", xs, ts)
	}
	ti, err := im.cast(t, ir.Int64)
	if err != nil {
		return nil, err
	}
	var mask *value
	if _, ok := n.attrs["ignore_index"]; ok {
		if mask, err = im.emit("relax.not_equal", nil, ti, scalar(ir.Int64, float64(n.attrInt("ignore_index", 0)))); err != nil {
			return nil, err
		}
		if ti, err = im.emit("relax.where", nil, mask, ti, scalar(ir.Int64, 0)); err != nil {
			return nil, err
		}
	}
	es := append([]int64{ts[0], 1}, ts[1:]...)
	ti1, err := im.reshape(ti, es)
	if err != nil {
		return nil, err
	}
	g, err := im.gatherElements(x, ti1, 1)
	if err != nil {
		return nil, err
	}
	if g, err = im.reshape(g, ts); err != nil {
		return nil, err
	}
	dt := x.dtype()
	var wt *value
	if w != nil {
		if wt, err = im.emit("relax.take", map[string]any{"axis": int64(0)}, w, ti); err != nil {
			return nil, err
		}
	}
	if mask != nil {
		if wt == nil {
			wt = constant(hostExpand(scalarTensor(dt, 1), ts))
		}
		if wt, err = im.emit("relax.where", nil, mask, wt, scalar(dt, 0)); err != nil {
			return nil, err
		}
	}
	loss, err := im.emit("relax.negative", nil, g)
	if err != nil {
		return nil, err
	}
	if wt != nil {
		if loss, err = im.emit("relax.multiply", nil, loss, wt); err != nil {
			return nil, err
		}
	}
	all := map[string]any{"axis": nil, "keepdims": false}
	switch red := n.attrString("reduction", "mean"); red {
	case "none":
		return loss, nil
	case "sum":
		return im.emit("relax.sum", all, loss)
	case "mean":
		s, err := im.emit("relax.sum", all, loss)
		if err != nil {
			return nil, err
		}
		if wt == nil {
			return im.emit("relax.divide", nil, s, scalar(dt, float64(numElements(ts))))
		}
		ws, err := im.emit("relax.sum", all, wt)
		if err != nil {
			return nil, err
		}
		return im.emit("relax.divide", nil, s, ws)
	default:
		return nil, unsupported("reduction %q", red)
	}
}
