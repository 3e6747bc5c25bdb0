package topi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/ndarray"
)

// ErrNoLegalizer is returned (wrapped) by LegalizeCall for a call of an
// operator this package does not implement; LegalizeOps leaves such calls
// alone (shape_of, memory operators, prod…).
var ErrNoLegalizer = errors.New("no legalization for the operator")

// Result is a legalized operator call.
type Result struct {
	// Func computes the call in destination-passing style: its
	// parameters are one buffer per element of Args, then one per output.
	// It is private (no global_symbol attribute) and has tir.noalias.
	// Buffers are named after the arguments (graph variable names) and
	// the stages after TVM's (T_add, matmul, compute…).
	Func *ir.PrimFunc
	// NameHint is the name TVM gives the function ("add", "matmul",
	// "transpose" for permute_dims, "relu", "concatenate"…); the caller
	// makes it unique in its module.
	NameHint string
	// Args are the call_tir inputs in parameter order: the call's tensor
	// arguments, a tuple argument (concat's) contributing its fields.
	// Scalar and shape arguments (clip's bounds, reshape's shape) are
	// folded into Func.
	Args []ir.RExpr
	// Out is the outputs' struct info: a tensor, or a tuple of tensors for
	// split and batch_norm. Pass it to call_tir as out_sinfo.
	Out ir.StructInfo
}

// legalizer builds the output tensors of a call.
type legalizer struct {
	hint  string
	build func(c *lctx) ([]*te.Tensor, error)
}

var legalizers = map[string]legalizer{}

func one(t *te.Tensor, err error) ([]*te.Tensor, error) {
	if err != nil {
		return nil, err
	}
	return []*te.Tensor{t}, nil
}

func init() {
	binary := map[string]func(a, b *te.Tensor) (*te.Tensor, error){
		"add": Add, "subtract": Subtract, "multiply": Multiply, "divide": Divide, "floor_divide": FloorDivide,
		"power": Power, "maximum": Maximum, "minimum": Minimum,
	}
	for name, f := range binary {
		legalizers["relax."+name] = legalizer{name, func(c *lctx) ([]*te.Tensor, error) {
			if name == "power" {
				if t, ok, err := c.squareOf(); ok || err != nil {
					return one(t, err)
				}
			}
			a, b, err := c.two()
			if err != nil {
				return nil, err
			}
			return one(f(a, b))
		}}
	}
	for _, name := range []string{"equal", "not_equal", "less", "less_equal", "greater", "greater_equal"} {
		legalizers["relax."+name] = legalizer{name, func(c *lctx) ([]*te.Tensor, error) {
			a, b, err := c.two()
			if err != nil {
				return nil, err
			}
			return one(Compare(name, a, b))
		}}
	}
	for name, u := range unaryOps {
		full := "relax." + name
		if u.stage != "" {
			full = "relax.nn." + name
		}
		legalizers[full] = legalizer{name, func(c *lctx) ([]*te.Tensor, error) {
			x, err := c.tensor(0)
			if err != nil {
				return nil, err
			}
			return one(Unary(name, x))
		}}
	}
	legalizers["relax.astype"] = legalizer{"cast", legalizeAstype}
	legalizers["relax.clip"] = legalizer{"clip", legalizeClip}
	legalizers["relax.where"] = legalizer{"where", func(c *lctx) ([]*te.Tensor, error) {
		ts, err := c.all()
		if err != nil {
			return nil, err
		}
		return one(Where(ts[0], ts[1], ts[2]))
	}}
	legalizers["relax.matmul"] = legalizer{"matmul", func(c *lctx) ([]*te.Tensor, error) {
		a, b, err := c.two()
		if err != nil {
			return nil, err
		}
		dt, err := c.dtype("out_dtype")
		if err != nil {
			return nil, err
		}
		return one(Matmul(a, b, dt))
	}}
	legalizers["relax.matmul_packed"] = legalizer{"matmul", func(c *lctx) ([]*te.Tensor, error) {
		a, w, err := c.two()
		if err != nil {
			return nil, err
		}
		return one(MatmulPacked(a, w))
	}}
	legalizers["relax.nn.linear"] = legalizer{"linear", legalizeLinear}
	legalizers["relax.permute_dims"] = legalizer{"transpose", func(c *lctx) ([]*te.Tensor, error) {
		x, err := c.tensor(0)
		if err != nil {
			return nil, err
		}
		axes, _ := c.ints("axes")
		return one(Transpose(x, axes))
	}}
	legalizers["relax.reshape"] = legalizer{"reshape", tensorAndShape(Reshape)}
	legalizers["relax.flatten"] = legalizer{"reshape", func(c *lctx) ([]*te.Tensor, error) {
		x, err := c.tensor(0)
		if err != nil {
			return nil, err
		}
		return one(Flatten(x))
	}}
	legalizers["relax.broadcast_to"] = legalizer{"broadcast_to", tensorAndShape(BroadcastTo)}
	legalizers["relax.concat"] = legalizer{"concatenate", func(c *lctx) ([]*te.Tensor, error) {
		ts, err := c.tuple(0)
		if err != nil {
			return nil, err
		}
		var axis *int64
		if v, ok := c.int("axis"); ok {
			axis = &v
		}
		return one(Concat(ts, axis))
	}}
	legalizers["relax.split"] = legalizer{"split", func(c *lctx) ([]*te.Tensor, error) {
		x, err := c.tensor(0)
		if err != nil {
			return nil, err
		}
		axis, _ := c.int("axis")
		if n, ok := c.int("indices_or_sections"); ok {
			return Split(x, n, nil, axis)
		}
		idx, _ := c.ints("indices_or_sections")
		if idx == nil {
			idx = []int64{}
		}
		return Split(x, 0, idx, axis)
	}}
	legalizers["relax.strided_slice"] = legalizer{"strided_slice", func(c *lctx) ([]*te.Tensor, error) {
		x, err := c.tensor(0)
		if err != nil {
			return nil, err
		}
		axes, _ := c.ints("axes")
		begin, _ := c.ints("begin")
		end, _ := c.ints("end")
		strides, _ := c.ints("strides")
		return one(StridedSlice(x, axes, begin, end, strides))
	}}
	legalizers["relax.take"] = legalizer{"take", func(c *lctx) ([]*te.Tensor, error) {
		x, ind, err := c.two()
		if err != nil {
			return nil, err
		}
		var axis *int64
		if v, ok := c.int("axis"); ok {
			axis = &v
		}
		mode, _ := c.attrs["mode"].(string)
		return one(Take(x, ind, axis, mode))
	}}
	legalizers["relax.expand_dims"] = legalizer{"expand_dims", func(c *lctx) ([]*te.Tensor, error) {
		x, err := c.tensor(0)
		if err != nil {
			return nil, err
		}
		axes, _ := c.ints("axis")
		return one(ExpandDims(x, axes))
	}}
	legalizers["relax.squeeze"] = legalizer{"squeeze", func(c *lctx) ([]*te.Tensor, error) {
		x, err := c.tensor(0)
		if err != nil {
			return nil, err
		}
		axes, _ := c.ints("axis")
		return one(Squeeze(x, axes))
	}}
	reductions := map[string]func(x *te.Tensor, axes []int64, keep bool) (*te.Tensor, error){
		"sum": Sum, "mean": Mean, "max": Max, "min": Min,
		"variance": func(x *te.Tensor, axes []int64, keep bool) (*te.Tensor, error) { return Variance(x, axes, keep, false) },
		"std":      func(x *te.Tensor, axes []int64, keep bool) (*te.Tensor, error) { return Variance(x, axes, keep, true) },
	}
	for name, f := range reductions {
		legalizers["relax."+name] = legalizer{name, func(c *lctx) ([]*te.Tensor, error) {
			x, err := c.tensor(0)
			if err != nil {
				return nil, err
			}
			axes, _ := c.ints("axis")
			keep, _ := c.attrs["keepdims"].(bool)
			return one(f(x, axes, keep))
		}}
	}
	for name, f := range map[string]func(*te.Tensor, *int64, bool) (*te.Tensor, error){"argmax": Argmax, "argmin": Argmin} {
		legalizers["relax."+name] = legalizer{name, func(c *lctx) ([]*te.Tensor, error) {
			x, err := c.tensor(0)
			if err != nil {
				return nil, err
			}
			var axis *int64
			if v, ok := c.int("axis"); ok {
				axis = &v
			}
			keep, _ := c.attrs["keepdims"].(bool)
			return one(f(x, axis, keep))
		}}
	}
	legalizers["relax.nn.softmax"] = legalizer{"softmax", func(c *lctx) ([]*te.Tensor, error) {
		x, err := c.tensor(0)
		if err != nil {
			return nil, err
		}
		axis, _ := c.int("axis")
		return one(Softmax(x, axis))
	}}
	legalizers["relax.nn.log_softmax"] = legalizer{"log_softmax", func(c *lctx) ([]*te.Tensor, error) {
		x, err := c.tensor(0)
		if err != nil {
			return nil, err
		}
		axis, _ := c.int("axis")
		return one(LogSoftmax(x, axis))
	}}
	legalizers["relax.nn.layer_norm"] = legalizer{"layer_norm", func(c *lctx) ([]*te.Tensor, error) {
		ts, err := c.all()
		if err != nil {
			return nil, err
		}
		axes, _ := c.ints("axes")
		eps, _ := c.attrs["epsilon"].(float64)
		center, _ := c.attrs["center"].(bool)
		scale, _ := c.attrs["scale"].(bool)
		return one(LayerNorm(ts[0], ts[1], ts[2], axes, eps, center, scale))
	}}
	legalizers["relax.nn.batch_norm"] = legalizer{"batch_norm", func(c *lctx) ([]*te.Tensor, error) {
		ts, err := c.all()
		if err != nil {
			return nil, err
		}
		axis, _ := c.int("axis")
		eps, _ := c.attrs["epsilon"].(float64)
		center, _ := c.attrs["center"].(bool)
		scale, _ := c.attrs["scale"].(bool)
		return BatchNorm(ts[0], ts[1], ts[2], ts[3], ts[4], axis, eps, center, scale)
	}}
	legalizers["relax.nn.conv2d"] = legalizer{"conv2d", legalizeConv2D}
	legalizers["relax.nn.max_pool2d"] = legalizer{"max_pool2d", func(c *lctx) ([]*te.Tensor, error) { return legalizePool(c, true) }}
	legalizers["relax.nn.avg_pool2d"] = legalizer{"avg_pool2d", func(c *lctx) ([]*te.Tensor, error) { return legalizePool(c, false) }}
	legalizers["relax.nn.adaptive_avg_pool2d"] = legalizer{"adaptive_avg_pool2d", func(c *lctx) ([]*te.Tensor, error) {
		x, err := c.tensor(0)
		if err != nil {
			return nil, err
		}
		size, _ := c.ints("output_size")
		layout, _ := c.attrs["layout"].(string)
		outLayout, _ := c.attrs["out_layout"].(string)
		return one(AdaptiveAvgPool2D(x, size, layout, outLayout))
	}}

	for name := range legalizers {
		if _, ok := op.Lookup(name); ok {
			if err := op.SetLegalize(name, Legalize); err != nil {
				panic(err) // the name was just looked up
			}
		}
	}
}

func legalizeAstype(c *lctx) ([]*te.Tensor, error) {
	x, err := c.tensor(0)
	if err != nil {
		return nil, err
	}
	dt, err := c.dtype("dtype")
	if err != nil {
		return nil, err
	}
	if ir.IsVoid(dt) {
		return nil, fmt.Errorf("astype: no dtype")
	}
	return one(Cast(x, dt))
}

func legalizeClip(c *lctx) ([]*te.Tensor, error) {
	x, err := c.tensor(0)
	if err != nil {
		return nil, err
	}
	lo, err := c.prim(1)
	if err != nil {
		return nil, err
	}
	hi, err := c.prim(2)
	if err != nil {
		return nil, err
	}
	return one(Clip(x, lo, hi))
}

func legalizeLinear(c *lctx) ([]*te.Tensor, error) {
	ts, err := c.all()
	if err != nil {
		return nil, err
	}
	dt, err := c.dtype("out_dtype")
	if err != nil {
		return nil, err
	}
	var bias *te.Tensor
	if len(ts) == 3 {
		bias = ts[2]
	}
	return one(Linear(ts[0], ts[1], bias, dt))
}

func legalizeConv2D(c *lctx) ([]*te.Tensor, error) {
	x, w, err := c.two()
	if err != nil {
		return nil, err
	}
	a := Conv2DAttrs{}
	if a.Strides, err = c.pair("strides"); err != nil {
		return nil, err
	}
	if a.Dilation, err = c.pair("dilation"); err != nil {
		return nil, err
	}
	if a.Padding, err = c.padding(); err != nil {
		return nil, err
	}
	a.Groups, _ = c.int("groups")
	a.DataLayout, _ = c.attrs["data_layout"].(string)
	a.KernelLayout, _ = c.attrs["kernel_layout"].(string)
	a.OutLayout, _ = c.attrs["out_layout"].(string)
	if a.OutDType, err = c.dtype("out_dtype"); err != nil {
		return nil, err
	}
	return one(Conv2D(x, w, a))
}

func legalizePool(c *lctx, isMax bool) ([]*te.Tensor, error) {
	x, err := c.tensor(0)
	if err != nil {
		return nil, err
	}
	a := Pool2DAttrs{}
	if a.PoolSize, err = c.pair("pool_size"); err != nil {
		return nil, err
	}
	if a.Strides, err = c.pair("strides"); err != nil {
		return nil, err
	}
	if a.Dilation, err = c.pair("dilation"); err != nil {
		return nil, err
	}
	if a.Padding, err = c.padding(); err != nil {
		return nil, err
	}
	a.CeilMode, _ = c.attrs["ceil_mode"].(bool)
	a.CountIncludePad, _ = c.attrs["count_include_pad"].(bool)
	a.Layout, _ = c.attrs["layout"].(string)
	a.OutLayout, _ = c.attrs["out_layout"].(string)
	if isMax {
		return one(MaxPool2D(x, a))
	}
	return one(AvgPool2D(x, a))
}

// Ops returns the full names of the operators LegalizeCall handles,
// sorted.
func Ops() []string { return slices.Sorted(maps.Keys(legalizers)) }

// Legalize returns the PrimFunc of LegalizeCall; it is the op.Legalizer
// this package attaches to the registry's operators.
func Legalize(call *ir.RCall) (*ir.PrimFunc, error) {
	r, err := LegalizeCall(call)
	if err != nil {
		return nil, err
	}
	return r.Func, nil
}

// LegalizeCall lowers a call of a registered operator whose tensor
// arguments have known shapes and dtypes (struct info) into a PrimFunc,
// with the arguments and output struct info call_tir needs. Attributes
// are normalized with the operator's schema first, so calls built
// without defaults work. Errors name the operator; an operator without a
// legalization gives ErrNoLegalizer.
func LegalizeCall(call *ir.RCall) (*Result, error) {
	if call == nil {
		return nil, errors.New("legalize: nil call")
	}
	o, ok := call.Op.(*ir.Op)
	if !ok {
		return nil, fmt.Errorf("legalize: callee %T is not an operator: %w", call.Op, ErrNoLegalizer)
	}
	l, ok := legalizers[o.Name]
	if !ok {
		return nil, fmt.Errorf("legalize %q: %w", o.Name, ErrNoLegalizer)
	}
	def, ok := op.Lookup(o.Name)
	if !ok {
		return nil, fmt.Errorf("legalize: unknown operator %q", o.Name)
	}
	required := 0
	for _, a := range def.Args {
		if !a.Optional {
			required++
		}
	}
	if n := len(call.Args); n < required || n > len(def.Args) {
		want := fmt.Sprint(required)
		if required != len(def.Args) {
			want = fmt.Sprintf("%d to %d", required, len(def.Args))
		}
		return nil, fmt.Errorf("legalize: %s takes %s arguments, got %d", def.ShortName(), want, n)
	}
	attrs, err := def.NormalizeAttrs(call.Attrs)
	if err != nil {
		return nil, fmt.Errorf("legalize: %w", err)
	}
	// First pass: placeholders with neutral names, to learn the names of
	// the stages; second pass: the arguments' names, made unique.
	c := &lctx{call: call, def: def, attrs: attrs}
	f, outs, err := c.run(l)
	if err != nil {
		return nil, fmt.Errorf("legalize: %w", err)
	}
	taken := map[string]bool{}
	for i, b := range f.Params {
		if i >= len(c.inputs) {
			taken[f.BufferMap[b].Name] = true
		}
	}
	ir.Visit(f.Body, func(n ir.Node) bool {
		if blk, ok := n.(*ir.Block); ok {
			taken[blk.Name] = true
			for _, b := range blk.AllocBuffers {
				taken[b.Name] = true
			}
		}
		return true
	})
	final := make([]string, len(c.wanted))
	for i, w := range c.wanted {
		name := w
		for k := 1; taken[name]; k++ {
			name = fmt.Sprintf("%s_%d", w, k)
		}
		taken[name] = true
		final[i] = name
	}
	c2 := &lctx{call: call, def: def, attrs: attrs, names: final}
	if f, outs, err = c2.run(l); err != nil {
		return nil, fmt.Errorf("legalize: %w", err)
	}
	attrsOut := maps.Clone(f.Attrs)
	delete(attrsOut, ir.AttrGlobalSymbol)
	g := *f
	g.Attrs = attrsOut
	var out ir.StructInfo
	infos := make([]ir.StructInfo, len(outs))
	for i, t := range outs {
		shape := make([]ir.Expr, len(t.Shape))
		for j, d := range t.Shape {
			shape[j] = ir.FoldDim(d)
		}
		infos[i] = ir.Tensor(t.DType, shape...)
	}
	if len(infos) == 1 && !l.multi() {
		out = infos[0]
	} else {
		out = ir.Tuple(infos...)
	}
	return &Result{Func: &g, NameHint: l.hint, Args: c2.args, Out: out}, nil
}

// multi reports operators whose result is a tuple even with one field.
func (l legalizer) multi() bool { return l.hint == "split" || l.hint == "batch_norm" }

// lctx is one legalization of a call: it turns the call's arguments into
// te placeholders and reads its attributes.
type lctx struct {
	call   *ir.RCall
	def    *op.Def
	attrs  map[string]any
	names  []string     // placeholder names; nil: neutral names
	wanted []string     // the names the arguments suggest, per input
	inputs []*te.Tensor // placeholders, in parameter order
	args   []ir.RExpr   // the call_tir arguments, parallel to inputs
}

func (c *lctx) run(l legalizer) (*ir.PrimFunc, []*te.Tensor, error) {
	outs, err := l.build(c)
	if err != nil {
		return nil, nil, err
	}
	f, err := te.CreatePrimFunc(append(slices.Clone(c.inputs), outs...))
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", c.def.ShortName(), err)
	}
	return f, outs, nil
}

// argName is what argument i is called in messages and buffer names.
func (c *lctx) argName(i int) string {
	if v, ok := c.call.Args[i].(*ir.RVar); ok && v.Name != "" {
		return v.Name
	}
	if i < len(c.def.Args) {
		return c.def.Args[i].Name
	}
	return fmt.Sprintf("arg%d", i)
}

// placeholder makes the next input from a tensor struct info.
func (c *lctx) placeholder(si ir.StructInfo, arg ir.RExpr, want, what string) (*te.Tensor, error) {
	t, ok := si.(*ir.TensorStructInfo)
	if !ok {
		return nil, fmt.Errorf("%s: argument %s is %s, want a tensor", c.def.ShortName(), what, si)
	}
	if t.Shape == nil {
		return nil, fmt.Errorf("%s: argument %s has unknown shape (%s)", c.def.ShortName(), what, t)
	}
	if ir.IsVoid(t.DType) {
		return nil, fmt.Errorf("%s: argument %s has unknown dtype (%s)", c.def.ShortName(), what, t)
	}
	name := fmt.Sprintf("input%d", len(c.inputs))
	if c.names != nil {
		name = c.names[len(c.inputs)]
	}
	p := te.Placeholder(t.Shape, t.DType, name)
	if err := p.Err(); err != nil {
		return nil, fmt.Errorf("%s: argument %s: %w", c.def.ShortName(), what, err)
	}
	c.inputs = append(c.inputs, p)
	c.args = append(c.args, arg)
	c.wanted = append(c.wanted, want)
	return p, nil
}

// tensor returns the placeholder of tensor argument i.
func (c *lctx) tensor(i int) (*te.Tensor, error) {
	if i >= len(c.call.Args) {
		return nil, fmt.Errorf("%s: missing argument %d", c.def.ShortName(), i)
	}
	a := c.call.Args[i]
	return c.placeholder(ir.StructInfoOf(a), a, c.argName(i), fmt.Sprintf("%q", c.argName(i)))
}

// squareOf legalizes power(x, 2) with a constant float exponent of 2
// (layer norm's variance as ONNX exporters write it) as x * x: no pow
// call, and the same value. ok is false for any other call.
func (c *lctx) squareOf() (*te.Tensor, bool, error) {
	if len(c.call.Args) != 2 {
		return nil, false, nil
	}
	e, ok := c.call.Args[1].(*ir.Constant)
	x, isT := ir.StructInfoOf(c.call.Args[0]).(*ir.TensorStructInfo)
	if !ok || !isT || x.Shape == nil || len(e.Shape) > len(x.Shape) || !e.DType.IsFloat() || e.DType != x.DType {
		return nil, false, nil
	}
	if v, ok := scalarValue(e); !ok || v != 2 {
		return nil, false, nil
	}
	a, err := c.tensor(0)
	if err != nil {
		return nil, true, err
	}
	t, err := Unary("square", a)
	return t, true, err
}

// scalarValue is the value of a float constant of one element.
func scalarValue(e *ir.Constant) (float64, bool) {
	for _, d := range e.Shape {
		if d != 1 {
			return 0, false
		}
	}
	switch {
	case e.DType == ir.Float32 && len(e.Data) == 4:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(e.Data))), true
	case e.DType == ir.Float64 && len(e.Data) == 8:
		return math.Float64frombits(binary.LittleEndian.Uint64(e.Data)), true
	}
	return 0, false
}

// two returns tensor arguments 0 and 1.
func (c *lctx) two() (*te.Tensor, *te.Tensor, error) {
	a, err := c.tensor(0)
	if err != nil {
		return nil, nil, err
	}
	b, err := c.tensor(1)
	return a, b, err
}

// all returns every argument as a tensor.
func (c *lctx) all() ([]*te.Tensor, error) {
	out := make([]*te.Tensor, len(c.call.Args))
	for i := range c.call.Args {
		t, err := c.tensor(i)
		if err != nil {
			return nil, err
		}
		out[i] = t
	}
	return out, nil
}

// tuple returns the fields of tuple argument i as placeholders.
func (c *lctx) tuple(i int) ([]*te.Tensor, error) {
	if i >= len(c.call.Args) {
		return nil, fmt.Errorf("%s: missing argument %d", c.def.ShortName(), i)
	}
	a := c.call.Args[i]
	ts, ok := ir.StructInfoOf(a).(*ir.TupleStructInfo)
	if !ok {
		return nil, fmt.Errorf("%s: argument %q is %s, want a tuple of tensors", c.def.ShortName(), c.argName(i), ir.StructInfoOf(a))
	}
	out := make([]*te.Tensor, len(ts.Fields))
	lit, isLit := a.(*ir.RTuple)
	for j, f := range ts.Fields {
		var fe ir.RExpr = &ir.TupleGetItem{Tuple: a, Index: j}
		want := fmt.Sprintf("%s_%d", c.argName(i), j)
		if isLit {
			fe = lit.Fields[j]
			if v, ok := fe.(*ir.RVar); ok && v.Name != "" {
				want = v.Name
			}
		}
		t, err := c.placeholder(f, fe, want, fmt.Sprintf("%q field %d", c.argName(i), j))
		if err != nil {
			return nil, err
		}
		out[j] = t
	}
	return out, nil
}

// shape returns the values of shape argument i.
// tensorAndShape legalizes an operator whose arguments are a tensor and a
// target shape (reshape, broadcast_to).
func tensorAndShape(f func(*te.Tensor, []ir.Expr) (*te.Tensor, error)) func(*lctx) ([]*te.Tensor, error) {
	return func(c *lctx) ([]*te.Tensor, error) {
		x, err := c.tensor(0)
		if err != nil {
			return nil, err
		}
		s, err := c.shape(1)
		if err != nil {
			return nil, err
		}
		return one(f(x, s))
	}
}

func (c *lctx) shape(i int) ([]ir.Expr, error) {
	if i >= len(c.call.Args) {
		return nil, fmt.Errorf("%s: missing argument %d", c.def.ShortName(), i)
	}
	if s, ok := c.call.Args[i].(*ir.ShapeExpr); ok {
		return s.Values, nil
	}
	s, ok := ir.StructInfoOf(c.call.Args[i]).(*ir.ShapeStructInfo)
	if !ok || s.Values == nil {
		return nil, fmt.Errorf("%s: argument %q must be a known shape", c.def.ShortName(), c.argName(i))
	}
	return s.Values, nil
}

// prim returns the value of scalar argument i.
func (c *lctx) prim(i int) (ir.Expr, error) {
	if i >= len(c.call.Args) {
		return nil, fmt.Errorf("%s: missing argument %d", c.def.ShortName(), i)
	}
	if p, ok := c.call.Args[i].(*ir.PrimValue); ok && p.Value != nil {
		return p.Value, nil
	}
	p, ok := ir.StructInfoOf(c.call.Args[i]).(*ir.PrimStructInfo)
	if !ok || p.Value == nil {
		return nil, fmt.Errorf("%s: argument %q must be a known scalar", c.def.ShortName(), c.argName(i))
	}
	return p.Value, nil
}

// int returns an integer attribute; false when it is None.
func (c *lctx) int(key string) (int64, bool) {
	v, ok := c.attrs[key].(int64)
	return v, ok
}

// ints returns a list attribute; nil when it is None.
func (c *lctx) ints(key string) ([]int64, bool) {
	switch v := c.attrs[key].(type) {
	case []any:
		out := make([]int64, len(v))
		for i, x := range v {
			out[i], _ = x.(int64)
		}
		return out, true
	case int64:
		return []int64{v}, true
	}
	return nil, false
}

// dtype returns a dtype attribute, Void for "void".
func (c *lctx) dtype(key string) (ir.DType, error) {
	s, _ := c.attrs[key].(string)
	if s == "" || s == "void" {
		return ir.Void, nil
	}
	t, err := ndarray.ParseDType(s)
	if err != nil {
		return ir.Void, fmt.Errorf("%s: attribute %q: unknown dtype %q", c.def.ShortName(), key, s)
	}
	return t, nil
}

// pair expands a 1- or 2-value attribute.
func (c *lctx) pair(key string) ([2]int64, error) {
	v, _ := c.ints(key)
	switch len(v) {
	case 1:
		return [2]int64{v[0], v[0]}, nil
	case 2:
		return [2]int64{v[0], v[1]}, nil
	}
	return [2]int64{}, fmt.Errorf("%s: %s has %d values, want 1 or 2", c.def.ShortName(), key, len(v))
}

// padding expands padding to (top, left, bottom, right).
func (c *lctx) padding() ([4]int64, error) {
	v, _ := c.ints("padding")
	switch len(v) {
	case 1:
		return [4]int64{v[0], v[0], v[0], v[0]}, nil
	case 2:
		return [4]int64{v[0], v[1], v[0], v[1]}, nil
	case 4:
		return [4]int64{v[0], v[1], v[2], v[3]}, nil
	}
	return [4]int64{}, fmt.Errorf("%s: padding has %d values, want 1, 2 or 4", c.def.ShortName(), len(v))
}

// Build legalizes the operator opName ("relax.add" or "add") applied to
// arguments described by their struct infos (tensors; shapes for
// reshape/broadcast_to; known scalars for clip; a tuple for concat) with
// attrs. Arguments are named after the operator's schema (x1, x2, data…).
// It is LegalizeCall for callers without a graph.
func Build(opName string, args []ir.StructInfo, attrs map[string]any) (*Result, error) {
	if !strings.HasPrefix(opName, "relax.") {
		opName = "relax." + opName
	}
	def, ok := op.Lookup(opName)
	if !ok {
		return nil, fmt.Errorf("legalize: unknown operator %q", opName)
	}
	call := &ir.RCall{Op: &ir.Op{Name: opName}, Attrs: attrs}
	for i, si := range args {
		name := fmt.Sprintf("arg%d", i)
		if i < len(def.Args) {
			name = def.Args[i].Name
		}
		call.Args = append(call.Args, &ir.RVar{Name: name, Info: si})
	}
	return LegalizeCall(call)
}
