package onnx

import (
	"bytes"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/compiler/frontend/onnx/onnxpb"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/ndarray"
)

// Options says how to import a model.
type Options struct {
	// Func names the graph function; "" means "main".
	Func string
	// InputShapes gives the full shape of inputs whose dimensions are
	// symbolic (or overrides a static one, which must then agree).
	InputShapes map[string][]int64
	// Known fixes the values of some inputs at import time: they are
	// folded into the graph and are not parameters of the function. A
	// model whose shapes, axes or pads are computed from an input needs
	// that input known.
	Known map[string]*Tensor
	// Im2Col imports a float32 convolution of one group as a patch
	// gather and a matmul; by default convolutions stay R.nn.conv2d,
	// which the default CPU schedule runs as a direct convolution.
	Im2Col bool
	// ConstLimit is the largest initializer (in elements) folded into the
	// graph as a constant rather than passed as a weight parameter; 0
	// means 16. Initializers needed at import time (shapes, axes) are
	// always read directly.
	ConstLimit int64
}

// Params are the weights of an imported model, named as the model's
// initializers, in the order of the function's weight parameters.
type Params struct {
	list []*Tensor
}

// Names returns the weights' names in parameter order.
func (p *Params) Names() []string {
	out := make([]string, len(p.list))
	for i, t := range p.list {
		out[i] = t.Name
	}
	return out
}

// Tensors returns the weights in parameter order.
func (p *Params) Tensors() []*Tensor { return slices.Clone(p.list) }

// Len is the number of weights.
func (p *Params) Len() int { return len(p.list) }

// NDArrays returns the weights as arrays on dev, keyed by the name of
// the function parameter that takes each (VarName of the initializer).
func (p *Params) NDArrays(dev devices.Device) (map[string]*ndarray.NDArray, error) {
	out := map[string]*ndarray.NDArray{}
	for _, t := range p.list {
		a, err := t.NDArray(dev)
		if err != nil {
			return nil, fmt.Errorf("weight %q: %w", t.Name, err)
		}
		out[VarName(t.Name)] = a
	}
	return out, nil
}

// Safetensors returns the weights as a safetensors file, keyed like
// NDArrays, for compiler.BuildOptions.Params or kiln run --params.
func (p *Params) Safetensors() ([]byte, error) {
	nds, err := p.NDArrays(devices.CPUDevice)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := ndarray.WriteSafetensors(&buf, nds, map[string]string{"format": "kiln-onnx"}); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// VarName is the graph variable name of an ONNX value or initializer:
// characters other than letters, digits and underscores become
// underscores, and a leading digit gets a "v" in front.
func VarName(name string) string {
	var b strings.Builder
	for i, r := range name {
		ok := r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		if i == 0 && r >= '0' && r <= '9' {
			b.WriteByte('v')
		}
		if ok {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		return "v"
	}
	return b.String()
}

// value is an ONNX value during import: a graph variable, or a tensor
// known at import time (an initializer, a Constant, a folded result).
type value struct {
	v    *ir.RVar
	c    *Tensor
	init bool // c is an initializer (a weight unless it is small)
}

func (v *value) known() bool { return v != nil && v.c != nil }

func (v *value) shape() []int64 {
	if v.c != nil {
		return v.c.Shape
	}
	s, _ := v.v.Info.(*ir.TensorStructInfo).KnownShape()
	return s
}

func (v *value) dtype() ir.DType {
	if v.c != nil {
		return v.c.DType
	}
	return v.v.Info.(*ir.TensorStructInfo).DType
}

func (v *value) rank() int { return len(v.shape()) }

// importer builds the graph function.
type importer struct {
	m        *Model
	opts     Options
	vals     map[string]*value
	bindings []ir.Binding
	params   []*ir.RVar
	weights  []*Tensor
	// weightOf holds the parameters made from each initializer, by its
	// name: one per layout, since a reshaped, transposed or flipped copy
	// keeps the initializer's name (so that the weight is named after
	// it) but is a different tensor.
	weightOf map[string][]weightParam
	next     map[string]int
	used     map[string]bool
	// source is the node being converted: every call it emits comes
	// from it.
	source ir.Source
}

// weightParam is a weight parameter and the tensor it holds.
type weightParam struct {
	t *Tensor
	p *ir.RVar
}

// node is one ONNX node being converted.
type node struct {
	p     *onnxpb.NodeProto
	index int
	opset int64
	in    []*value // nil for an optional input left out
	attrs map[string]*onnxpb.AttributeProto
}

func (n *node) String() string {
	return fmt.Sprintf("%s, opset %d", NodeName(n.p, n.index), n.opset)
}

func (n *node) input(i int) *value {
	if i < len(n.in) {
		return n.in[i]
	}
	return nil
}

func (n *node) attrInt(name string, def int64) int64 {
	if a, ok := n.attrs[name]; ok {
		return a.GetI()
	}
	return def
}

func (n *node) attrFloat(name string, def float64) float64 {
	if a, ok := n.attrs[name]; ok {
		return float64(a.GetF())
	}
	return def
}

func (n *node) attrInts(name string) ([]int64, bool) {
	a, ok := n.attrs[name]
	if !ok {
		return nil, false
	}
	return a.GetInts(), true
}

func (n *node) attrString(name, def string) string {
	if a, ok := n.attrs[name]; ok {
		return string(a.GetS())
	}
	return def
}

// Import converts a checked model into a graph function (see the package
// documentation) and its weights.
func Import(m *Model, opts Options) (*ir.IRModule, *Params, error) {
	if opts.Func == "" {
		opts.Func = "main"
	}
	if opts.ConstLimit == 0 {
		opts.ConstLimit = 16
	}
	if err := Check(m); err != nil {
		return nil, nil, err
	}
	im := &importer{m: m, opts: opts, vals: map[string]*value{}, weightOf: map[string][]weightParam{},
		next: map[string]int{}, used: map[string]bool{}}
	for name, t := range m.Initializers {
		im.vals[name] = &value{c: t, init: true}
	}
	for name := range opts.InputShapes {
		if !slices.ContainsFunc(m.Inputs, func(in *onnxpb.ValueInfoProto) bool { return in.GetName() == name }) {
			var names []string
			for _, in := range m.Inputs {
				names = append(names, strconv.Quote(in.GetName()))
			}
			return nil, nil, fmt.Errorf("--input-shape %q: the model has no such input (its inputs: %s)", name, strings.Join(names, ", "))
		}
	}
	var inputs []*ir.RVar
	for _, in := range m.Inputs {
		if t, ok := opts.Known[in.GetName()]; ok {
			im.vals[in.GetName()] = constant(t)
			continue
		}
		v, err := im.input(in)
		if err != nil {
			return nil, nil, err
		}
		inputs = append(inputs, v)
		im.vals[in.GetName()] = &value{v: v}
	}
	fold := foldBatchNorm(m)
	convFold := map[*onnxpb.NodeProto]*bnFold{}
	for _, f := range fold {
		convFold[f.conv] = f
	}
	for i, np := range m.Nodes {
		if f := fold[np]; f != nil {
			// A BatchNormalization folded into the Conv before it: its
			// output is the Conv's.
			im.vals[np.GetOutput()[0]] = im.vals[f.conv.GetOutput()[0]]
			continue
		}
		n := im.newNode(np, i, m.opsetOf(np))
		if f := convFold[np]; f != nil {
			n.in = append(n.in[:1], &value{c: f.weight, init: true}, &value{c: f.bias, init: true})
		}
		if err := im.runNode(n); err != nil {
			return nil, nil, err
		}
	}
	var outs []ir.RExpr
	for _, o := range m.Outputs {
		e, err := im.expr(im.vals[o.GetName()])
		if err != nil {
			return nil, nil, fmt.Errorf("output %q: %w", o.GetName(), err)
		}
		outs = append(outs, e)
	}
	var ret ir.RExpr = outs[0]
	if len(outs) > 1 {
		ret = &ir.RTuple{Fields: outs}
	}
	gv := ir.NewRVar(im.name("gv"), ir.StructInfoOf(ret))
	block := &ir.BindingBlock{Dataflow: true, Bindings: append(im.bindings, &ir.VarBinding{Var: gv, Value: ret})}
	body := &ir.SeqExpr{Blocks: []*ir.BindingBlock{block}, Body: gv}
	f := ir.NewFunction(append(inputs, im.params...), body, map[string]any{
		ir.AttrGlobalSymbol: opts.Func,
		"num_input":         int64(len(inputs)),
	})
	mod := ir.NewIRModule().With(opts.Func, f)
	if err := ir.VerifyModule(mod); err != nil {
		return nil, nil, fmt.Errorf("import: %w", err)
	}
	return mod, &Params{list: im.weights}, nil
}

// newNode gathers a node's attributes and its input values.
func (im *importer) newNode(np *onnxpb.NodeProto, i int, opset int64) *node {
	n := &node{p: np, index: i, opset: opset, attrs: map[string]*onnxpb.AttributeProto{}}
	for _, a := range np.GetAttribute() {
		n.attrs[a.GetName()] = a
	}
	for _, in := range np.GetInput() {
		if in == "" {
			n.in = append(n.in, nil)
			continue
		}
		n.in = append(n.in, im.vals[in])
	}
	return n
}

// runNode converts a node and binds its outputs.
func (im *importer) runNode(n *node) error {
	np := n.p
	conv, ok := converterOf(np)
	if !ok || !conv.imports(np.GetOpType(), n.opset) {
		return fmt.Errorf("%w: %s", ErrUnsupported, n)
	}
	im.source = ir.Source{Name: np.GetName(), Op: np.GetOpType()}
	if im.source.Name == "" {
		im.source.Name = fmt.Sprintf("#%d", n.index)
	}
	outs, err := conv.fn(im, n)
	im.source = ir.Source{}
	if err != nil {
		return fmt.Errorf("%s: %w", n, err)
	}
	for j, name := range np.GetOutput() {
		if name == "" {
			continue
		}
		if j >= len(outs) || outs[j] == nil {
			return fmt.Errorf("%s: output %d (%q) is not supported", n, j, name)
		}
		im.vals[name] = outs[j]
	}
	return nil
}

// Check reports the first node whose operator (or opset) kiln does not
// import, naming the node, its op type and the opset.
func Check(m *Model) error {
	var bad []string
	for i, n := range m.Nodes {
		d := n.GetDomain()
		if d != "" && d != "ai.onnx" && d != trainingDomain {
			bad = append(bad, fmt.Sprintf("%s of domain %q", NodeName(n, i), d))
			continue
		}
		c, ok := converterOf(n)
		if !ok || !c.imports(n.GetOpType(), m.opsetOf(n)) {
			bad = append(bad, fmt.Sprintf("%s, opset %d", NodeName(n, i), m.opsetOf(n)))
		}
	}
	if len(bad) > 0 {
		more := ""
		if len(bad) > 3 {
			more = fmt.Sprintf(" and %d more", len(bad)-3)
			bad = bad[:3]
		}
		return fmt.Errorf("%w: %s%s", ErrUnsupported, strings.Join(bad, "; "), more)
	}
	return nil
}

// trainingDomain holds the optimizers of ONNX's training preview.
const trainingDomain = "ai.onnx.preview.training"

// converterOf finds the converter of a node's op type in its domain.
func converterOf(np *onnxpb.NodeProto) (converter, bool) {
	table := converters
	if np.GetDomain() == trainingDomain {
		table = trainingConverters
	}
	c, ok := table[np.GetOpType()]
	return c, ok
}

// opsetOf is the version of the operator set a node's domain imports.
func (m *Model) opsetOf(np *onnxpb.NodeProto) int64 {
	if np.GetDomain() == trainingDomain {
		return m.TrainingOpset
	}
	return m.Opset
}

// SupportedOps lists the op types Import converts.
func SupportedOps() []string {
	var out []string
	for k := range converters {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// input makes the graph variable of a model input, resolving symbolic
// dimensions from Options.InputShapes.
func (im *importer) input(in *onnxpb.ValueInfoProto) (*ir.RVar, error) {
	name := in.GetName()
	tt := in.GetType().GetTensorType()
	if tt == nil {
		return nil, fmt.Errorf("%w: input %q is not a tensor", ErrUnsupported, name)
	}
	dt, err := dtypeOf(tt.GetElemType())
	if err != nil {
		return nil, fmt.Errorf("input %q: %w", name, err)
	}
	given, hasGiven := im.opts.InputShapes[name]
	var shape []int64
	if tt.GetShape() == nil {
		if !hasGiven {
			return nil, fmt.Errorf("input %q has no shape in the model: give it with --input-shape %s=D1xD2…", name, name)
		}
		shape = given
	} else {
		dims := tt.GetShape().GetDim()
		if hasGiven && len(given) != len(dims) {
			return nil, fmt.Errorf("--input-shape %s: %d dims given, the model's input has %d", name, len(given), len(dims))
		}
		for i, d := range dims {
			switch {
			case hasGiven:
				if _, ok := d.GetValue().(*onnxpb.TensorShapeProto_Dimension_DimValue); ok && d.GetDimValue() != given[i] {
					return nil, fmt.Errorf("--input-shape %s: dim %d is %d in the model, %d given", name, i, d.GetDimValue(), given[i])
				}
				shape = append(shape, given[i])
			case d.GetDimParam() != "" || d.GetValue() == nil:
				sym := d.GetDimParam()
				if sym == "" {
					sym = "?"
				}
				return nil, fmt.Errorf("input %q: dim %d is symbolic (%q): give the shape with --input-shape %s=D1xD2…", name, i, sym, name)
			default:
				shape = append(shape, d.GetDimValue())
			}
		}
	}
	if _, err := checkDims(shape); err != nil {
		return nil, fmt.Errorf("input %q: %w", name, err)
	}
	vn := VarName(name)
	if im.used[vn] {
		return nil, fmt.Errorf("input %q: its variable name %q is taken", name, vn)
	}
	im.used[vn] = true
	return ir.NewRVar(vn, ir.TensorOfShape(dt, shape...)), nil
}

// name returns base, or base1, base2… when base is taken.
func (im *importer) name(base string) string {
	for {
		n := im.next[base]
		im.next[base] = n + 1
		cand := base
		if n > 0 {
			cand += strconv.Itoa(n)
		}
		if !im.used[cand] {
			im.used[cand] = true
			return cand
		}
	}
}

// expr is the graph expression of v: its variable, a weight parameter
// for a large initializer, or a constant.
func (im *importer) expr(v *value) (ir.RExpr, error) {
	if v == nil {
		return nil, fmt.Errorf("missing value")
	}
	if v.v != nil {
		return v.v, nil
	}
	t := v.c
	if v.init && t.NumElements() > im.opts.ConstLimit {
		for _, w := range im.weightOf[t.Name] {
			if w.t.DType == t.DType && slices.Equal(w.t.Shape, t.Shape) && bytes.Equal(w.t.Data, t.Data) {
				return w.p, nil
			}
		}
		vn := VarName(t.Name)
		if im.used[vn] {
			vn = im.name(vn + "_w")
		}
		im.used[vn] = true
		p := ir.NewRVar(vn, ir.TensorOfShape(t.DType, t.Shape...))
		im.weightOf[t.Name] = append(im.weightOf[t.Name], weightParam{t, p})
		im.params = append(im.params, p)
		w := *t
		w.Name = vn
		im.weights = append(im.weights, &w)
		return p, nil
	}
	return ir.ConstantFromBytes(t.DType, ndarray.Shape(t.Shape), t.Data)
}

// emit binds a call of opName to a fresh variable.
func (im *importer) emit(opName string, attrs map[string]any, args ...any) (*value, error) {
	exprs := make([]ir.RExpr, len(args))
	for i, a := range args {
		switch a := a.(type) {
		case *value:
			e, err := im.expr(a)
			if err != nil {
				return nil, err
			}
			exprs[i] = e
		case ir.RExpr:
			exprs[i] = a
		default:
			return nil, fmt.Errorf("emit %s: argument %d is a %T", opName, i, a)
		}
	}
	call, err := op.Call(opName, exprs, attrs)
	if err != nil {
		return nil, err
	}
	if im.source != (ir.Source{}) {
		call.Sources = []ir.Source{im.source}
	}
	base := strings.TrimPrefix(opName, "relax.")
	if i := strings.LastIndexByte(base, '.'); i >= 0 {
		base = base[i+1:]
	}
	v := ir.NewDataflowVar(im.name(base), call.Info)
	im.bindings = append(im.bindings, &ir.VarBinding{Var: v, Value: call})
	if _, ok := call.Info.(*ir.TensorStructInfo); ok {
		if _, known := call.Info.(*ir.TensorStructInfo).KnownShape(); !known {
			return nil, fmt.Errorf("%s: the result's shape is not known at import time", opName)
		}
	}
	return &value{v: v}, nil
}

// constant wraps a host tensor as a known value.
func constant(t *Tensor) *value { return &value{c: t} }

// scalar is a 0-d constant of dtype dt.
func scalar(dt ir.DType, v float64) *value { return constant(scalarTensor(dt, v)) }

// normAxis maps a possibly negative axis into [0, rank).
func normAxis(axis int64, rank int) (int, error) {
	if axis < -int64(rank) || axis >= int64(rank) {
		return 0, fmt.Errorf("axis %d is out of range for rank %d", axis, rank)
	}
	if axis < 0 {
		axis += int64(rank)
	}
	return int(axis), nil
}

func normAxes(axes []int64, rank int) ([]int, error) {
	out := make([]int, len(axes))
	seen := map[int]bool{}
	for i, a := range axes {
		n, err := normAxis(a, rank)
		if err != nil {
			return nil, err
		}
		if seen[n] {
			return nil, fmt.Errorf("axis %d repeated in %v", a, axes)
		}
		seen[n] = true
		out[i] = n
	}
	return out, nil
}

func anyInts[T int | int64](xs []T) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = int64(x)
	}
	return out
}

func finite(v float64) bool { return !math.IsInf(v, 0) && !math.IsNaN(v) }

// ParseInputShapes reads --input-shape values, NAME=1x3x224x224 each
// (NAME= alone for a scalar input).
func ParseInputShapes(specs []string) (map[string][]int64, error) {
	out := map[string][]int64{}
	for _, s := range specs {
		name, dims, ok := strings.Cut(s, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("--input-shape %q: want NAME=D1xD2… (for example x=1x3x224x224)", s)
		}
		var shape []int64
		if dims != "" {
			for _, d := range strings.Split(dims, "x") {
				v, err := strconv.ParseInt(d, 10, 64)
				if err != nil || v < 0 {
					return nil, fmt.Errorf("--input-shape %q: dim %q is not a size", s, d)
				}
				shape = append(shape, v)
			}
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("--input-shape: %q given twice", name)
		}
		out[name] = shape
	}
	return out, nil
}

// FormatInputShapes is the inverse of ParseInputShapes, sorted by name.
func FormatInputShapes(shapes map[string][]int64) []string {
	var out []string
	for name, s := range shapes {
		ds := make([]string, len(s))
		for i, d := range s {
			ds[i] = strconv.FormatInt(d, 10)
		}
		out = append(out, name+"="+strings.Join(ds, "x"))
	}
	sort.Strings(out)
	return out
}

// IsModelPath reports whether path names an ONNX model (by its .onnx
// extension), which the CLI imports instead of parsing as TVMScript.
func IsModelPath(path string) bool { return strings.EqualFold(filepath.Ext(path), ".onnx") }

// ImportFile reads the model at path and imports it; the weights come
// back as a safetensors file (nil when the model has none).
func ImportFile(path string, opts Options) (*ir.IRModule, []byte, error) {
	m, err := ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	return importModel(m, path, opts)
}

// ImportBytes is ImportFile for a model held in memory (external data is
// refused).
func ImportBytes(name string, b []byte, opts Options) (*ir.IRModule, []byte, error) {
	m, err := Read(b, "")
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	return importModel(m, name, opts)
}

func importModel(m *Model, name string, opts Options) (*ir.IRModule, []byte, error) {
	mod, ps, err := Import(m, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("import %s: %w", name, err)
	}
	if ps.Len() == 0 {
		return mod, nil, nil
	}
	st, err := ps.Safetensors()
	if err != nil {
		return nil, nil, fmt.Errorf("import %s: weights: %w", name, err)
	}
	return mod, st, nil
}
