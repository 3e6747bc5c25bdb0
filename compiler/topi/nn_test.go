package topi

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/internal/check"
)

func TestSoftmax(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 1))
	x := randArr(rng, ir.Float32, 2, 3, 4)
	X := placeholder("x", ir.Float32, 2, 3, 4)
	// ref computes along axis ax: log form or not.
	ref := func(ax int, logForm bool) arr {
		return fill(ir.Float32, x.shape, func(idx []int64) float64 {
			at := func(j int64) float64 {
				sub := append([]int64{}, idx...)
				sub[ax] = j
				return x.at(sub...)
			}
			m := math.Inf(-1)
			for j := int64(0); j < x.shape[ax]; j++ {
				m = math.Max(m, at(j))
			}
			s := 0.0
			for j := int64(0); j < x.shape[ax]; j++ {
				s += math.Exp(at(j) - m)
			}
			if logForm {
				return x.at(idx...) - m - math.Log(s)
			}
			return math.Exp(x.at(idx...)-m) / s
		})
	}
	for _, c := range []struct {
		name string
		axis int64
		ax   int
	}{{"last", -1, 2}, {"middle", 1, 1}, {"first", 0, 0}} {
		t.Run("softmax_"+c.name, func(t *testing.T) {
			out, err := Softmax(X, c.axis)
			check.NoError(t, err)
			got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
			near(t, got[0], ref(c.ax, false), 1e-5)
		})
		t.Run("log_softmax_"+c.name, func(t *testing.T) {
			out, err := LogSoftmax(X, c.axis)
			check.NoError(t, err)
			got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{x})
			near(t, got[0], ref(c.ax, true), 1e-5)
		})
	}
	_, err := Softmax(X, 3)
	check.Error(t, err, "softmax: axis 3 out of range for a tensor of rank 3")
	_, err = Softmax(placeholder("i", ir.Int32, 2), 0)
	check.Error(t, err, "softmax: input \"i\" has dtype int32, want a float type")
}

func TestLayerNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(12, 1))
	x := randArr(rng, ir.Float32, 2, 3, 4)
	X := placeholder("x", ir.Float32, 2, 3, 4)
	for _, c := range []struct {
		name          string
		axes          []int64
		center, scale bool
	}{{"last", []int64{-1}, true, true}, {"two", []int64{1, 2}, true, true}, {"plain", []int64{-1}, false, false}} {
		t.Run(c.name, func(t *testing.T) {
			var gshape []int64
			for _, a := range c.axes {
				if a < 0 {
					a += 3
				}
				gshape = append(gshape, x.shape[a])
			}
			g, b := randArr(rng, ir.Float32, gshape...), randArr(rng, ir.Float32, gshape...)
			G, B := placeholder("gamma", ir.Float32, gshape...), placeholder("beta", ir.Float32, gshape...)
			out, err := LayerNorm(X, G, B, c.axes, 1e-5, c.center, c.scale)
			check.NoError(t, err)
			got := runTE(t, []*te.Tensor{X, G, B}, []*te.Tensor{out}, []arr{x, g, b})
			inAxes := func(d int) bool {
				for _, a := range c.axes {
					if a == int64(d) || a+3 == int64(d) {
						return true
					}
				}
				return false
			}
			want := fill(ir.Float32, x.shape, func(idx []int64) float64 {
				var vals []float64
				for i := range x.data {
					j := unravel(int64(i), x.shape)
					same := true
					for d := range j {
						if !inAxes(d) && j[d] != idx[d] {
							same = false
						}
					}
					if same {
						vals = append(vals, x.data[i])
					}
				}
				mean, vr := 0.0, 0.0
				for _, v := range vals {
					mean += v
				}
				mean /= float64(len(vals))
				for _, v := range vals {
					vr += (v - mean) * (v - mean)
				}
				vr /= float64(len(vals))
				r := (x.at(idx...) - mean) / math.Sqrt(vr+1e-5)
				var gi []int64
				for d := range idx {
					if inAxes(d) {
						gi = append(gi, idx[d])
					}
				}
				if c.scale {
					r *= g.at(gi...)
				}
				if c.center {
					r += b.at(gi...)
				}
				return r
			})
			near(t, got[0], want, 1e-4)
		})
	}
	_, err := LayerNorm(X, placeholder("gamma", ir.Float32, 3), placeholder("beta", ir.Float32, 4), []int64{-1}, 1e-5, true, true)
	check.Error(t, err, "layer_norm: gamma has shape (3,), want (4,) for data of shape (2, 3, 4)")
	_, err = LayerNorm(X, nil, nil, []int64{5}, 1e-5, false, false)
	check.Error(t, err, "layer_norm: axis 5 out of range")
}

func TestBatchNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 1))
	x := randArr(rng, ir.Float32, 2, 3, 2, 2)
	X := placeholder("x", ir.Float32, 2, 3, 2, 2)
	g, b, m := randArr(rng, ir.Float32, 3), randArr(rng, ir.Float32, 3), randArr(rng, ir.Float32, 3)
	v := randArr(rng, ir.Float32, 3)
	for i := range v.data {
		v.data[i] = f32(math.Abs(v.data[i]) + 0.5)
	}
	G, B, M, V := placeholder("gamma", ir.Float32, 3), placeholder("beta", ir.Float32, 3),
		placeholder("moving_mean", ir.Float32, 3), placeholder("moving_var", ir.Float32, 3)
	outs, err := BatchNorm(X, G, B, M, V, 1, 1e-3, true, true)
	check.NoError(t, err)
	got := runTE(t, []*te.Tensor{X, G, B, M, V}, outs, []arr{x, g, b, m, v})
	want := fill(ir.Float32, x.shape, func(idx []int64) float64 {
		c := idx[1]
		return (x.at(idx...)-m.at(c))/math.Sqrt(v.at(c)+1e-3)*g.at(c) + b.at(c)
	})
	near(t, got[0], want, 1e-5)
	near(t, got[1], m, 0)
	near(t, got[2], v, 0)
	_, err = BatchNorm(X, G, B, M, placeholder("moving_var", ir.Float32, 2), 1, 1e-3, true, true)
	check.Error(t, err, "batch_norm: moving_var has shape (2,), want (3,) for data of shape (2, 3, 2, 2)")
	_, err = BatchNorm(X, G, B, M, V, 4, 1e-3, true, true)
	check.Error(t, err, "batch_norm: axis 4 out of range")
}

// permuteTo rearranges an NCHW (or OIHW) array into layout.
func permuteTo(a arr, from, layout string) arr {
	pos := make([]int, 4)
	shape := make([]int64, 4)
	for i := 0; i < 4; i++ {
		for j := 0; j < 4; j++ {
			if layout[i] == from[j] {
				pos[i] = j
			}
		}
		shape[i] = a.shape[pos[i]]
	}
	return fill(a.dt, shape, func(idx []int64) float64 {
		src := make([]int64, 4)
		for i := range idx {
			src[pos[i]] = idx[i]
		}
		return a.at(src...)
	})
}

// blockKernel arranges an OIHW kernel in layout, which may end in a
// block of output channels ("OHWI4o": [O/4, H, W, I, 4]).
func blockKernel(w arr, layout string) arr {
	letters, b := op.KernelBlock(layout)
	p := permuteTo(w, "OIHW", letters)
	if b == 0 {
		return p
	}
	o := strings.IndexByte(letters, 'O')
	shape := append(append([]int64{}, p.shape...), b)
	shape[o] /= b
	return fill(w.dt, shape, func(idx []int64) float64 {
		src := append([]int64{}, idx[:4]...)
		src[o] = idx[o]*b + idx[4]
		return p.at(src...)
	})
}

// refConv2D is a direct NCHW/OIHW convolution.
func refConv2D(x, w arr, stride, pad, dil [2]int64, padHi [2]int64, groups int64) arr {
	n, c, h, wd := x.shape[0], x.shape[1], x.shape[2], x.shape[3]
	o, i, kh, kw := w.shape[0], w.shape[1], w.shape[2], w.shape[3]
	oh := (h+pad[0]+padHi[0]-((kh-1)*dil[0]+1))/stride[0] + 1
	ow := (wd+pad[1]+padHi[1]-((kw-1)*dil[1]+1))/stride[1] + 1
	_ = c
	return fill(x.dt, []int64{n, o, oh, ow}, func(idx []int64) float64 {
		g := idx[1] / (o / groups)
		s := 0.0
		for rc := int64(0); rc < i; rc++ {
			for ry := int64(0); ry < kh; ry++ {
				for rx := int64(0); rx < kw; rx++ {
					y := idx[2]*stride[0] + ry*dil[0] - pad[0]
					xx := idx[3]*stride[1] + rx*dil[1] - pad[1]
					if y < 0 || y >= h || xx < 0 || xx >= wd {
						continue
					}
					s += x.at(idx[0], g*i+rc, y, xx) * w.at(idx[1], rc, ry, rx)
				}
			}
		}
		return s
	})
}

func TestConv2D(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 1))
	cases := []struct {
		name           string
		x, w           []int64 // NCHW, OIHW
		stride, dil    [2]int64
		pad            [4]int64
		groups         int64
		dl, kl, outLay string
	}{
		{"nchw", []int64{1, 2, 5, 5}, []int64{3, 2, 3, 3}, [2]int64{1, 1}, [2]int64{1, 1}, [4]int64{}, 1, "NCHW", "OIHW", ""},
		{"nchw_pad_stride", []int64{2, 2, 6, 5}, []int64{2, 2, 3, 2}, [2]int64{2, 1}, [2]int64{1, 1}, [4]int64{1, 0, 2, 1}, 1, "NCHW", "OIHW", ""},
		{"nchw_dilation_groups", []int64{1, 4, 7, 7}, []int64{6, 2, 3, 3}, [2]int64{1, 2}, [2]int64{2, 1}, [4]int64{1, 1, 1, 1}, 2, "NCHW", "OIHW", ""},
		{"nchw_hwio_two_stages", []int64{2, 3, 6, 5}, []int64{5, 3, 3, 2}, [2]int64{2, 1}, [2]int64{1, 2}, [4]int64{1, 2, 0, 1}, 1, "NCHW", "HWIO", ""},
		{"nhwc_hwio", []int64{1, 3, 5, 4}, []int64{4, 3, 3, 3}, [2]int64{1, 1}, [2]int64{1, 1}, [4]int64{1, 1, 1, 1}, 1, "NHWC", "HWIO", ""},
		{"nhwc_groups_ohwi_out_nchw", []int64{2, 4, 4, 4}, []int64{4, 1, 2, 2}, [2]int64{2, 2}, [2]int64{1, 1}, [4]int64{0, 0, 1, 1}, 4, "NHWC", "OHWI", "NCHW"},
		{"nchw_ohwi_blocks_of_4", []int64{2, 3, 6, 5}, []int64{8, 3, 3, 2}, [2]int64{2, 1}, [2]int64{1, 2}, [4]int64{1, 2, 0, 1}, 1, "NCHW", "OHWI4o", ""},
		{"nchw_oihw_blocks_of_3", []int64{1, 2, 4, 4}, []int64{6, 2, 1, 1}, [2]int64{1, 1}, [2]int64{1, 1}, [4]int64{}, 1, "NCHW", "OIHW3o", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x, w := randArr(rng, ir.Float32, c.x...), randArr(rng, ir.Float32, c.w...)
			want := refConv2D(x, w, c.stride, [2]int64{c.pad[0], c.pad[1]}, c.dil, [2]int64{c.pad[2], c.pad[3]}, c.groups)
			xl, wl := permuteTo(x, "NCHW", c.dl), blockKernel(w, c.kl)
			X, W := placeholder("data", ir.Float32, xl.shape...), placeholder("weight", ir.Float32, wl.shape...)
			out, err := Conv2D(X, W, Conv2DAttrs{Strides: c.stride, Padding: c.pad, Dilation: c.dil, Groups: c.groups,
				DataLayout: c.dl, KernelLayout: c.kl, OutLayout: c.outLay})
			check.NoError(t, err)
			got := runTE(t, []*te.Tensor{X, W}, []*te.Tensor{out}, []arr{xl, wl})
			ol := c.outLay
			if ol == "" {
				ol = c.dl
			}
			near(t, got[0], permuteTo(want, "NCHW", ol), 1e-5)
		})
	}
	t.Run("errors", func(t *testing.T) {
		X, W := placeholder("data", ir.Float32, 1, 3, 5, 5), placeholder("weight", ir.Float32, 2, 2, 3, 3)
		_, err := Conv2D(X, W, Conv2DAttrs{})
		check.Error(t, err, "conv2d: data of shape (1, 3, 5, 5) (layout NCHW) has 3 channels, weight of shape (2, 2, 3, 3) (layout OIHW) takes 2 × 1 groups")
		_, err = Conv2D(X, W, Conv2DAttrs{DataLayout: "NCWX"})
		check.Error(t, err, `conv2d: unsupported layout "NCWX"`)
		_, err = Conv2D(X, placeholder("weight", ir.Float32, 2, 3, 7, 7), Conv2DAttrs{})
		check.Error(t, err, "smaller than the kernel")
		_, err = Conv2D(X, placeholder("weight", ir.Float32, 3, 1, 1, 1), Conv2DAttrs{Groups: 3, Strides: [2]int64{-1, 1}})
		check.Error(t, err, "must be positive")
		_, err = Conv2D(X, placeholder("weight", ir.Float32, 3, 3, 1), Conv2DAttrs{})
		check.Error(t, err, "want 4 dimensions")
		_, err = Conv2D(X, placeholder("weight", ir.Float32, 1, 3, 1, 1, 2), Conv2DAttrs{KernelLayout: "OHWI4o"})
		check.Error(t, err, "kernel layout OHWI4o takes a weight of shape [.., 4]")
		_, err = Conv2D(X, placeholder("weight", ir.Float32, 1, 3, 1, 1), Conv2DAttrs{KernelLayout: "OHWI4o"})
		check.Error(t, err, "want 5 dimensions")
	})
}

// refPool2D is a direct NCHW pooling with PyTorch's conventions.
func refPool2D(x arr, a Pool2DAttrs, isMax bool) arr {
	h, w := x.shape[2], x.shape[3]
	k, s, d := a.PoolSize, [2]int64{orOne(a.Strides[0]), orOne(a.Strides[1])}, [2]int64{orOne(a.Dilation[0]), orOne(a.Dilation[1])}
	outDim := func(n, lo, hi, k, s, d int64) int64 {
		span := n + lo + hi - ((k-1)*d + 1)
		if a.CeilMode {
			span += s - 1
		}
		return span/s + 1
	}
	oh := outDim(h, a.Padding[0], a.Padding[2], k[0], s[0], d[0])
	ow := outDim(w, a.Padding[1], a.Padding[3], k[1], s[1], d[1])
	return fill(x.dt, []int64{x.shape[0], x.shape[1], oh, ow}, func(idx []int64) float64 {
		best, sum, valid, padded := -math.MaxFloat32, 0.0, 0, 0
		for i := int64(0); i < k[0]; i++ {
			for j := int64(0); j < k[1]; j++ {
				y := idx[2]*s[0] - a.Padding[0] + i*d[0]
				z := idx[3]*s[1] - a.Padding[1] + j*d[1]
				inPad := y < h+a.Padding[2] && z < w+a.Padding[3]
				if inPad {
					padded++
				}
				if y < 0 || y >= h || z < 0 || z >= w {
					continue
				}
				v := x.at(idx[0], idx[1], y, z)
				best = math.Max(best, v)
				sum += v
				valid++
			}
		}
		if isMax {
			return best
		}
		n := valid
		if a.CountIncludePad {
			n = padded
		}
		return sum / float64(max(n, 1))
	})
}

func TestPool2D(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 1))
	cases := []struct {
		name   string
		shape  []int64
		attrs  Pool2DAttrs
		layout string
	}{
		{"plain", []int64{1, 2, 4, 4}, Pool2DAttrs{PoolSize: [2]int64{2, 2}, Strides: [2]int64{2, 2}}, "NCHW"},
		{"pad", []int64{2, 1, 5, 5}, Pool2DAttrs{PoolSize: [2]int64{3, 3}, Strides: [2]int64{2, 2}, Padding: [4]int64{1, 1, 1, 1}}, "NCHW"},
		{"pad_include", []int64{1, 2, 5, 4}, Pool2DAttrs{PoolSize: [2]int64{3, 2}, Strides: [2]int64{2, 1}, Padding: [4]int64{1, 0, 1, 1}, CountIncludePad: true}, "NCHW"},
		{"ceil", []int64{1, 1, 6, 6}, Pool2DAttrs{PoolSize: [2]int64{3, 3}, Strides: [2]int64{2, 2}, CeilMode: true}, "NCHW"},
		{"ceil_include_pad", []int64{1, 1, 6, 5}, Pool2DAttrs{PoolSize: [2]int64{2, 3}, Strides: [2]int64{2, 2}, Padding: [4]int64{1, 1, 1, 1}, CeilMode: true, CountIncludePad: true}, "NCHW"},
		{"dilation", []int64{1, 1, 7, 7}, Pool2DAttrs{PoolSize: [2]int64{2, 2}, Dilation: [2]int64{2, 3}, Padding: [4]int64{1, 2, 0, 1}}, "NCHW"},
		{"nhwc", []int64{2, 3, 5, 5}, Pool2DAttrs{PoolSize: [2]int64{2, 2}, Strides: [2]int64{1, 2}, Padding: [4]int64{0, 1, 1, 0}}, "NHWC"},
	}
	for _, c := range cases {
		for _, isMax := range []bool{true, false} {
			name := "avg_" + c.name
			if isMax {
				name = "max_" + c.name
			}
			t.Run(name, func(t *testing.T) {
				x := randArr(rng, ir.Float32, c.shape...)
				want := refPool2D(x, c.attrs, isMax)
				xl := permuteTo(x, "NCHW", c.layout)
				X := placeholder("x", ir.Float32, xl.shape...)
				a := c.attrs
				a.Layout = c.layout
				f := AvgPool2D
				if isMax {
					f = MaxPool2D
				}
				out, err := f(X, a)
				check.NoError(t, err)
				got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{xl})
				near(t, got[0], permuteTo(want, "NCHW", c.layout), 1e-5)
			})
		}
	}
	t.Run("errors", func(t *testing.T) {
		X := placeholder("x", ir.Float32, 1, 1, 2, 2)
		_, err := MaxPool2D(X, Pool2DAttrs{PoolSize: [2]int64{3, 3}})
		check.Error(t, err, "max_pool2d: data of shape (1, 1, 2, 2) is smaller than the window [3 3]")
		_, err = AvgPool2D(X, Pool2DAttrs{})
		check.Error(t, err, "avg_pool2d: pool_size, strides and dilation must be positive")
		_, err = MaxPool2D(placeholder("x", ir.Float32, 2, 2), Pool2DAttrs{PoolSize: [2]int64{1, 1}})
		check.Error(t, err, "want 4 dimensions")
	})
}

func TestAdaptiveAvgPool2D(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 1))
	for _, c := range []struct {
		name   string
		shape  []int64
		out    []int64
		layout string
	}{{"divisible", []int64{1, 2, 4, 6}, []int64{2, 3}, "NCHW"}, {"uneven", []int64{2, 1, 5, 7}, []int64{3, 4}, "NCHW"},
		{"global", []int64{1, 3, 3, 3}, []int64{1}, "NHWC"}, {"same", []int64{1, 1, 2, 3}, nil, "NCHW"}} {
		t.Run(c.name, func(t *testing.T) {
			x := randArr(rng, ir.Float32, c.shape...)
			h, w := c.shape[2], c.shape[3]
			oh, ow := h, w
			switch len(c.out) {
			case 1:
				oh, ow = c.out[0], c.out[0]
			case 2:
				oh, ow = c.out[0], c.out[1]
			}
			want := fill(ir.Float32, []int64{c.shape[0], c.shape[1], oh, ow}, func(idx []int64) float64 {
				y0, y1 := idx[2]*h/oh, ((idx[2]+1)*h+oh-1)/oh
				z0, z1 := idx[3]*w/ow, ((idx[3]+1)*w+ow-1)/ow
				s := 0.0
				for y := y0; y < y1; y++ {
					for z := z0; z < z1; z++ {
						s += x.at(idx[0], idx[1], y, z)
					}
				}
				return s / float64((y1-y0)*(z1-z0))
			})
			xl := permuteTo(x, "NCHW", c.layout)
			X := placeholder("x", ir.Float32, xl.shape...)
			out, err := AdaptiveAvgPool2D(X, c.out, c.layout, "")
			check.NoError(t, err)
			got := runTE(t, []*te.Tensor{X}, []*te.Tensor{out}, []arr{xl})
			near(t, got[0], permuteTo(want, "NCHW", c.layout), 1e-5)
		})
	}
	_, err := AdaptiveAvgPool2D(placeholder("x", ir.Float32, 1, 1, 2, 2), []int64{1, 2, 3}, "", "")
	check.Error(t, err, "adaptive_avg_pool2d: output_size has 3 values, want 1 or 2")
}
