// Package op is kiln's graph-level operator library: the registry of
// Relax-style operators ("relax.add", "relax.nn.conv2d",
// "relax.vm.alloc_storage"…), each with its argument and attribute schema,
// its purity, the inference of a call's struct info (shape and dtype) and
// a hook for legalizing it into TensorIR.
//
// Importing the package registers every operator with compiler/ir
// (ir.RegisterOp), so ir.VerifyFunction and the text parser know them.
// Call builds a checked call; Lookup and ByScriptName find a definition by
// its full name or its TVMScript name (R.nn.relu).
//
// The package owns operator definitions only: it imports compiler/ir and
// ndarray, never the text format, passes, codegen or runtime packages.
// Legalization bodies live in the operator library (compiler/topi) and
// are attached with SetLegalize.
package op

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// ArgKind is what an operator's positional argument must be.
type ArgKind uint8

// Argument kinds. In TVMScript a Python literal converts to the matching
// expression: a list or tuple of integers to a ShapeExpr (ArgShape), an
// integer to a PrimValue (ArgPrim), a string to a DataTypeImm (ArgDType)
// or an RString (ArgString).
const (
	ArgTensor  ArgKind = iota // an expression of tensor struct info
	ArgTensors                // a tuple of tensors
	ArgShape                  // a shape value
	ArgPrim                   // a scalar value
	ArgDType                  // a dtype
	ArgString                 // a string
	ArgAny                    // any value (storage, objects)
)

// Arg is one positional argument of an operator.
type Arg struct {
	Name string
	Kind ArgKind
	// Optional arguments may be left out at the end of the list.
	Optional bool
}

// AttrKind is the type of an operator attribute's value.
type AttrKind uint8

// Attribute kinds and the Go values that hold them in RCall.Attrs.
const (
	AttrInt       AttrKind = iota // int64
	AttrOptInt                    // int64 or nil (None)
	AttrInts                      // []any of int64; a single int is accepted
	AttrOptInts                   // []any of int64, or nil (None)
	AttrIntOrInts                 // int64 or []any of int64
	AttrFloat                     // float64
	AttrBool                      // bool
	AttrString                    // string
	AttrOptString                 // string or nil
	AttrDType                     // string naming a dtype; "void" means unset
)

// Attr is one attribute of an operator, with the value it takes when a
// call leaves it out.
type Attr struct {
	Name    string
	Kind    AttrKind
	Default any
}

// Legalizer lowers a call of an operator to TensorIR: it returns the
// PrimFunc computing the call's result in destination-passing style
// (inputs, then outputs), which LegalizeOps adds to the module and calls
// with call_tir.
type Legalizer func(call *ir.RCall) (*ir.PrimFunc, error)

// Def is one operator.
type Def struct {
	// Name is the full name, "relax.nn.relu".
	Name  string
	Args  []Arg
	Attrs []Attr
	// Impure operators have side effects (they allocate storage or kill
	// objects): they may not appear in dataflow blocks or pure functions.
	Impure bool
	// Infer returns the struct info of a call whose arguments and
	// attributes match the schema.
	Infer func(c *ir.RCall) (ir.StructInfo, error)

	mu       sync.RWMutex
	legalize Legalizer
}

// OpName returns Name.
func (d *Def) OpName() string { return d.Name }

// IsPure reports an operator without side effects.
func (d *Def) IsPure() bool { return !d.Impure }

// ShortName is the name without "relax.": "nn.relu", used in messages.
func (d *Def) ShortName() string { return strings.TrimPrefix(d.Name, "relax.") }

// ScriptName is the TVMScript spelling: "R.nn.relu".
func (d *Def) ScriptName() string { return "R." + d.ShortName() }

// Legalize returns the operator's legalizer, or nil.
func (d *Def) Legalize() Legalizer {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.legalize
}

// InferStructInfo checks the call's arity and returns its struct info.
func (d *Def) InferStructInfo(c *ir.RCall) (ir.StructInfo, error) {
	if err := d.checkArity(len(c.Args)); err != nil {
		return nil, err
	}
	for i, a := range c.Args {
		if err := d.checkArg(i, a); err != nil {
			return nil, err
		}
	}
	return d.Infer(c)
}

func (d *Def) checkArity(n int) error {
	lo := 0
	for _, a := range d.Args {
		if !a.Optional {
			lo++
		}
	}
	if n < lo || n > len(d.Args) {
		want := fmt.Sprint(lo)
		if lo != len(d.Args) {
			want = fmt.Sprintf("%d to %d", lo, len(d.Args))
		}
		return fmt.Errorf("%s takes %s arguments (%s), got %d", d.ShortName(), want, d.argNames(), n)
	}
	return nil
}

func (d *Def) argNames() string {
	names := make([]string, len(d.Args))
	for i, a := range d.Args {
		names[i] = a.Name
	}
	return strings.Join(names, ", ")
}

func (d *Def) checkArg(i int, a ir.RExpr) error {
	si := ir.StructInfoOf(a)
	if _, obj := si.(*ir.ObjectStructInfo); obj {
		return nil
	}
	bad := func(want string) error {
		return fmt.Errorf("%s: argument %q is %s, want %s", d.ShortName(), d.Args[i].Name, si, want)
	}
	switch d.Args[i].Kind {
	case ArgTensor:
		if _, ok := si.(*ir.TensorStructInfo); !ok {
			return bad("a tensor")
		}
	case ArgTensors:
		t, ok := si.(*ir.TupleStructInfo)
		if !ok {
			return bad("a tuple of tensors")
		}
		for _, f := range t.Fields {
			if _, ok := f.(*ir.TensorStructInfo); !ok {
				return bad("a tuple of tensors")
			}
		}
	case ArgShape:
		if _, ok := si.(*ir.ShapeStructInfo); !ok {
			return bad("a shape")
		}
	case ArgPrim:
		if _, ok := si.(*ir.PrimStructInfo); !ok {
			return bad("a scalar (R.prim_value)")
		}
	case ArgDType:
		if _, ok := a.(*ir.DataTypeImm); !ok {
			return fmt.Errorf("%s: argument %q must be a dtype (R.dtype)", d.ShortName(), d.Args[i].Name)
		}
	case ArgString:
		if _, ok := a.(*ir.RString); !ok {
			return fmt.Errorf("%s: argument %q must be a string (R.str)", d.ShortName(), d.Args[i].Name)
		}
	}
	return nil
}

var registry = struct {
	sync.RWMutex
	byName   map[string]*Def
	byScript map[string]*Def
}{byName: map[string]*Def{}, byScript: map[string]*Def{}}

// Register adds d to this package's registry and to compiler/ir's. A
// duplicate name is an error.
func Register(d *Def) error {
	if d.Infer == nil {
		return fmt.Errorf("register operator %q: no inference", d.Name)
	}
	if err := ir.RegisterOp(d); err != nil {
		return err
	}
	registry.Lock()
	defer registry.Unlock()
	registry.byName[d.Name] = d
	registry.byScript[d.ScriptName()] = d
	return nil
}

func mustRegister(d *Def) {
	if err := Register(d); err != nil {
		panic(err) // a duplicate among this package's own definitions
	}
}

// Lookup returns the operator with the full name ("relax.add").
func Lookup(name string) (*Def, bool) {
	registry.RLock()
	defer registry.RUnlock()
	d, ok := registry.byName[name]
	return d, ok
}

// ByScriptName returns the operator spelled name in TVMScript
// ("R.nn.relu").
func ByScriptName(name string) (*Def, bool) {
	registry.RLock()
	defer registry.RUnlock()
	d, ok := registry.byScript[name]
	return d, ok
}

// Names returns the full names of the registered operators, sorted.
func Names() []string {
	registry.RLock()
	defer registry.RUnlock()
	names := make([]string, 0, len(registry.byName))
	for n := range registry.byName {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// SetLegalize attaches a legalizer to the operator called name.
func SetLegalize(name string, f Legalizer) error {
	d, ok := Lookup(name)
	if !ok {
		return fmt.Errorf("set legalizer: unknown operator %q", name)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.legalize = f
	return nil
}

// Call returns a call of the operator name with args and attrs (missing
// attributes take their defaults; see NormalizeAttrs), its Info inferred.
func Call(name string, args []ir.RExpr, attrs map[string]any) (*ir.RCall, error) {
	d, ok := Lookup(name)
	if !ok {
		return nil, fmt.Errorf("unknown operator %q", name)
	}
	norm, err := d.NormalizeAttrs(attrs)
	if err != nil {
		return nil, err
	}
	c := &ir.RCall{Op: &ir.Op{Name: name}, Args: args, Attrs: norm}
	info, err := d.InferStructInfo(c)
	if err != nil {
		return nil, err
	}
	c.Info = info
	return c, nil
}

// MustCall is Call for operator calls built by Go code with known-good
// arguments (tests, builders); it panics on an error.
func MustCall(name string, args []ir.RExpr, attrs map[string]any) *ir.RCall {
	c, err := Call(name, args, attrs)
	if err != nil {
		panic(err)
	}
	return c
}

// NormalizeAttrs checks attrs against the schema and returns a complete
// map: every attribute present, values in canonical form (int64, []any of
// int64, float64, bool, string or nil). Unknown names and values of the
// wrong type are errors naming the operator and the attribute.
func (d *Def) NormalizeAttrs(attrs map[string]any) (map[string]any, error) {
	out := map[string]any{}
	for k := range attrs {
		if !slices.ContainsFunc(d.Attrs, func(a Attr) bool { return a.Name == k }) {
			return nil, fmt.Errorf("%s has no attribute %q", d.ShortName(), k)
		}
	}
	for _, a := range d.Attrs {
		v, ok := attrs[a.Name]
		if !ok {
			v = a.Default
		}
		nv, err := normalizeAttr(a.Kind, v)
		if err != nil {
			return nil, fmt.Errorf("%s: attribute %q: %w", d.ShortName(), a.Name, err)
		}
		out[a.Name] = nv
	}
	return out, nil
}

func toInt(v any) (int64, bool) {
	switch v := v.(type) {
	case int:
		return int64(v), true
	case int64:
		return v, true
	case int32:
		return int64(v), true
	}
	return 0, false
}

func toInts(v any) ([]any, bool) {
	switch v := v.(type) {
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			n, ok := toInt(x)
			if !ok {
				return nil, false
			}
			out[i] = n
		}
		return out, true
	case []int64:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = x
		}
		return out, true
	case []int:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = int64(x)
		}
		return out, true
	}
	if n, ok := toInt(v); ok {
		return []any{n}, true
	}
	return nil, false
}

func normalizeAttr(k AttrKind, v any) (any, error) {
	switch k {
	case AttrInt, AttrOptInt:
		if v == nil && k == AttrOptInt {
			return nil, nil
		}
		if n, ok := toInt(v); ok {
			return n, nil
		}
		return nil, fmt.Errorf("want an integer, got %s", describe(v))
	case AttrInts, AttrOptInts:
		if v == nil && k == AttrOptInts {
			return nil, nil
		}
		if l, ok := toInts(v); ok {
			return l, nil
		}
		return nil, fmt.Errorf("want a list of integers, got %s", describe(v))
	case AttrIntOrInts:
		if n, ok := toInt(v); ok {
			return n, nil
		}
		if l, ok := toInts(v); ok {
			return l, nil
		}
		return nil, fmt.Errorf("want an integer or a list of integers, got %s", describe(v))
	case AttrFloat:
		switch f := v.(type) {
		case float64:
			return f, nil
		case float32:
			return float64(f), nil
		}
		if n, ok := toInt(v); ok {
			return float64(n), nil
		}
		return nil, fmt.Errorf("want a number, got %s", describe(v))
	case AttrBool:
		if b, ok := v.(bool); ok {
			return b, nil
		}
		return nil, fmt.Errorf("want True or False, got %s", describe(v))
	case AttrString, AttrOptString:
		if v == nil && k == AttrOptString {
			return nil, nil
		}
		if s, ok := v.(string); ok {
			return s, nil
		}
		return nil, fmt.Errorf("want a string, got %s", describe(v))
	case AttrDType:
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("want a dtype string, got %s", describe(v))
		}
		if s == "" {
			s = "void"
		}
		if s != "void" {
			if _, err := parseDType(s); err != nil {
				return nil, err
			}
		}
		return s, nil
	}
	return nil, fmt.Errorf("unknown attribute kind %d", k)
}

func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "None"
	case string:
		return fmt.Sprintf("%q", v)
	case []any:
		return "a list"
	}
	return fmt.Sprint(v)
}
