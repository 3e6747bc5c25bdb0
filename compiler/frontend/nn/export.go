package nn

import (
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Input describes one input of the exported function (TVM's
// nn.spec.Tensor): its parameter name, shape and dtype.
type Input struct {
	Name  string
	Shape []int64
	DType ir.DType
}

// Spec says how to export a model.
type Spec struct {
	// Func names the graph function; "" means "main". TVM's export_tvm
	// names it after the traced method ("forward").
	Func string
	// Inputs are the function's first parameters.
	Inputs []Input
	// Seed seeds the parameters' initialization.
	Seed uint64
	// Forward, when set, traces the model on all the inputs instead of
	// calling the model's Forward on the single input (for models of
	// several inputs).
	Forward func(b *Builder, xs []*Tensor) (*Tensor, error)
}

// Export traces m into an IRModule holding one graph function, Spec.Func,
// whose parameters are the inputs followed by every parameter of m in
// module order (fc1.weight becomes the variable fc1_weight), with
// R.func_attr({"num_input": len(Inputs)}) and the body in one dataflow
// block, as TVM's export_tvm writes it. It returns the weights too, under
// their dotted names, in the same order.
func Export(m Module, spec Spec) (*ir.IRModule, *Params, error) {
	name := spec.Func
	if name == "" {
		name = "main"
	}
	fail := func(err error) (*ir.IRModule, *Params, error) {
		return nil, nil, fmt.Errorf("export %q: %w", name, err)
	}
	if len(spec.Inputs) == 0 {
		return fail(fmt.Errorf("no inputs"))
	}
	if spec.Forward == nil && len(spec.Inputs) != 1 {
		return fail(fmt.Errorf("%d inputs: a model of several inputs needs Spec.Forward", len(spec.Inputs)))
	}
	named, err := namedParams(m)
	if err != nil {
		return fail(err)
	}
	b := newBuilder()
	var params []*ir.RVar
	var xs []*Tensor
	for _, in := range spec.Inputs {
		if in.Name == "" {
			return fail(fmt.Errorf("an input has no name"))
		}
		if b.used[in.Name] {
			return fail(fmt.Errorf("input %q defined twice", in.Name))
		}
		b.used[in.Name] = true
		v := ir.NewRVar(in.Name, ir.TensorOfShape(in.DType, in.Shape...))
		params = append(params, v)
		xs = append(xs, &Tensor{v: v})
	}
	ps := &Params{}
	for _, np := range named {
		vname := VarName(np.Name)
		if b.used[vname] {
			return fail(fmt.Errorf("parameter %q: the name %q is taken", np.Name, vname))
		}
		b.used[vname] = true
		p := np.Param
		v := ir.NewRVar(vname, ir.TensorOfShape(p.dtype, p.shape...))
		params = append(params, v)
		b.params[p] = &Tensor{v: v}
		data, err := p.values(np.Name, spec.Seed)
		if err != nil {
			return fail(err)
		}
		ps.list = append(ps.list, Param{Name: np.Name, Shape: p.Shape(), DType: p.dtype, Data: data})
	}
	var out *Tensor
	if spec.Forward != nil {
		out, err = spec.Forward(b, xs)
	} else {
		out, err = m.Forward(b, xs[0])
	}
	if err != nil {
		return fail(err)
	}
	if out == nil {
		return fail(fmt.Errorf("forward returned no tensor"))
	}
	gv := ir.NewRVar(b.name("gv"), out.v.Info)
	block := &ir.BindingBlock{Dataflow: true, Bindings: append(b.bindings, &ir.VarBinding{Var: gv, Value: out.v})}
	body := &ir.SeqExpr{Blocks: []*ir.BindingBlock{block}, Body: gv}
	f := ir.NewFunction(params, body, map[string]any{
		ir.AttrGlobalSymbol: name,
		"num_input":         int64(len(spec.Inputs)),
	})
	mod := ir.NewIRModule().With(name, f)
	if err := ir.VerifyModule(mod); err != nil {
		return fail(err)
	}
	return mod, ps, nil
}

// VarName is the name of the function parameter that carries the weight
// called param: dots become underscores (fc1.weight → fc1_weight), as
// TVM prints them. Params and safetensors files use the dotted names; a
// runtime binding weights to the function's parameters by name maps them
// with VarName.
func VarName(param string) string { return strings.ReplaceAll(param, ".", "_") }
