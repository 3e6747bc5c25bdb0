package ir

import (
	"fmt"
	"iter"
	"maps"
	"slices"
)

// Attribute keys of functions that the compiler reads.
const (
	// AttrGlobalSymbol is the exported name of a function; a function
	// without it is private to its module.
	AttrGlobalSymbol = "global_symbol"
	// AttrNoAlias (bool) says the buffer parameters do not alias.
	AttrNoAlias = "tir.noalias"
	// AttrOpPattern (int64) is the operator pattern kind used by fusion.
	AttrOpPattern = "op_pattern"
)

// BaseFunc is a function that an IRModule holds. *PrimFunc is the tensor
// level kind; other packages (the graph level) add their own kinds.
type BaseFunc interface {
	// FuncAttrs returns the function's attributes. Callers must not modify
	// the map.
	FuncAttrs() map[string]any
}

// PrimFunc is a tensor-level function: scalar and handle parameters, the
// buffers bound to handle parameters, and a body.
//
// Attribute values are bool, int64, float64, string, []any or
// map[string]any.
type PrimFunc struct {
	// Params are the function's parameters: scalars, or handles whose
	// buffer is in BufferMap.
	Params []*Var
	// BufferMap binds handle parameters to the buffers they point to.
	BufferMap map[*Var]*Buffer
	Body      Stmt
	// RetType is Void unless the function returns a scalar.
	RetType DType
	Attrs   map[string]any
}

// NewPrimFunc returns a PrimFunc taking one handle parameter per buffer, in
// order, with attrs (which may be nil).
func NewPrimFunc(buffers []*Buffer, body Stmt, attrs map[string]any) *PrimFunc {
	f := &PrimFunc{BufferMap: map[*Var]*Buffer{}, Body: body, Attrs: attrs}
	for _, b := range buffers {
		p := NewVar(b.Name, Handle)
		f.Params = append(f.Params, p)
		f.BufferMap[p] = b
	}
	if f.Attrs == nil {
		f.Attrs = map[string]any{}
	}
	return f
}

// FuncAttrs returns the attributes.
func (f *PrimFunc) FuncAttrs() map[string]any { return f.Attrs }

// ParamBuffer returns the buffer bound to parameter i, or nil for a scalar.
func (f *PrimFunc) ParamBuffer(i int) *Buffer { return f.BufferMap[f.Params[i]] }

// WithBody returns a copy of f with body.
func (f *PrimFunc) WithBody(body Stmt) *PrimFunc {
	g := *f
	g.Body = body
	return &g
}

// WithAttr returns a copy of f with attribute key set to v.
func (f *PrimFunc) WithAttr(key string, v any) *PrimFunc {
	g := *f
	g.Attrs = maps.Clone(f.Attrs)
	if g.Attrs == nil {
		g.Attrs = map[string]any{}
	}
	g.Attrs[key] = v
	return &g
}

// GlobalVar names a function of an IRModule; graph-level code calls
// functions through it.
type GlobalVar struct {
	Name string
}

// String is the name.
func (g *GlobalVar) String() string { return g.Name }

// IRModule is an ordered set of named functions and module attributes. An
// IRModule is immutable: With and Without return new modules.
type IRModule struct {
	names []string
	funcs map[string]BaseFunc
	gvars map[string]*GlobalVar
	// Attrs are module attributes; callers must not modify the map.
	Attrs map[string]any
}

// NewIRModule returns an empty module.
func NewIRModule() *IRModule {
	return &IRModule{funcs: map[string]BaseFunc{}, gvars: map[string]*GlobalVar{}}
}

// With returns a copy of m where name is bound to f: a new name goes last,
// an existing name keeps its place and its GlobalVar.
func (m *IRModule) With(name string, f BaseFunc) *IRModule {
	if f == nil {
		panic(fmt.Sprintf("ir: nil function %q", name))
	}
	n := m.clone()
	if _, ok := n.funcs[name]; !ok {
		n.names = append(n.names, name)
		n.gvars[name] = &GlobalVar{Name: name}
	}
	n.funcs[name] = f
	return n
}

// Without returns a copy of m without the function name.
func (m *IRModule) Without(name string) *IRModule {
	n := m.clone()
	if _, ok := n.funcs[name]; ok {
		delete(n.funcs, name)
		delete(n.gvars, name)
		n.names = slices.DeleteFunc(n.names, func(s string) bool { return s == name })
	}
	return n
}

// WithAttr returns a copy of m with module attribute key set to v.
func (m *IRModule) WithAttr(key string, v any) *IRModule {
	n := m.clone()
	n.Attrs = maps.Clone(m.Attrs)
	if n.Attrs == nil {
		n.Attrs = map[string]any{}
	}
	n.Attrs[key] = v
	return n
}

func (m *IRModule) clone() *IRModule {
	n := &IRModule{
		names: slices.Clone(m.names),
		funcs: maps.Clone(m.funcs),
		gvars: maps.Clone(m.gvars),
		Attrs: m.Attrs,
	}
	if n.funcs == nil {
		n.funcs = map[string]BaseFunc{}
		n.gvars = map[string]*GlobalVar{}
	}
	return n
}

// Len is the number of functions.
func (m *IRModule) Len() int { return len(m.names) }

// Names returns the function names in module order.
func (m *IRModule) Names() []string { return slices.Clone(m.names) }

// Lookup returns the function called name.
func (m *IRModule) Lookup(name string) (BaseFunc, bool) {
	f, ok := m.funcs[name]
	return f, ok
}

// PrimFunc returns the PrimFunc called name, or nil when there is none or
// it is another kind of function.
func (m *IRModule) PrimFunc(name string) *PrimFunc {
	f, _ := m.funcs[name].(*PrimFunc)
	return f
}

// GlobalVar returns the GlobalVar of function name, or nil.
func (m *IRModule) GlobalVar(name string) *GlobalVar { return m.gvars[name] }

// Funcs iterates over the functions in module order.
func (m *IRModule) Funcs() iter.Seq2[string, BaseFunc] {
	return func(yield func(string, BaseFunc) bool) {
		for _, n := range m.names {
			if !yield(n, m.funcs[n]) {
				return
			}
		}
	}
}

// PrimFuncs iterates over the PrimFuncs in module order.
func (m *IRModule) PrimFuncs() iter.Seq2[string, *PrimFunc] {
	return func(yield func(string, *PrimFunc) bool) {
		for _, n := range m.names {
			if f, ok := m.funcs[n].(*PrimFunc); ok && !yield(n, f) {
				return
			}
		}
	}
}
