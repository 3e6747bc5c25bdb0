package nn

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// The layers follow TVM's tvm.relax.frontend.nn modules (same parameter
// names and shapes, same graph operators) and PyTorch's default
// initialization, so that a model written with either has the same
// structure and comparable weights. All are float32.

// linear is y = x·Wᵀ + b.
type linear struct {
	in, out      int64
	weight, bias *Parameter
}

// NewLinear returns a fully connected layer from in to out features:
// parameters "weight" (out, in) and, when bias is true, "bias" (out,),
// both uniform in ±1/√in. Forward emits R.permute_dims(weight),
// R.matmul(x, ·) and R.add(·, bias), as TVM's nn.Linear does.
func NewLinear(in, out int64, bias bool) Module {
	k := 1 / math.Sqrt(float64(max(in, 1)))
	l := &linear{in: in, out: out, weight: NewParameter([]int64{out, in}, ir.Float32, Uniform(-k, k))}
	if bias {
		l.bias = NewParameter([]int64{out}, ir.Float32, Uniform(-k, k))
	}
	return l
}

func (l *linear) configErr() error {
	if l.in <= 0 || l.out <= 0 {
		return fmt.Errorf("linear %d → %d: feature counts must be positive", l.in, l.out)
	}
	return nil
}

// Forward emits x·Wᵀ (+ b).
func (l *linear) Forward(b *Builder, x *Tensor) (*Tensor, error) {
	w, err := b.Param(l.weight)
	if err != nil {
		return nil, err
	}
	wt, err := b.PermuteDims(w, nil)
	if err != nil {
		return nil, err
	}
	y, err := b.Matmul(x, wt)
	if err != nil || l.bias == nil {
		return y, err
	}
	bias, err := b.Param(l.bias)
	if err != nil {
		return nil, err
	}
	return b.Add(y, bias)
}

// Params returns weight and bias.
func (l *linear) Params() []NamedParam {
	ps := []NamedParam{{"weight", l.weight}}
	if l.bias != nil {
		ps = append(ps, NamedParam{"bias", l.bias})
	}
	return ps
}

// Children returns nothing.
func (l *linear) Children() []Child { return nil }

type relu struct{}

// NewReLU returns the rectifier, R.nn.relu.
func NewReLU() Module { return relu{} }

// Forward emits R.nn.relu(x).
func (relu) Forward(b *Builder, x *Tensor) (*Tensor, error) { return b.ReLU(x) }

// Params returns nothing.
func (relu) Params() []NamedParam { return nil }

// Children returns nothing.
func (relu) Children() []Child { return nil }

// Conv2DConfig holds a 2-D convolution's options. Zero values are the
// defaults: stride 1, no padding, dilation 1, one group, with a bias.
type Conv2DConfig struct {
	// Stride is 1 value (both axes) or 2 (height, width).
	Stride []int64
	// Padding is 1 value, 2 (height, width) or 4 (top, left, bottom,
	// right).
	Padding []int64
	// Dilation is 1 value or 2.
	Dilation []int64
	// Groups splits the channels into groups; 0 means 1.
	Groups int64
	// NoBias leaves the bias out.
	NoBias bool
}

type conv2d struct {
	in, out, kernel int64
	stride, padding []int64
	dilation        []int64
	groups          int64
	weight, bias    *Parameter
	err             error
}

// NewConv2D returns a 2-D convolution over NCHW data from in to out
// channels with a square kernel: parameters "weight" (out, in/groups,
// kernel, kernel) in OIHW layout and "bias" (out,), uniform in ±1/√fan_in
// (fan_in = in/groups·kernel²). Forward emits R.nn.conv2d, then
// R.reshape(bias, (1, out, 1, 1)) and R.add, as TVM's nn.Conv2D does.
// Invalid options are reported by Export.
func NewConv2D(in, out, kernel int64, cfg Conv2DConfig) Module {
	c := &conv2d{in: in, out: out, kernel: kernel, groups: cfg.Groups}
	if c.groups == 0 {
		c.groups = 1
	}
	var err error
	if c.stride, err = pair("stride", cfg.Stride, 1, false); err != nil {
		c.err = err
	}
	if c.dilation, err = pair("dilation", cfg.Dilation, 1, false); err != nil {
		c.err = err
	}
	if c.padding, err = pair("padding", cfg.Padding, 0, true); err != nil {
		c.err = err
	}
	switch {
	case c.err != nil:
	case in <= 0 || out <= 0 || kernel <= 0:
		c.err = fmt.Errorf("conv2d %d → %d with kernel %d: sizes must be positive", in, out, kernel)
	case c.groups < 0 || in%c.groups != 0 || out%c.groups != 0:
		c.err = fmt.Errorf("conv2d %d → %d: %d groups do not divide the channels", in, out, c.groups)
	}
	if c.err != nil {
		c.weight = NewParameter(nil, ir.Float32, nil)
		return c
	}
	fanIn := in / c.groups * kernel * kernel
	k := 1 / math.Sqrt(float64(fanIn))
	c.weight = NewParameter([]int64{out, in / c.groups, kernel, kernel}, ir.Float32, Uniform(-k, k))
	if !cfg.NoBias {
		c.bias = NewParameter([]int64{out}, ir.Float32, Uniform(-k, k))
	}
	return c
}

// pair checks a 1- or 2-value option (4 too when four is set) and
// returns it in the operator's form; nil gives def.
func pair(what string, v []int64, def int64, four bool) ([]int64, error) {
	switch {
	case len(v) == 0:
		v = []int64{def}
	case len(v) == 4 && four, len(v) <= 2:
	case four:
		return nil, fmt.Errorf("conv2d %s: %d values, want 1, 2 or 4", what, len(v))
	default:
		return nil, fmt.Errorf("conv2d %s: %d values, want 1 or 2", what, len(v))
	}
	for _, x := range v {
		if x < 0 || x == 0 && what != "padding" {
			return nil, fmt.Errorf("conv2d %s %v: values must be positive", what, v)
		}
	}
	if len(v) == 1 {
		v = []int64{v[0], v[0]}
	}
	return v, nil
}

func (c *conv2d) configErr() error { return c.err }

// Forward emits the convolution and the bias.
func (c *conv2d) Forward(b *Builder, x *Tensor) (*Tensor, error) {
	if c.err != nil {
		return nil, c.err
	}
	w, err := b.Param(c.weight)
	if err != nil {
		return nil, err
	}
	y, err := b.Emit("relax.nn.conv2d", map[string]any{
		"strides": ints(c.stride), "padding": ints(c.padding), "dilation": ints(c.dilation), "groups": c.groups,
	}, x, w)
	if err != nil || c.bias == nil {
		return y, err
	}
	bias, err := b.Param(c.bias)
	if err != nil {
		return nil, err
	}
	rb, err := b.Reshape(bias, 1, c.out, 1, 1)
	if err != nil {
		return nil, err
	}
	return b.Add(y, rb)
}

// Params returns weight and bias.
func (c *conv2d) Params() []NamedParam {
	ps := []NamedParam{{"weight", c.weight}}
	if c.bias != nil {
		ps = append(ps, NamedParam{"bias", c.bias})
	}
	return ps
}

// Children returns nothing.
func (c *conv2d) Children() []Child { return nil }

type layerNorm struct {
	shape        []int64
	eps          float64
	weight, bias *Parameter
}

// NewLayerNorm normalizes over the trailing dimensions shape with
// epsilon eps (0 means 1e-5). With affine, parameters "weight" (ones) and
// "bias" (zeros) of that shape scale and shift the result; without, the
// graph carries constant ones and zeros. Forward emits R.nn.layer_norm.
func NewLayerNorm(shape []int64, eps float64, affine bool) Module {
	if eps == 0 {
		eps = 1e-5
	}
	l := &layerNorm{shape: append([]int64(nil), shape...), eps: eps}
	if affine {
		l.weight = NewParameter(shape, ir.Float32, Const(1))
		l.bias = NewParameter(shape, ir.Float32, Const(0))
	}
	return l
}

func (l *layerNorm) configErr() error {
	if len(l.shape) == 0 {
		return fmt.Errorf("layer_norm: empty normalized shape")
	}
	for _, d := range l.shape {
		if d <= 0 {
			return fmt.Errorf("layer_norm: normalized shape %v must be positive", l.shape)
		}
	}
	if l.eps < 0 || math.IsNaN(l.eps) {
		return fmt.Errorf("layer_norm: epsilon %g must not be negative", l.eps)
	}
	return nil
}

// Forward emits R.nn.layer_norm over the last len(shape) axes.
func (l *layerNorm) Forward(b *Builder, x *Tensor) (*Tensor, error) {
	if err := l.configErr(); err != nil {
		return nil, err
	}
	axes := make([]int64, len(l.shape))
	for i := range axes {
		axes[i] = int64(i - len(l.shape))
	}
	var gamma, beta any
	if l.weight != nil {
		g, err := b.Param(l.weight)
		if err != nil {
			return nil, err
		}
		bt, err := b.Param(l.bias)
		if err != nil {
			return nil, err
		}
		gamma, beta = g, bt
	} else {
		var err error
		if gamma, err = constFloat32(l.shape, 1); err != nil {
			return nil, err
		}
		if beta, err = constFloat32(l.shape, 0); err != nil {
			return nil, err
		}
	}
	return b.Emit("relax.nn.layer_norm", map[string]any{"axes": ints(axes), "epsilon": l.eps}, x, gamma, beta)
}

func constFloat32(shape []int64, v float32) (ir.RExpr, error) {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	data := make([]byte, 4*n)
	for i := int64(0); i < n; i++ {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
	}
	c, err := ir.ConstantFromBytes(ir.Float32, shape, data)
	if err != nil {
		return nil, fmt.Errorf("layer_norm constant: %w", err)
	}
	return c, nil
}

// Params returns weight and bias when affine.
func (l *layerNorm) Params() []NamedParam {
	if l.weight == nil {
		return nil
	}
	return []NamedParam{{"weight", l.weight}, {"bias", l.bias}}
}

// Children returns nothing.
func (l *layerNorm) Children() []Child { return nil }

type embedding struct {
	num, dim int64
	weight   *Parameter
}

// NewEmbedding returns a lookup table of num vectors of dim: parameter
// "weight" (num, dim), normal(0, 1). Forward takes integer indices of any
// shape and emits R.take(weight, indices, axis=0), flattening the
// indices and reshaping the result to (…indices' shape, dim) when they
// are not 1-D, as TVM's nn.Embedding does.
func NewEmbedding(num, dim int64) Module {
	return &embedding{num: num, dim: dim, weight: NewParameter([]int64{num, dim}, ir.Float32, Normal(0, 1))}
}

func (e *embedding) configErr() error {
	if e.num <= 0 || e.dim <= 0 {
		return fmt.Errorf("embedding %d × %d: sizes must be positive", e.num, e.dim)
	}
	return nil
}

// Forward emits the lookup.
func (e *embedding) Forward(b *Builder, x *Tensor) (*Tensor, error) {
	if !x.DType().IsInt() {
		return nil, fmt.Errorf("embedding: indices %s must have an integer dtype", x.Info())
	}
	w, err := b.Param(e.weight)
	if err != nil {
		return nil, err
	}
	shape, ok := x.Shape()
	if !ok {
		return nil, fmt.Errorf("embedding: indices %s need a known shape", x.Info())
	}
	if len(shape) == 1 {
		return b.Emit("relax.take", map[string]any{"axis": int64(0)}, w, x)
	}
	flat, err := b.Reshape(x, -1)
	if err != nil {
		return nil, err
	}
	y, err := b.Emit("relax.take", map[string]any{"axis": int64(0)}, w, flat)
	if err != nil {
		return nil, err
	}
	return b.Reshape(y, append(shape, e.dim)...)
}

// Params returns weight.
func (e *embedding) Params() []NamedParam { return []NamedParam{{"weight", e.weight}} }

// Children returns nothing.
func (e *embedding) Children() []Child { return nil }
