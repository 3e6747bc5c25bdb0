package script

// This file is the syntax tree of the Python subset that TVMScript uses.
// The parser builds it without knowing T., R. or I.; the converters
// (tir.go for @T.prim_func, and a graph-level one later for @R.function)
// give it meaning. Nodes record where they start.

// pyExpr is a Python expression.
type pyExpr interface{ at() pos }

type (
	pyName struct {
		P  pos
		ID string
	}
	pyInt struct {
		P     pos
		Value int64
		Text  string
	}
	pyFloat struct {
		P     pos
		Value float64
	}
	pyStr struct {
		P     pos
		Value string
	}
	pyConst struct { // True, False, None, ...
		P     pos
		Value string
	}
	pyAttr struct {
		P    pos
		X    pyExpr
		Name string
	}
	pyKeyword struct {
		P     pos
		Name  string // "" for **kwargs
		Value pyExpr
	}
	pyCall struct {
		P      pos
		Fn     pyExpr
		Args   []pyExpr
		Kwargs []pyKeyword
	}
	pySubscript struct {
		P     pos
		X     pyExpr
		Index []pyExpr // one per comma-separated part
		// Trailing reports a trailing comma (x[i,]).
		Trailing bool
	}
	pySlice struct {
		P                  pos
		Lower, Upper, Step pyExpr // nil when omitted
	}
	pyTuple struct {
		P     pos
		Elts  []pyExpr
		Paren bool
	}
	pyList struct {
		P    pos
		Elts []pyExpr
	}
	pyDict struct {
		P      pos
		Keys   []pyExpr
		Values []pyExpr
	}
	pyBinOp struct {
		P    pos
		Op   string
		L, R pyExpr
	}
	pyUnary struct {
		P  pos
		Op string // "-", "+", "~", "not"
		X  pyExpr
	}
	pyBoolOp struct {
		P    pos
		Op   string // "and", "or"
		L, R pyExpr
	}
	pyCompare struct {
		P   pos
		Ops []string
		Xs  []pyExpr // len(Ops)+1
	}
	pyIfExp struct {
		P                pos
		Cond, Then, Else pyExpr
	}
	pyStarred struct {
		P pos
		X pyExpr
	}
)

func (e *pyName) at() pos      { return e.P }
func (e *pyInt) at() pos       { return e.P }
func (e *pyFloat) at() pos     { return e.P }
func (e *pyStr) at() pos       { return e.P }
func (e *pyConst) at() pos     { return e.P }
func (e *pyAttr) at() pos      { return e.P }
func (e *pyCall) at() pos      { return e.P }
func (e *pySubscript) at() pos { return e.P }
func (e *pySlice) at() pos     { return e.P }
func (e *pyTuple) at() pos     { return e.P }
func (e *pyList) at() pos      { return e.P }
func (e *pyDict) at() pos      { return e.P }
func (e *pyBinOp) at() pos     { return e.P }
func (e *pyUnary) at() pos     { return e.P }
func (e *pyBoolOp) at() pos    { return e.P }
func (e *pyCompare) at() pos   { return e.P }
func (e *pyIfExp) at() pos     { return e.P }
func (e *pyStarred) at() pos   { return e.P }

// pyStmt is a Python statement.
type pyStmt interface{ at() pos }

type (
	pyParam struct {
		P          pos
		Name       string
		Annotation pyExpr // nil when absent
		Default    pyExpr
		Star       string // "", "*" or "**"
	}
	pyFuncDef struct {
		P          pos
		Decorators []pyExpr
		Name       string
		Params     []pyParam
		Returns    pyExpr
		Body       []pyStmt
		// FirstLine is the line of the first decorator (or of def); LastLine
		// the line of the body's last token.
		FirstLine, LastLine int
	}
	pyClassDef struct {
		P          pos
		Decorators []pyExpr
		Name       string
		Bases      []pyExpr
		Body       []pyStmt
	}
	pyFor struct {
		P      pos
		Target pyExpr
		Iter   pyExpr
		Body   []pyStmt
		Else   []pyStmt
	}
	pyWhile struct {
		P    pos
		Cond pyExpr
		Body []pyStmt
	}
	pyWith struct {
		P    pos
		Item pyExpr
		As   pyExpr // nil when absent
		Body []pyStmt
	}
	pyIf struct {
		P    pos
		Cond pyExpr
		Body []pyStmt
		Else []pyStmt
	}
	pyAssign struct {
		P       pos
		Targets []pyExpr // a = b = value has two targets
		Value   pyExpr
	}
	pyAnnAssign struct {
		P          pos
		Target     pyExpr
		Annotation pyExpr
		Value      pyExpr // nil when absent
	}
	pyAugAssign struct {
		P      pos
		Target pyExpr
		Op     string // "+", "-"…
		Value  pyExpr
	}
	pyExprStmt struct {
		P pos
		X pyExpr
	}
	pyReturn struct {
		P pos
		X pyExpr // nil when absent
	}
	pyAssert struct {
		P    pos
		Cond pyExpr
		Msg  pyExpr
	}
	pyPass   struct{ P pos }
	pyImport struct {
		P     pos
		From  string // "" for import x
		Names []string
	}
)

func (s *pyFuncDef) at() pos   { return s.P }
func (s *pyClassDef) at() pos  { return s.P }
func (s *pyFor) at() pos       { return s.P }
func (s *pyWhile) at() pos     { return s.P }
func (s *pyWith) at() pos      { return s.P }
func (s *pyIf) at() pos        { return s.P }
func (s *pyAssign) at() pos    { return s.P }
func (s *pyAnnAssign) at() pos { return s.P }
func (s *pyAugAssign) at() pos { return s.P }
func (s *pyExprStmt) at() pos  { return s.P }
func (s *pyReturn) at() pos    { return s.P }
func (s *pyAssert) at() pos    { return s.P }
func (s *pyPass) at() pos      { return s.P }
func (s *pyImport) at() pos    { return s.P }

// dotted returns "T.axis.remap" for the expression T.axis.remap, or "".
func dotted(e pyExpr) string {
	switch e := e.(type) {
	case *pyName:
		return e.ID
	case *pyAttr:
		if s := dotted(e.X); s != "" {
			return s + "." + e.Name
		}
	}
	return ""
}
