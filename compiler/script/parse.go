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
// …`), which form a module keyed by their names. Imports, comments and
// docstrings are ignored; the names T, I and R are assumed to be tvm.script's
// tir, ir and relax.
//
// @T.prim_func functions become *ir.PrimFunc (a function not marked
// private=True gets the "global_symbol" attribute, as in TVM) and are
// verified with ir.Verify. @R.function functions (graph level) are not
// converted yet: each becomes an *Unparsed holding its source text, in
// module order; Unsupported lists them.
//
// Errors are *Error values naming the file, line and column.
func Parse(filename, src string) (*ir.IRModule, error) {
	m, err := parse(filename, src)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Unparsed is a function of a kind this package does not convert yet (a
// graph-level @R.function). It keeps the function's source text, from its
// first decorator to the end of its body with the common indentation
// removed, so that printing gives it back and the module keeps its order.
type Unparsed struct {
	// Kind is "relax".
	Kind string
	// Name is the function's name.
	Name string
	// Source is the function's text.
	Source string
	// Line is where the function started in the parsed file.
	Line int
}

// FuncAttrs returns nil: the attributes are inside the source text.
func (u *Unparsed) FuncAttrs() map[string]any { return nil }

// WriteStructure makes Unparsed functions equal when their text is.
func (u *Unparsed) WriteStructure(w *ir.StructuralWriter) {
	w.Tag(u.Kind)
	w.Tag(u.Source)
}

// Note says why the function is not converted.
func (u *Unparsed) Note() string {
	return fmt.Sprintf("unsupported: Relax function %q (graph level)", u.Name)
}

// Unsupported returns one note per function of m that Parse kept as text:
// `unsupported: Relax function "main" (graph level)`.
func Unsupported(m *ir.IRModule) []string {
	var notes []string
	for _, f := range m.Funcs() {
		if u, ok := f.(*Unparsed); ok {
			notes = append(notes, u.Note())
		}
	}
	return notes
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
	m := ir.NewIRModule()
	sawClass, sawFunc := false, false
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
			var err error
			if m, err = fp.module(s); err != nil {
				return nil, err
			}
		case *pyFuncDef:
			if sawClass {
				return nil, fp.errorf(s.P, "a file holds either an @I.ir_module class or bare functions, not both")
			}
			sawFunc = true
			var err error
			if m, err = fp.function(m, s); err != nil {
				return nil, err
			}
		default:
			return nil, fp.errorf(s.at(), "unexpected statement at the top level (want @I.ir_module class or @T.prim_func def)")
		}
	}
	return m, nil
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
			var err error
			if m, err = fp.function(m, s); err != nil {
				return nil, err
			}
		default:
			return nil, fp.errorf(s.at(), "unexpected statement in an ir_module class (want decorated functions)")
		}
	}
	return m, nil
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

func (fp *fileParser) function(m *ir.IRModule, fd *pyFuncDef) (*ir.IRModule, error) {
	if _, dup := m.Lookup(fd.Name); dup {
		return nil, fp.errorf(fd.P, "function %q defined twice", fd.Name)
	}
	if len(fd.Decorators) != 1 {
		return nil, fp.errorf(fd.P, "function %q needs one decorator: @T.prim_func or @R.function", fd.Name)
	}
	d := fd.Decorators[0]
	switch {
	case isDecorator(d, "T.prim_func"):
		private, err := fp.decoratorFlag(d, "private", "check_well_formed")
		if err != nil {
			return nil, err
		}
		f, perr := parsePrimFunc(fp.file, fp.src, fd, private)
		if perr != nil {
			return nil, perr
		}
		return m.With(fd.Name, f), nil
	case isDecorator(d, "R.function"):
		return m.With(fd.Name, &Unparsed{Kind: "relax", Name: fd.Name, Source: fp.sourceOf(fd), Line: fd.FirstLine}), nil
	}
	return nil, fp.errorf(d.at(), "unsupported decorator %q (want @T.prim_func or @R.function)", dotted(d))
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

// sourceOf returns the lines of fd with their common indentation removed.
func (fp *fileParser) sourceOf(fd *pyFuncDef) string {
	lo, hi := fd.FirstLine-1, fd.LastLine
	if lo < 0 {
		lo = 0
	}
	if hi > len(fp.lines) {
		hi = len(fp.lines)
	}
	lines := slices.Clone(fp.lines[lo:hi])
	for i, l := range lines {
		lines[i] = strings.TrimRight(expandTabs(l), " \r")
	}
	indent := -1
	if len(lines) > 0 {
		indent = len(lines[0]) - len(strings.TrimLeft(lines[0], " "))
	}
	for i, l := range lines {
		n := len(l) - len(strings.TrimLeft(l, " "))
		lines[i] = l[min(n, max(indent, 0)):]
	}
	return strings.Join(lines, "\n")
}

// expandTabs replaces tabs with spaces to the next multiple of 8, as
// Python's tokenizer counts them.
func expandTabs(l string) string {
	if !strings.Contains(l, "\t") {
		return l
	}
	var b strings.Builder
	col := 0
	for _, r := range l {
		if r == '\t' {
			n := 8 - col%8
			b.WriteString(strings.Repeat(" ", n))
			col += n
			continue
		}
		b.WriteRune(r)
		col++
	}
	return b.String()
}
