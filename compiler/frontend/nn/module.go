package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Module is a layer or a model, like TVM's nn.Module: it owns parameters
// and named submodules, and Forward emits its computation.
type Module interface {
	// Forward emits the module's computation of x on b and returns the
	// result. Parameters are reached with b.Param.
	Forward(b *Builder, x *Tensor) (*Tensor, error)
	// Params lists the module's own parameters, in order.
	Params() []NamedParam
	// Children lists the named submodules, in order.
	Children() []Child
}

// Child is a named submodule.
type Child struct {
	Name   string
	Module Module
}

// Named returns Child{name, m}.
func Named(name string, m Module) Child { return Child{Name: name, Module: m} }

// NamedParam is a parameter with its name inside its module ("weight").
type NamedParam struct {
	Name  string
	Param *Parameter
}

// Init draws a parameter's initial values from r.
type Init func(r *rand.Rand) float64

// Uniform draws from [lo, hi).
func Uniform(lo, hi float64) Init {
	return func(r *rand.Rand) float64 { return lo + (hi-lo)*r.Float64() }
}

// Normal draws from the normal distribution of mean and std.
func Normal(mean, std float64) Init {
	return func(r *rand.Rand) float64 { return mean + std*r.NormFloat64() }
}

// Const gives every element the value v.
func Const(v float64) Init {
	return func(*rand.Rand) float64 { return v }
}

// Parameter is a weight of a module: its shape, dtype and how it is
// initialized. A parameter is identified by its pointer; its name comes
// from its place in the module tree when the model is exported.
type Parameter struct {
	shape []int64
	dtype ir.DType
	init  Init
}

// NewParameter returns a parameter of shape and dtype initialized by
// init (nil means zeros).
func NewParameter(shape []int64, dtype ir.DType, init Init) *Parameter {
	if init == nil {
		init = Const(0)
	}
	return &Parameter{shape: append([]int64(nil), shape...), dtype: dtype, init: init}
}

// Shape is the parameter's shape.
func (p *Parameter) Shape() []int64 { return append([]int64(nil), p.shape...) }

// DType is the parameter's element type.
func (p *Parameter) DType() ir.DType { return p.dtype }

// namedParams walks m: its own parameters first, then its children's,
// each named by its dotted path ("fc1.weight"), as TVM's
// named_parameters lists them. A parameter reached twice is listed once.
func namedParams(m Module) ([]NamedParam, error) {
	var out []NamedParam
	seen := map[*Parameter]string{}
	var walk func(prefix string, m Module, depth int) error
	walk = func(prefix string, m Module, depth int) error {
		if m == nil {
			return fmt.Errorf("module %q is nil", prefix)
		}
		if depth > 256 {
			return fmt.Errorf("module %q: modules nested more than 256 deep (a cycle?)", prefix)
		}
		if e, ok := m.(interface{ configErr() error }); ok {
			if err := e.configErr(); err != nil {
				return fmt.Errorf("module %q: %w", prefix, err)
			}
		}
		for _, np := range m.Params() {
			if np.Param == nil {
				return fmt.Errorf("module %q: parameter %q is nil", prefix, np.Name)
			}
			name := join(prefix, np.Name)
			if _, dup := seen[np.Param]; dup {
				continue
			}
			seen[np.Param] = name
			out = append(out, NamedParam{Name: name, Param: np.Param})
		}
		for _, c := range m.Children() {
			if err := walk(join(prefix, c.Name), c.Module, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk("", m, 0); err != nil {
		return nil, err
	}
	return out, nil
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// sequential runs its children in order, each on the previous one's
// result.
type sequential struct {
	children []Child
}

// NewSequential returns a module that runs mods in order, each on the
// previous one's result (nn.Sequential), naming them "0", "1"… as TVM and
// PyTorch do.
func NewSequential(mods ...Module) Module {
	cs := make([]Child, len(mods))
	for i, m := range mods {
		cs[i] = Child{Name: strconv.Itoa(i), Module: m}
	}
	return &sequential{children: cs}
}

// NewNamedSequential is NewSequential with named children (fc1, relu1…),
// which name their parameters (fc1.weight).
func NewNamedSequential(children ...Child) Module {
	return &sequential{children: append([]Child(nil), children...)}
}

// Forward applies the children in order.
func (s *sequential) Forward(b *Builder, x *Tensor) (*Tensor, error) {
	for _, c := range s.children {
		y, err := c.Module.Forward(b, x)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.Name, err)
		}
		x = y
	}
	return x, nil
}

// Params returns nothing: a sequential module has no parameters of its own.
func (s *sequential) Params() []NamedParam { return nil }

// Children returns the modules in order.
func (s *sequential) Children() []Child { return append([]Child(nil), s.children...) }

// fill returns n values of p's init drawn from a generator seeded by
// seed and the parameter's name, so a weight's values depend on nothing
// else.
func fill(p *Parameter, name string, seed uint64) ([]float64, error) {
	n := int64(1)
	for _, d := range p.shape {
		if d < 0 {
			return nil, fmt.Errorf("parameter %q: negative dimension in shape %v", name, p.shape)
		}
		if d > 0 && n > math.MaxInt32/d {
			return nil, fmt.Errorf("parameter %q: shape %v is too large", name, p.shape)
		}
		n *= d
	}
	r := rand.New(rand.NewPCG(seed, fnv64(name)))
	out := make([]float64, n)
	for i := range out {
		out[i] = p.init(r)
	}
	return out, nil
}

func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
