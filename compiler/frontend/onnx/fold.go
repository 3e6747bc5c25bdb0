package onnx

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/ndarray"
)

// Host arithmetic on Tensors, for the values known at import time (shape
// subgraphs, Constant nodes, initializers feeding shape arguments).

// elem reads element i as a float64.
func (t *Tensor) elem(i int) float64 {
	le := binary.LittleEndian
	switch t.DType {
	case ir.Float32:
		return float64(math.Float32frombits(le.Uint32(t.Data[4*i:])))
	case ir.Float64:
		return math.Float64frombits(le.Uint64(t.Data[8*i:]))
	case ir.Float16:
		return float64(halfToFloat(le.Uint16(t.Data[2*i:])))
	case ndarray.BFloat16:
		return float64(math.Float32frombits(uint32(le.Uint16(t.Data[2*i:])) << 16))
	}
	return float64(t.ielem(i))
}

// ielem reads element i as an int64 (floats truncate).
func (t *Tensor) ielem(i int) int64 {
	le := binary.LittleEndian
	switch t.DType {
	case ir.Int64:
		return int64(le.Uint64(t.Data[8*i:]))
	case ir.Uint64:
		return int64(le.Uint64(t.Data[8*i:]))
	case ir.Int32:
		return int64(int32(le.Uint32(t.Data[4*i:])))
	case ir.Uint32:
		return int64(le.Uint32(t.Data[4*i:]))
	case ir.Int16:
		return int64(int16(le.Uint16(t.Data[2*i:])))
	case ndarray.Uint16:
		return int64(le.Uint16(t.Data[2*i:]))
	case ir.Int8:
		return int64(int8(t.Data[i]))
	case ir.Uint8, ir.Bool:
		return int64(t.Data[i])
	}
	return int64(t.elem(i))
}

// Ints returns the elements as int64s.
func (t *Tensor) Ints() []int64 {
	out := make([]int64, t.NumElements())
	for i := range out {
		out[i] = t.ielem(i)
	}
	return out
}

// Floats returns the elements as float64s.
func (t *Tensor) Floats() []float64 {
	out := make([]float64, t.NumElements())
	for i := range out {
		out[i] = t.elem(i)
	}
	return out
}

// setElem writes v as element i, converting to the dtype (C's
// conversions: floats to integers truncate).
func setElem(b []byte, dt ir.DType, i int, v float64) {
	le := binary.LittleEndian
	switch dt {
	case ir.Float32:
		le.PutUint32(b[4*i:], math.Float32bits(float32(v)))
	case ir.Float64:
		le.PutUint64(b[8*i:], math.Float64bits(v))
	case ir.Float16:
		le.PutUint16(b[2*i:], floatToHalf(float32(v)))
	case ndarray.BFloat16:
		le.PutUint16(b[2*i:], floatToBFloat16(float32(v)))
	case ir.Bool:
		if v != 0 {
			b[i] = 1
		} else {
			b[i] = 0
		}
	default:
		putInt(b, dt, i, int64(v))
	}
}

func setIElem(b []byte, dt ir.DType, i int, v int64) {
	if dt.IsFloat() || dt == ir.Bool {
		setElem(b, dt, i, float64(v))
		return
	}
	putInt(b, dt, i, v)
}

func newTensor(dt ir.DType, shape []int64) *Tensor {
	return &Tensor{DType: dt, Shape: append([]int64{}, shape...), Data: make([]byte, numElements(shape)*int64(dt.Size()))}
}

// intTensor is a 1-D int64 tensor of vs (a scalar when scalar is set).
func intTensor(vs []int64, shape ...int64) *Tensor {
	if shape == nil {
		shape = []int64{int64(len(vs))}
	}
	t := newTensor(ir.Int64, shape)
	for i, v := range vs {
		putInt(t.Data, ir.Int64, i, v)
	}
	return t
}

// scalarTensor is a 0-d tensor of dtype dt holding v.
func scalarTensor(dt ir.DType, v float64) *Tensor {
	t := newTensor(dt, nil)
	setElem(t.Data, dt, 0, v)
	return t
}

// cast converts t to dt.
func (t *Tensor) cast(dt ir.DType) *Tensor {
	out := newTensor(dt, t.Shape)
	n := int(t.NumElements())
	for i := range n {
		if t.DType.IsFloat() || dt.IsFloat() || dt == ir.Bool {
			setElem(out.Data, dt, i, t.elem(i))
		} else {
			setIElem(out.Data, dt, i, t.ielem(i))
		}
	}
	return out
}

// strides of a row-major shape.
func stridesOf(shape []int64) []int64 {
	s := make([]int64, len(shape))
	acc := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		s[i] = acc
		acc *= shape[i]
	}
	return s
}

// broadcastShape is numpy's broadcast of two shapes.
func broadcastShape(a, b []int64) ([]int64, error) {
	n := max(len(a), len(b))
	out := make([]int64, n)
	for i := range n {
		da, db := int64(1), int64(1)
		if j := len(a) - n + i; j >= 0 {
			da = a[j]
		}
		if j := len(b) - n + i; j >= 0 {
			db = b[j]
		}
		switch {
		case da == db, db == 1:
			out[i] = da
		case da == 1:
			out[i] = db
		default:
			return nil, fmt.Errorf("shapes %v and %v do not broadcast", a, b)
		}
	}
	return out, nil
}

// bindex maps a flat index of the broadcast shape out to the flat index of
// an operand of shape in.
func bindex(flat int64, out, in []int64) int64 {
	outStr := stridesOf(out)
	inStr := stridesOf(in)
	idx := int64(0)
	off := len(out) - len(in)
	for i := range out {
		c := flat / outStr[i] % max(out[i], 1)
		if j := i - off; j >= 0 && in[j] != 1 {
			idx += c * inStr[j]
		}
	}
	return idx
}

// hostBinary folds a broadcasting binary operator; ints are computed in
// int64 when both operands are integers.
func hostBinary(a, b *Tensor, outDT ir.DType, f func(x, y float64) float64, fi func(x, y int64) int64) (*Tensor, error) {
	shape, err := broadcastShape(a.Shape, b.Shape)
	if err != nil {
		return nil, err
	}
	out := newTensor(outDT, shape)
	n := numElements(shape)
	for i := int64(0); i < n; i++ {
		ia, ib := int(bindex(i, shape, a.Shape)), int(bindex(i, shape, b.Shape))
		if fi != nil && !a.DType.IsFloat() && !b.DType.IsFloat() {
			setIElem(out.Data, outDT, int(i), fi(a.ielem(ia), b.ielem(ib)))
		} else {
			setElem(out.Data, outDT, int(i), f(a.elem(ia), b.elem(ib)))
		}
	}
	return out, nil
}

// gather takes indices along axis, as ONNX's Gather (negative indices
// count from the end).
func hostGather(x, idx *Tensor, axis int) (*Tensor, error) {
	shape := append(append(append([]int64{}, x.Shape[:axis]...), idx.Shape...), x.Shape[axis+1:]...)
	out := newTensor(x.DType, shape)
	outer := numElements(x.Shape[:axis])
	inner := numElements(x.Shape[axis+1:])
	dim := x.Shape[axis]
	es := int64(x.DType.Size())
	ids := idx.Ints()
	pos := int64(0)
	for o := int64(0); o < outer; o++ {
		for _, k := range ids {
			if k < 0 {
				k += dim
			}
			if k < 0 || k >= dim {
				return nil, fmt.Errorf("index %d is out of range for a dimension of %d", k, dim)
			}
			src := (o*dim + k) * inner * es
			copy(out.Data[pos:pos+inner*es], x.Data[src:src+inner*es])
			pos += inner * es
		}
	}
	return out, nil
}

// hostConcat joins tensors along axis.
func hostConcat(ts []*Tensor, axis int) *Tensor {
	shape := append([]int64{}, ts[0].Shape...)
	shape[axis] = 0
	for _, t := range ts {
		shape[axis] += t.Shape[axis]
	}
	out := newTensor(ts[0].DType, shape)
	outer := numElements(shape[:axis])
	es := int64(ts[0].DType.Size())
	pos := int64(0)
	for o := int64(0); o < outer; o++ {
		for _, t := range ts {
			chunk := numElements(t.Shape[axis:]) * es
			copy(out.Data[pos:pos+chunk], t.Data[o*chunk:(o+1)*chunk])
			pos += chunk
		}
	}
	return out
}

// hostSlice takes x[begin:end:step] on each listed axis (already clamped
// by sliceArgs).
func hostSlice(x *Tensor, axes []int, begin, end, step []int64) *Tensor {
	rank := len(x.Shape)
	b := make([]int64, rank)
	s := make([]int64, rank)
	shape := append([]int64{}, x.Shape...)
	for i := range rank {
		s[i] = 1
	}
	for i, a := range axes {
		b[a], s[a] = begin[i], step[i]
		shape[a] = sliceCount(begin[i], end[i], step[i])
	}
	out := newTensor(x.DType, shape)
	inStr := stridesOf(x.Shape)
	outStr := stridesOf(shape)
	es := x.DType.Size()
	n := numElements(shape)
	for i := int64(0); i < n; i++ {
		src := int64(0)
		for d := range rank {
			c := i / outStr[d] % shape[d]
			src += (b[d] + c*s[d]) * inStr[d]
		}
		copy(out.Data[int(i)*es:int(i+1)*es], x.Data[int(src)*es:int(src+1)*es])
	}
	return out
}

func sliceCount(begin, end, step int64) int64 {
	if step > 0 {
		if end <= begin {
			return 0
		}
		return (end - begin + step - 1) / step
	}
	if begin <= end {
		return 0
	}
	return (begin - end - step - 1) / -step
}

// hostTranspose permutes the axes of x.
func hostTranspose(x *Tensor, perm []int) *Tensor {
	shape := make([]int64, len(perm))
	for i, p := range perm {
		shape[i] = x.Shape[p]
	}
	out := newTensor(x.DType, shape)
	inStr := stridesOf(x.Shape)
	outStr := stridesOf(shape)
	es := x.DType.Size()
	n := numElements(shape)
	for i := int64(0); i < n; i++ {
		src := int64(0)
		for d, p := range perm {
			src += (i / outStr[d] % shape[d]) * inStr[p]
		}
		copy(out.Data[int(i)*es:int(i+1)*es], x.Data[int(src)*es:int(src+1)*es])
	}
	return out
}

// hostExpand broadcasts x to shape.
func hostExpand(x *Tensor, shape []int64) *Tensor {
	out := newTensor(x.DType, shape)
	es := x.DType.Size()
	n := numElements(shape)
	for i := int64(0); i < n; i++ {
		src := bindex(i, shape, x.Shape)
		copy(out.Data[int(i)*es:int(i+1)*es], x.Data[int(src)*es:int(src+1)*es])
	}
	return out
}

// reshaped is x with another shape of the same size.
func (t *Tensor) reshaped(shape []int64) *Tensor {
	return &Tensor{Name: t.Name, DType: t.DType, Shape: append([]int64{}, shape...), Data: t.Data}
}

// halfToFloat decodes IEEE binary16 bits.
// floatToBFloat16 rounds f to the nearest bfloat16 (ties to even); NaN
// stays NaN.
func floatToBFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	if f != f {
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

func halfToFloat(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0xff<<23 | frac<<13)
	case exp == 0:
		f := float32(frac) / (1 << 24)
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | frac<<13)
}

// floatToHalf encodes f as binary16, rounding half to even.
func floatToHalf(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	if f != f {
		return sign | 0x7e00
	}
	a := math.Abs(float64(f))
	if a >= 65520 {
		return sign | 0x7c00
	}
	if a < 6.103515625e-05 { // subnormal: multiples of 2^-24
		return sign | uint16(math.RoundToEven(a*(1<<24)))
	}
	exp := int(b>>23&0xff) - 127
	m := a / math.Ldexp(1, exp) // in [1, 2)
	frac := math.RoundToEven((m - 1) * 1024)
	if frac == 1024 {
		frac = 0
		exp++
	}
	return sign | uint16(exp+15)<<10 | uint16(frac)
}
