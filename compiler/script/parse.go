package script

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Parse reads TVMScript text and returns the module it defines. A file
// holds either one `@I.ir_module class …:` whose body is decorated
// functions, or any number of bare decorated functions (`@T.prim_func def
// …`, `@R.function def …`), which form a module keyed by their names.
// Imports, comments and docstrings are ignored; the names T, I and R are
// assumed to be tvm.script's tir, ir and relax.
//
// @T.prim_func functions become *ir.PrimFunc and @R.function functions
// (graph level) *ir.Function; a function not marked private=True gets the
// "global_symbol" attribute, as in TVM. Graph-level operator calls are
// checked against compiler/relax/op (arguments, attributes, shape
// inference) as they are read, and every function is verified (ir.Verify,
// ir.VerifyFunction) in the context of the whole module.
//
// Errors are *Error values naming the file, line and column.
func Parse(filename, src string) (*ir.IRModule, error) {
	m, err := parse(filename, src)
	if err != nil {
		return nil, err
	}
	return m, nil
}

type fileParser struct {
	file, src string
	lines     []string
}

func parse(file, src string) (*ir.IRModule, error) {
	stmts, err := parseSyntax(file, src)
	if err != nil {
		return nil, err
	}
	fp := &fileParser{file: file, src: src, lines: strings.Split(src, "\n")}
	var funcs []*pyFuncDef
	sawClass, sawFunc := false, false
	var class *pyClassDef
	for _, s := range stmts {
		switch s := s.(type) {
		case *pyImport, *pyPass:
		case *pyExprStmt:
			if _, ok := s.X.(*pyStr); !ok {
				return nil, fp.errorf(s.P, "unexpected statement at the top level (want @I.ir_module class or @T.prim_func def)")
			}
		case *pyClassDef:
			if sawClass {
				return nil, fp.errorf(s.P, "a file holds one @I.ir_module class")
			}
			if sawFunc {
				return nil, fp.errorf(s.P, "a file holds either an @I.ir_module class or bare functions, not both")
			}
			sawClass = true
			class = s
		case *pyFuncDef:
			if sawClass {
				return nil, fp.errorf(s.P, "a file holds either an @I.ir_module class or bare functions, not both")
			}
			sawFunc = true
			funcs = append(funcs, s)
		default:
			return nil, fp.errorf(s.at(), "unexpected statement at the top level (want @I.ir_module class or @T.prim_func def)")
		}
	}
	if class != nil {
		return fp.module(class)
	}
	return fp.functions(ir.NewIRModule(), "", funcs)
}

func (fp *fileParser) errorf(p pos, format string, args ...any) *Error {
	return newError(fp.file, fp.src, p, fmt.Sprintf(format, args...))
}

func (fp *fileParser) module(c *pyClassDef) (*ir.IRModule, error) {
	if len(c.Decorators) != 1 || !isDecorator(c.Decorators[0], "I.ir_module", "tvm.script.ir_module", "ir_module") {
		return nil, fp.errorf(c.P, "class %q needs the decorator @I.ir_module", c.Name)
	}
	if len(c.Bases) != 0 {
		return nil, fp.errorf(c.Bases[0].at(), "an ir_module class has no base classes")
	}
	m := ir.NewIRModule()
	var funcs []*pyFuncDef
	for _, s := range c.Body {
		switch s := s.(type) {
		case *pyPass:
		case *pyExprStmt:
			if call, ok := s.X.(*pyCall); ok && dotted(call.Fn) == "I.module_attrs" {
				attrs, err := fp.moduleAttrs(call)
				if err != nil {
					return nil, err
				}
				for k, v := range attrs {
					m = m.WithAttr(k, v)
				}
				continue
			}
			if _, ok := s.X.(*pyStr); !ok {
				return nil, fp.errorf(s.P, "unexpected statement in an ir_module class (want decorated functions)")
			}
		case *pyFuncDef:
			funcs = append(funcs, s)
		default:
			return nil, fp.errorf(s.at(), "unexpected statement in an ir_module class (want decorated functions)")
		}
	}
	return fp.functions(m, c.Name, funcs)
}

func (fp *fileParser) moduleAttrs(c *pyCall) (attrs map[string]any, err error) {
	if len(c.Args) != 1 || len(c.Kwargs) != 0 {
		return nil, fp.errorf(c.P, "I.module_attrs takes one dict")
	}
	d, ok := c.Args[0].(*pyDict)
	if !ok {
		return nil, fp.errorf(c.Args[0].at(), "I.module_attrs takes one dict")
	}
	p := &tirParser{file: fp.file, src: fp.src, loops: map[*ir.Var]ir.Range{}}
	p.push()
	defer func() {
		if r := recover(); r != nil {
			b, ok := r.(bail)
			if !ok {
				panic(r)
			}
			attrs, err = nil, b.err
		}
	}()
	return p.attrDict(d), nil
}

// isDecorator reports whether d is one of names, called or not.
func isDecorator(d pyExpr, names ...string) bool {
	if c, ok := d.(*pyCall); ok {
		d = c.Fn
	}
	return slices.Contains(names, dotted(d))
}

// functions converts the functions of one module: the TensorIR ones
// first, then the graph-level ones (which call them), and adds them to m
// in source order. class is the ir_module class's name, "" for a file of
// bare functions.
func (fp *fileParser) functions(m *ir.IRModule, class string, fds []*pyFuncDef) (*ir.IRModule, error) {
	info := &moduleInfo{class: class, funcs: map[string]calleeInfo{}}
	kinds := make([]string, len(fds))
	for i, fd := range fds {
		if _, dup := info.funcs[fd.Name]; dup {
			return nil, fp.errorf(fd.P, "function %q defined twice", fd.Name)
		}
		if len(fd.Decorators) != 1 {
			return nil, fp.errorf(fd.P, "function %q needs one decorator: @T.prim_func or @R.function", fd.Name)
		}
		d := fd.Decorators[0]
		switch {
		case isDecorator(d, "T.prim_func"):
			kinds[i] = "tir"
			info.funcs[fd.Name] = calleeInfo{}
		case isDecorator(d, "R.function"):
			kinds[i] = "relax"
			pure, _, err := fp.relaxFlags(d)
			if err != nil {
				return nil, err
			}
			info.funcs[fd.Name] = calleeInfo{relax: true, pure: pure, ret: relaxSignature(fp.file, fp.src, fd)}
		default:
			return nil, fp.errorf(d.at(), "unsupported decorator %q (want @T.prim_func or @R.function)", dotted(d))
		}
	}
	done := make([]ir.BaseFunc, len(fds))
	for i, fd := range fds {
		if kinds[i] != "tir" {
			continue
		}
		private, err := fp.decoratorFlag(fd.Decorators[0], "private", "check_well_formed")
		if err != nil {
			return nil, err
		}
		f, perr := parsePrimFunc(fp.file, fp.src, fd, private)
		if perr != nil {
			return nil, perr
		}
		done[i] = f
		info.funcs[fd.Name] = calleeInfo{prim: f}
	}
	for i, fd := range fds {
		if kinds[i] != "relax" {
			continue
		}
		pure, private, err := fp.relaxFlags(fd.Decorators[0])
		if err != nil {
			return nil, err
		}
		f, perr := parseRelaxFunc(fp.file, fp.src, fd, pure, private, info)
		if perr != nil {
			return nil, perr
		}
		done[i] = f
	}
	for i, fd := range fds {
		m = m.With(fd.Name, done[i])
	}
	for i, fd := range fds {
		if f, ok := done[i].(*ir.Function); ok {
			if err := ir.VerifyFunction(fd.Name, f, m); err != nil {
				msg := strings.ReplaceAll(err.Error(), fmt.Sprintf("function %q: ", fd.Name), "")
				return nil, fp.errorf(fd.P, "function %q is ill-formed: %s", fd.Name, msg)
			}
		}
	}
	return m, nil
}

// decoratorFlag reads private=True from @T.prim_func(private=True); other
// known flags are accepted and ignored.
func (fp *fileParser) decoratorFlag(d pyExpr, flag string, ignored ...string) (bool, error) {
	c, ok := d.(*pyCall)
	if !ok {
		return false, nil
	}
	if len(c.Args) != 0 {
		return false, fp.errorf(c.Args[0].at(), "%s takes only keyword arguments", dotted(c.Fn))
	}
	val := false
	for _, kw := range c.Kwargs {
		b, ok := kw.Value.(*pyConst)
		if !ok || (b.Value != "True" && b.Value != "False") {
			return false, fp.errorf(kw.P, "%s=%s: want True or False", kw.Name, "…")
		}
		switch {
		case kw.Name == flag:
			val = b.Value == "True"
		case slices.Contains(ignored, kw.Name):
		default:
			return false, fp.errorf(kw.P, "unknown argument %q of %s", kw.Name, dotted(c.Fn))
		}
	}
	return val, nil
}
