package onnx

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// gb emits a run of graph operators for one conversion, keeping the
// first error: once a step fails the later ones do nothing and return
// nil, and result reports the error. It spares the converters of the
// larger operators an error check per step.
type gb struct {
	im  *importer
	err error
}

func (im *importer) builder() *gb { return &gb{im: im} }

// op emits a call of opName ("relax." is prefixed when missing).
func (g *gb) op(opName string, attrs map[string]any, args ...any) *value {
	if g.err != nil {
		return nil
	}
	if len(opName) < 6 || opName[:6] != "relax." {
		opName = "relax." + opName
	}
	for i, a := range args {
		if v, ok := a.(*value); ok && v == nil {
			g.err = fmt.Errorf("%s: argument %d is missing", opName, i)
			return nil
		}
	}
	v, err := g.im.emit(opName, attrs, args...)
	g.err = err
	return v
}

// fail records err (when it is the first) and returns nil.
func (g *gb) fail(err error) *value {
	if g.err == nil {
		g.err = err
	}
	return nil
}

// keep records err from a helper that returned v.
func (g *gb) keep(v *value, err error) *value {
	if g.err != nil {
		return nil
	}
	if err != nil {
		return g.fail(err)
	}
	return v
}

// do runs f unless a step failed already.
func (g *gb) do(f func() (*value, error)) *value {
	if g.err != nil {
		return nil
	}
	return g.keep(f())
}

func (g *gb) cast(x *value, dt ir.DType) *value {
	if g.err != nil {
		return nil
	}
	return g.keep(g.im.cast(x, dt))
}

func (g *gb) reshape(x *value, shape []int64) *value {
	if g.err != nil {
		return nil
	}
	return g.keep(g.im.reshape(x, shape))
}

func (g *gb) slice(x *value, axes []int, begin, end, step []int64) *value {
	if g.err != nil {
		return nil
	}
	return g.keep(g.im.slice(x, axes, begin, end, step))
}

// slice1 takes [b, e) of one axis.
func (g *gb) slice1(x *value, axis int, b, e int64) *value {
	return g.slice(x, []int{axis}, []int64{b}, []int64{e}, []int64{1})
}

func (g *gb) concat(parts []*value, axis int) *value {
	if g.err != nil {
		return nil
	}
	return g.keep(g.im.concat(parts, axis))
}

func (g *gb) permute(x *value, perm []int) *value {
	return g.op("permute_dims", map[string]any{"axes": anyInts(perm)}, x)
}

// sum adds x over axes.
func (g *gb) sum(x *value, axes []int, keep bool) *value {
	return g.op("sum", map[string]any{"axis": anyInts(axes), "keepdims": keep}, x)
}

// result returns v, or the first error.
func (g *gb) result(vs ...*value) ([]*value, error) {
	if g.err != nil {
		return nil, g.err
	}
	return vs, nil
}

// one returns v, or the first error.
func (g *gb) one(v *value) (*value, error) {
	if g.err != nil {
		return nil, g.err
	}
	return v, nil
}

// prod multiplies x over axes.
func (g *gb) prod(x *value, axes []int, keep bool) *value {
	if g.err != nil {
		return nil
	}
	return g.keep(g.im.prod(x, axes, keep))
}

// inputs returns the node's first k inputs, which must all be present.
func (n *node) inputs(k int) ([]*value, error) {
	out := make([]*value, k)
	for i := range out {
		v, err := n.need(i)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// iotaAlong is 0…d−1 laid along axis of a rank-r tensor of ones
// elsewhere, in dtype dt.
func iotaAlong(dt ir.DType, d int64, axis, r int) *value {
	s := make([]int64, r)
	for i := range s {
		s[i] = 1
	}
	s[axis] = d
	t := newTensor(dt, s)
	for i := range d {
		if dt.IsFloat() {
			setElem(t.Data, dt, int(i), float64(i))
		} else {
			setIElem(t.Data, dt, int(i), i)
		}
	}
	return constant(t)
}

// axisLast is the permutation of rank r moving axis to the end, and its
// inverse.
func axisLast(r, axis int) (perm, inv []int) {
	perm = make([]int, 0, r)
	for i := range r {
		if i != axis {
			perm = append(perm, i)
		}
	}
	perm = append(perm, axis)
	inv = make([]int, r)
	for i, p := range perm {
		inv[p] = i
	}
	return perm, inv
}
