package topi

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/internal/check"
)

// refMatmul is numpy's matmul on float64 values rounded to float32 per
// product sum at the end.
func refMatmul(a, b arr) arr {
	as, bs := a.shape, b.shape
	aPre, bApp := len(as) == 1, len(bs) == 1
	if aPre {
		as = []int64{1, as[0]}
	}
	if bApp {
		bs = []int64{bs[0], 1}
	}
	ab, bb := as[:len(as)-2], bs[:len(bs)-2]
	nb := max(len(ab), len(bb))
	batch := make([]int64, nb)
	for i := range batch {
		batch[i] = 1
		if j := len(ab) - nb + i; j >= 0 && ab[j] != 1 {
			batch[i] = ab[j]
		}
		if j := len(bb) - nb + i; j >= 0 && bb[j] != 1 {
			batch[i] = bb[j]
		}
	}
	m, k, n := as[len(as)-2], as[len(as)-1], bs[len(bs)-1]
	full := append(append([]int64{}, batch...), m, n)
	res := fill(a.dt, full, func(idx []int64) float64 {
		ai, bi := make([]int64, len(as)), make([]int64, len(bs))
		for j := range ab {
			if ab[j] != 1 {
				ai[j] = idx[nb-len(ab)+j]
			}
		}
		for j := range bb {
			if bb[j] != 1 {
				bi[j] = idx[nb-len(bb)+j]
			}
		}
		s := 0.0
		for r := int64(0); r < k; r++ {
			ai[len(as)-2], ai[len(as)-1] = idx[nb], r
			bi[len(bs)-2], bi[len(bs)-1] = r, idx[nb+1]
			s += a.data[ravel(ai, as)] * b.data[ravel(bi, bs)]
		}
		return s
	})
	out := append([]int64{}, batch...)
	if !aPre {
		out = append(out, m)
	}
	if !bApp {
		out = append(out, n)
	}
	res.shape = out
	return res
}

func TestMatmul(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 1))
	cases := []struct {
		name   string
		sa, sb []int64
	}{
		{"2d", []int64{3, 4}, []int64{4, 5}},
		{"batched", []int64{2, 3, 4}, []int64{2, 4, 2}},
		{"broadcast_batch", []int64{2, 1, 3, 4}, []int64{3, 4, 2}},
		{"vector_left", []int64{4}, []int64{2, 4, 3}},
		{"vector_right", []int64{2, 3, 4}, []int64{4}},
		{"dot", []int64{4}, []int64{4}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := randArr(rng, ir.Float32, c.sa...), randArr(rng, ir.Float32, c.sb...)
			A, B := placeholder("a", ir.Float32, c.sa...), placeholder("b", ir.Float32, c.sb...)
			out, err := Matmul(A, B, ir.Void)
			check.NoError(t, err)
			got := runTE(t, []*te.Tensor{A, B}, []*te.Tensor{out}, []arr{a, b})
			near(t, got[0], refMatmul(a, b), 1e-5)
		})
	}
	t.Run("out_dtype", func(t *testing.T) {
		a, b := randArr(rng, ir.Int32, 2, 3), randArr(rng, ir.Int32, 3, 2)
		A, B := placeholder("a", ir.Int32, 2, 3), placeholder("b", ir.Int32, 3, 2)
		out, err := Matmul(A, B, ir.Float64)
		check.NoError(t, err)
		check.Equal(t, out.DType, ir.Float64)
		got := runTE(t, []*te.Tensor{A, B}, []*te.Tensor{out}, []arr{a, b})
		want := refMatmul(a, b)
		want.dt = ir.Float64
		near(t, got[0], want, 0)
	})
	t.Run("symbolic_batch", func(t *testing.T) {
		n := ir.NewVar("n", ir.Int64)
		A := te.Placeholder([]ir.Expr{n, ir.I64(3), ir.I64(4)}, ir.Float32, "a")
		B := placeholder("b", ir.Float32, 4, 2)
		out, err := Matmul(A, B, ir.Void)
		check.NoError(t, err)
		f, err := te.CreatePrimFunc([]*te.Tensor{A, B, out})
		check.NoError(t, err)
		a, b := randArr(rng, ir.Float32, 5, 3, 4), randArr(rng, ir.Float32, 4, 2)
		got := runPrimFunc(t, f, []arr{a, b}, []arr{newArr(ir.Float32, 5, 3, 2)})
		near(t, got[0], refMatmul(a, b), 1e-5)
	})
	t.Run("errors", func(t *testing.T) {
		_, err := Matmul(placeholder("a", ir.Float32, 2, 3), placeholder("b", ir.Float32, 4, 2), ir.Void)
		check.Error(t, err, "matmul: shapes (2, 3) and (4, 2) do not match: reduction dimensions 3 and 4 differ")
		_, err = Matmul(placeholder("a", ir.Float32, 2, 2, 3), placeholder("b", ir.Float32, 3, 3, 2), ir.Void)
		check.Error(t, err, "batch dimensions of shapes (2, 2, 3) and (3, 3, 2) do not broadcast")
		_, err = Matmul(placeholder("a", ir.Float32), placeholder("b", ir.Float32, 3), ir.Void)
		check.Error(t, err, "at least one dimension")
	})
}

func TestLinear(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 2))
	x, w, b := randArr(rng, ir.Float32, 2, 3, 4), randArr(rng, ir.Float32, 5, 4), randArr(rng, ir.Float32, 5)
	X, W, B := placeholder("x", ir.Float32, 2, 3, 4), placeholder("w", ir.Float32, 5, 4), placeholder("b", ir.Float32, 5)
	want := fill(ir.Float32, []int64{2, 3, 5}, func(idx []int64) float64 {
		s := 0.0
		for k := int64(0); k < 4; k++ {
			s += x.at(idx[0], idx[1], k) * w.at(idx[2], k)
		}
		return s + b.at(idx[2])
	})
	out, err := Linear(X, W, B, ir.Void)
	check.NoError(t, err)
	got := runTE(t, []*te.Tensor{X, W, B}, []*te.Tensor{out}, []arr{x, w, b})
	near(t, got[0], want, 1e-5)
	_, err = Linear(X, placeholder("w", ir.Float32, 5, 3), nil, ir.Void)
	check.Error(t, err, "linear: data of shape (2, 3, 4) has 4 features, weight of shape (5, 3) takes 3")
}

func TestTranspose(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 1))
	x := randArr(rng, ir.Float32, 2, 3, 4)
	X := placeholder("x", ir.Float32, 2, 3, 4)
	for _, c := range []struct {
		name string
		axes []int64
		perm []int
	}{{"reverse", nil, []int{2, 1, 0}}, {"given", []int64{1, -1, 0}, []int{1, 2, 0}}} {
		t.Run(c.name, func(t *testing.T) {
			out, err := Transpose(X, c.axes)
			check.NoError(t, err)
			shape := make([]int64, 3)
			for i, p := range c.perm {
				shape[i] = x.shape[p]
			}
			want := fill(ir.Float32, shape, func(idx []int64) float64 {
				in := make([]int64, 3)
				for i, p := range c.perm {
					in[p] = idx[i]
				}
				return x.at(in...)
			})
			got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
			near(t, got[0], want, 0)
		})
	}
	_, err := Transpose(X, []int64{0, 1})
	check.Error(t, err, "permute_dims: 2 axes for a tensor of shape (2, 3, 4)")
	_, err = Transpose(X, []int64{0, 1, 3})
	check.Error(t, err, "permute_dims: axis 3 out of range for a tensor of rank 3")
	_, err = Transpose(X, []int64{0, 1, 1})
	check.Error(t, err, "permute_dims: axis 1 repeated")
}

func TestReshapeFlatten(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 2))
	x := randArr(rng, ir.Float32, 2, 3, 4)
	X := placeholder("x", ir.Float32, 2, 3, 4)
	for _, c := range []struct {
		name  string
		shape []int64
		want  []int64
	}{{"2d", []int64{6, 4}, []int64{6, 4}}, {"infer", []int64{4, -1}, []int64{4, 6}}, {"4d", []int64{1, 4, 1, 6}, []int64{1, 4, 1, 6}}} {
		t.Run(c.name, func(t *testing.T) {
			out, err := Reshape(X, ir.Dims(c.shape...))
			check.NoError(t, err)
			got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
			near(t, got[0], arr{shape: c.want, dt: ir.Float32, data: x.data}, 0)
		})
	}
	t.Run("flatten", func(t *testing.T) {
		out, err := Flatten(X)
		check.NoError(t, err)
		got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
		near(t, got[0], arr{shape: []int64{24}, dt: ir.Float32, data: x.data}, 0)
	})
	t.Run("symbolic", func(t *testing.T) {
		n := ir.NewVar("n", ir.Int64)
		S := te.Placeholder([]ir.Expr{n, ir.I64(4)}, ir.Float32, "s")
		out, err := Reshape(S, []ir.Expr{ir.I64(-1)})
		check.NoError(t, err)
		f, err := te.CreatePrimFunc([]*te.Tensor{S, out})
		check.NoError(t, err)
		s := randArr(rng, ir.Float32, 3, 4)
		got := runPrimFunc(t, f, []arr{s}, []arr{newArr(ir.Float32, 12)})
		near(t, got[0], arr{shape: []int64{12}, dt: ir.Float32, data: s.data}, 0)
	})
	_, err := Reshape(X, ir.Dims(5, 5))
	check.Error(t, err, "reshape: cannot reshape (2, 3, 4) (24 elements) to (5, 5) (25 elements)")
	_, err = Reshape(X, ir.Dims(5, -1))
	check.Error(t, err, "reshape: cannot reshape (2, 3, 4) to (5, -1)")
	_, err = Reshape(X, ir.Dims(-1, -1))
	check.Error(t, err, "more than one -1")
}

func TestConcatSplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 1))
	a, b, c := randArr(rng, ir.Float32, 2, 3), randArr(rng, ir.Float32, 2, 1), randArr(rng, ir.Float32, 2, 2)
	A, B, C := placeholder("a", ir.Float32, 2, 3), placeholder("b", ir.Float32, 2, 1), placeholder("c", ir.Float32, 2, 2)
	t.Run("concat_axis1", func(t *testing.T) {
		axis := int64(-1)
		out, err := Concat([]*te.Tensor{A, B, C}, &axis)
		check.NoError(t, err)
		want := fill(ir.Float32, []int64{2, 6}, func(idx []int64) float64 {
			j := idx[1]
			switch {
			case j < 3:
				return a.at(idx[0], j)
			case j < 4:
				return b.at(idx[0], j-3)
			}
			return c.at(idx[0], j-4)
		})
		got := runTE(t, []*te.Tensor{A, B, C}, []*te.Tensor{out}, []arr{a, b, c})
		near(t, got[0], want, 0)
	})
	t.Run("concat_flat", func(t *testing.T) {
		out, err := Concat([]*te.Tensor{A, B}, nil)
		check.NoError(t, err)
		want := arr{shape: []int64{8}, dt: ir.Float32, data: append(append([]float64{}, a.data...), b.data...)}
		got := runTE(t, []*te.Tensor{A, B}, []*te.Tensor{out}, []arr{a, b})
		near(t, got[0], want, 0)
	})
	t.Run("concat_errors", func(t *testing.T) {
		axis := int64(0)
		_, err := Concat([]*te.Tensor{A, B}, &axis)
		check.Error(t, err, "concat: shapes (2, 3) and (2, 1) differ outside axis 0")
		axis = 2
		_, err = Concat([]*te.Tensor{A, B}, &axis)
		check.Error(t, err, "concat: axis 2 out of range")
		_, err = Concat(nil, &axis)
		check.Error(t, err, "no tensors")
	})
	x := randArr(rng, ir.Float32, 2, 6)
	X := placeholder("x", ir.Float32, 2, 6)
	splitRef := func(bounds []int64) []arr {
		var outs []arr
		for i := 0; i+1 < len(bounds); i++ {
			lo, hi := bounds[i], bounds[i+1]
			outs = append(outs, fill(ir.Float32, []int64{2, hi - lo}, func(idx []int64) float64 { return x.at(idx[0], idx[1]+lo) }))
		}
		return outs
	}
	t.Run("split_sections", func(t *testing.T) {
		outs, err := Split(X, 3, nil, 1)
		check.NoError(t, err)
		got := runTE(t, []*te.Tensor{X}, outs, []arr{x})
		for i, w := range splitRef([]int64{0, 2, 4, 6}) {
			near(t, got[i], w, 0)
		}
	})
	t.Run("split_indices", func(t *testing.T) {
		outs, err := Split(X, 0, []int64{1, 5}, -1)
		check.NoError(t, err)
		got := runTE(t, []*te.Tensor{X}, outs, []arr{x})
		for i, w := range splitRef([]int64{0, 1, 5, 6}) {
			near(t, got[i], w, 0)
		}
	})
	t.Run("split_errors", func(t *testing.T) {
		_, err := Split(X, 4, nil, 1)
		check.Error(t, err, "split: dimension 1 of shape (2, 6) does not split into 4 equal sections")
		_, err = Split(X, 0, []int64{3, 2}, 1)
		check.Error(t, err, "not increasing")
		_, err = Split(X, 0, []int64{7}, 1)
		check.Error(t, err, "split: split index 7 past dimension 1")
		_, err = Split(X, 2, nil, 2)
		check.Error(t, err, "split: axis 2 out of range")
	})
}

func TestStridedSlice(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 1))
	x := randArr(rng, ir.Float32, 5, 6)
	X := placeholder("x", ir.Float32, 5, 6)
	// pyslice lists the indices of range(n)[begin:end:stride] as Python does.
	pyslice := func(n, begin, end, stride int64) []int64 {
		var out []int64
		norm := func(v int64, lo, hi int64) int64 {
			if v < 0 {
				v += n
			}
			return max(lo, min(v, hi))
		}
		if stride > 0 {
			for i := norm(begin, 0, n); i < norm(end, 0, n); i += stride {
				out = append(out, i)
			}
		} else {
			for i := norm(begin, -1, n-1); i > norm(end, -1, n-1); i += stride {
				out = append(out, i)
			}
		}
		return out
	}
	cases := []struct {
		name                     string
		axes, begin, end, stride []int64
	}{
		{"basic", []int64{0}, []int64{1}, []int64{4}, nil},
		{"negative", []int64{1, 0}, []int64{-4, -2}, []int64{-1, 100}, []int64{2, 1}},
		{"reverse", []int64{1}, []int64{-1}, []int64{-100}, []int64{-2}},
		{"empty", []int64{0}, []int64{3}, []int64{1}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := StridedSlice(X, c.axes, c.begin, c.end, c.stride)
			check.NoError(t, err)
			sel := [][]int64{pyslice(5, 0, 5, 1), pyslice(6, 0, 6, 1)}
			for i, a := range c.axes {
				if a < 0 {
					a += 2
				}
				s := int64(1)
				if c.stride != nil {
					s = c.stride[i]
				}
				sel[a] = pyslice(x.shape[a], c.begin[i], c.end[i], s)
			}
			want := fill(ir.Float32, []int64{int64(len(sel[0])), int64(len(sel[1]))}, func(idx []int64) float64 {
				return x.at(sel[0][idx[0]], sel[1][idx[1]])
			})
			got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
			near(t, got[0], want, 0)
		})
	}
	_, err := StridedSlice(X, []int64{0}, []int64{0}, []int64{1}, []int64{0})
	check.Error(t, err, "strided_slice: stride 0 on axis 0")
	_, err = StridedSlice(X, []int64{0}, []int64{0}, nil, nil)
	check.Error(t, err, "differ in length")
}

func TestTake(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 1))
	x := randArr(rng, ir.Float32, 3, 4)
	X := placeholder("x", ir.Float32, 3, 4)
	ind := arr{shape: []int64{2, 2}, dt: ir.Int32, data: []float64{0, 2, -1, 7}}
	I := placeholder("i", ir.Int32, 2, 2)
	clip := func(v, n int64) int64 { return max(0, min(v, n-1)) }
	t.Run("axis1", func(t *testing.T) {
		axis := int64(1)
		out, err := Take(X, I, &axis, "clip")
		check.NoError(t, err)
		want := fill(ir.Float32, []int64{3, 2, 2}, func(idx []int64) float64 {
			return x.at(idx[0], clip(int64(ind.at(idx[1], idx[2])), 4))
		})
		got := runTE(t, []*te.Tensor{X, I}, []*te.Tensor{out}, []arr{x, ind})
		near(t, got[0], want, 0)
	})
	t.Run("wrap_axis0", func(t *testing.T) {
		axis := int64(0)
		out, err := Take(X, I, &axis, "wrap")
		check.NoError(t, err)
		want := fill(ir.Float32, []int64{2, 2, 4}, func(idx []int64) float64 {
			v := int64(ind.at(idx[0], idx[1]))
			return x.at(((v%3)+3)%3, idx[2])
		})
		got := runTE(t, []*te.Tensor{X, I}, []*te.Tensor{out}, []arr{x, ind})
		near(t, got[0], want, 0)
	})
	t.Run("flat", func(t *testing.T) {
		out, err := Take(X, I, nil, "")
		check.NoError(t, err)
		want := fill(ir.Float32, []int64{2, 2}, func(idx []int64) float64 {
			return x.data[clip(int64(ind.at(idx...)), 12)]
		})
		got := runTE(t, []*te.Tensor{X, I}, []*te.Tensor{out}, []arr{x, ind})
		near(t, got[0], want, 0)
	})
	_, err := Take(X, X, nil, "")
	check.Error(t, err, "take: indices have dtype float32, want an integer type")
	_, err = Take(X, I, nil, "raise")
	check.Error(t, err, `take: unknown mode "raise"`)
}

func TestExpandSqueeze(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 1))
	x := randArr(rng, ir.Float32, 3, 1, 2)
	X := placeholder("x", ir.Float32, 3, 1, 2)
	t.Run("expand_dims", func(t *testing.T) {
		out, err := ExpandDims(X, []int64{0, -1})
		check.NoError(t, err)
		check.Equal(t, ir.ShapeString(out.Shape), "(1, 3, 1, 2, 1)")
		got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
		near(t, got[0], arr{shape: []int64{1, 3, 1, 2, 1}, dt: ir.Float32, data: x.data}, 0)
		_, err = ExpandDims(X, []int64{5})
		check.Error(t, err, "expand_dims: axis 5 out of range for a tensor of rank 4")
	})
	for _, c := range []struct {
		name string
		axes []int64
		want []int64
	}{{"all", nil, []int64{3, 2}}, {"given", []int64{-2}, []int64{3, 2}}} {
		t.Run("squeeze_"+c.name, func(t *testing.T) {
			out, err := Squeeze(X, c.axes)
			check.NoError(t, err)
			got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
			near(t, got[0], arr{shape: c.want, dt: ir.Float32, data: x.data}, 0)
		})
	}
	_, err := Squeeze(X, []int64{0})
	check.Error(t, err, "squeeze: axis 0 of shape (3, 1, 2) is not 1")
}

// refReduce folds f over the axes of x (nil: all).
func refReduce(x arr, axes []int64, keep bool, init float64, f func(acc, v float64) float64) arr {
	red := make([]bool, len(x.shape))
	for i := range red {
		red[i] = axes == nil
	}
	for _, a := range axes {
		if a < 0 {
			a += int64(len(x.shape))
		}
		red[a] = true
	}
	var out []int64
	for i, d := range x.shape {
		switch {
		case !red[i]:
			out = append(out, d)
		case keep:
			out = append(out, 1)
		}
	}
	res := newArr(x.dt, out...)
	for i := range res.data {
		res.data[i] = init
	}
	for i := range x.data {
		idx := unravel(int64(i), x.shape)
		var o []int64
		for d, v := range idx {
			switch {
			case !red[d]:
				o = append(o, v)
			case keep:
				o = append(o, 0)
			}
		}
		j := ravel(o, out)
		res.data[j] = f(res.data[j], x.data[i])
	}
	return res
}

func TestReductions(t *testing.T) {
	rng := rand.New(rand.NewPCG(10, 1))
	x := randArr(rng, ir.Float32, 2, 3, 4)
	X := placeholder("x", ir.Float32, 2, 3, 4)
	sum := func(acc, v float64) float64 { return acc + v }
	for _, c := range []struct {
		name string
		axes []int64
		keep bool
	}{{"all", nil, false}, {"one", []int64{1}, false}, {"two_keep", []int64{0, -1}, true}, {"all_keep", nil, true}} {
		t.Run("sum_"+c.name, func(t *testing.T) {
			out, err := Sum(X, c.axes, c.keep)
			check.NoError(t, err)
			got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
			near(t, got[0], refReduce(x, c.axes, c.keep, 0, sum), 1e-5)
		})
		t.Run("max_"+c.name, func(t *testing.T) {
			out, err := Max(X, c.axes, c.keep)
			check.NoError(t, err)
			got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
			near(t, got[0], refReduce(x, c.axes, c.keep, math.Inf(-1), math.Max), 0)
		})
		t.Run("min_"+c.name, func(t *testing.T) {
			out, err := Min(X, c.axes, c.keep)
			check.NoError(t, err)
			got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
			near(t, got[0], refReduce(x, c.axes, c.keep, math.Inf(1), math.Min), 0)
		})
		t.Run("mean_"+c.name, func(t *testing.T) {
			out, err := Mean(X, c.axes, c.keep)
			check.NoError(t, err)
			got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
			s := refReduce(x, c.axes, c.keep, 0, sum)
			n := float64(len(x.data) / len(s.data))
			for i := range s.data {
				s.data[i] /= n
			}
			near(t, got[0], s, 1e-5)
		})
		t.Run("variance_"+c.name, func(t *testing.T) {
			out, err := Variance(X, c.axes, c.keep, true)
			check.NoError(t, err)
			got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
			s := refReduce(x, c.axes, true, 0, sum)
			n := float64(len(x.data) / len(s.data))
			sq := newArr(x.dt, s.shape...)
			for i := range x.data {
				idx := unravel(int64(i), x.shape)
				for d := range idx {
					if c.axes == nil || slices.Contains(c.axes, int64(d)) || slices.Contains(c.axes, int64(d-3)) {
						idx[d] = 0
					}
				}
				j := ravel(idx, s.shape)
				dv := x.data[i] - s.data[j]/n
				sq.data[j] += dv * dv
			}
			for i := range sq.data {
				sq.data[i] = math.Sqrt(sq.data[i] / n)
			}
			want := refReduce(x, c.axes, c.keep, 0, sum)
			copy(want.data, sq.data)
			near(t, got[0], want, 1e-5)
		})
	}
	t.Run("int_sum", func(t *testing.T) {
		xi := randArr(rng, ir.Int32, 3, 4)
		XI := placeholder("xi", ir.Int32, 3, 4)
		out, err := Sum(XI, []int64{0}, false)
		check.NoError(t, err)
		got := runTE(t, []*te.Tensor{XI}, []*te.Tensor{out}, []arr{xi})
		near(t, got[0], refReduce(xi, []int64{0}, false, 0, sum), 0)
	})
	t.Run("errors", func(t *testing.T) {
		_, err := Sum(X, []int64{3}, false)
		check.Error(t, err, "sum: axis 3 out of range for a tensor of rank 3")
		_, err = Mean(X, []int64{1, -2}, false)
		check.Error(t, err, "mean: axis -2 repeated")
	})
}

func TestArgReduce(t *testing.T) {
	x := arr{shape: []int64{2, 3}, dt: ir.Float32, data: []float64{1, 5, 5, 7, -2, 7}}
	X := placeholder("x", ir.Float32, 2, 3)
	one, zero := int64(1), int64(0)
	cases := []struct {
		name string
		max  bool
		axis *int64
		keep bool
		want arr
	}{
		{"argmax_axis1", true, &one, false, arr{shape: []int64{2}, dt: ir.Int64, data: []float64{1, 0}}},
		{"argmax_axis0_keep", true, &zero, true, arr{shape: []int64{1, 3}, dt: ir.Int64, data: []float64{1, 0, 1}}},
		{"argmax_all", true, nil, false, arr{shape: []int64{}, dt: ir.Int64, data: []float64{3}}},
		{"argmin_axis1", false, &one, false, arr{shape: []int64{2}, dt: ir.Int64, data: []float64{0, 1}}},
		{"argmin_all_keep", false, nil, true, arr{shape: []int64{1, 1}, dt: ir.Int64, data: []float64{4}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := Argmin
			if c.max {
				f = Argmax
			}
			out, err := f(X, c.axis, c.keep)
			check.NoError(t, err)
			got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
			near(t, got[0], c.want, 0)
		})
	}
	bad := int64(2)
	_, err := Argmax(X, &bad, false)
	check.Error(t, err, "argmax: axis 2 out of range")
}
