package script

import (
	"math"
	"strconv"
	"strings"
)

// maxNesting bounds the recursion of the expression parser.
const maxNesting = 200

// syntaxParser is a recursive-descent parser for the Python subset:
// decorated function and class definitions, for, while, with, if,
// assignments (plain, annotated, augmented, tuple targets), return,
// assert, pass, imports and expression statements; expressions with
// Python's precedence, calls with keyword arguments, subscripts with
// slices, tuples, lists and dicts.
type syntaxParser struct {
	file  string
	src   string
	toks  []token
	i     int
	depth int
}

// bail carries a syntax error up the recursion to parseSyntax.
type bail struct{ err *Error }

func parseSyntax(file, src string) (stmts []pyStmt, err *Error) {
	toks, lerr := tokenize(file, src)
	if lerr != nil {
		return nil, lerr
	}
	p := &syntaxParser{file: file, src: src, toks: toks}
	defer func() {
		if r := recover(); r != nil {
			b, ok := r.(bail)
			if !ok {
				panic(r)
			}
			stmts, err = nil, b.err
		}
	}()
	for p.tok().Kind != tEOF {
		if p.tok().Kind == tNewline {
			p.i++
			continue
		}
		stmts = append(stmts, p.stmt())
	}
	return stmts, nil
}

func (p *syntaxParser) tok() token { return p.toks[p.i] }

func (p *syntaxParser) peekTok(n int) token {
	if p.i+n < len(p.toks) {
		return p.toks[p.i+n]
	}
	return p.toks[len(p.toks)-1]
}

func (p *syntaxParser) prevEnd() pos {
	if p.i == 0 {
		return p.toks[0].Pos
	}
	return p.toks[p.i-1].End
}

func (p *syntaxParser) failAt(at pos, msg string) {
	panic(bail{newError(p.file, p.src, at, msg)})
}

func (p *syntaxParser) isOp(s string) bool {
	t := p.tok()
	return t.Kind == tOp && t.Text == s
}

func (p *syntaxParser) isKeyword(s string) bool {
	t := p.tok()
	return t.Kind == tName && t.Text == s
}

func (p *syntaxParser) acceptOp(s string) bool {
	if p.isOp(s) {
		p.i++
		return true
	}
	return false
}

func (p *syntaxParser) acceptKeyword(s string) bool {
	if p.isKeyword(s) {
		p.i++
		return true
	}
	return false
}

// expectOp consumes the operator s or fails with "expected 's' after/in
// what"; the error points just after the previous token when the line
// ends early, so the caret sits where the missing text belongs.
func (p *syntaxParser) expectOp(s, what string) token {
	if p.isOp(s) {
		t := p.tok()
		p.i++
		return t
	}
	at := p.tok().Pos
	if k := p.tok().Kind; k == tNewline || k == tEOF || k == tIndent || k == tDedent {
		at = p.prevEnd()
	}
	msg := "expected " + strconv.Quote(s)
	if what != "" {
		msg += " " + what
	}
	if k := p.tok().Kind; k != tNewline && k != tEOF {
		msg += ", found " + p.tok().describe()
	}
	p.failAt(at, msg)
	return token{}
}

func (p *syntaxParser) expectName(what string) token {
	t := p.tok()
	if t.Kind != tName || isReserved(t.Text) {
		p.failAt(t.Pos, "expected "+what+", found "+t.describe())
	}
	p.i++
	return t
}

var reserved = map[string]bool{
	"and": true, "as": true, "assert": true, "break": true, "class": true, "continue": true, "def": true,
	"del": true, "elif": true, "else": true, "except": true, "finally": true, "for": true, "from": true,
	"global": true, "if": true, "import": true, "in": true, "is": true, "lambda": true, "nonlocal": true,
	"not": true, "or": true, "pass": true, "raise": true, "return": true, "try": true, "while": true,
	"with": true, "yield": true, "True": true, "False": true, "None": true,
}

func isReserved(s string) bool { return reserved[s] }

func (p *syntaxParser) endOfStmt(what string) {
	t := p.tok()
	switch {
	case t.Kind == tNewline:
		p.i++
	case t.Kind == tEOF || t.Kind == tDedent:
	case t.Kind == tOp && t.Text == ";":
		p.i++
		if p.tok().Kind == tNewline {
			p.i++
		}
	default:
		p.failAt(t.Pos, "unexpected "+t.describe()+" after "+what)
	}
}

func (p *syntaxParser) stmt() pyStmt {
	t := p.tok()
	switch {
	case t.Kind == tIndent:
		p.failAt(t.Pos, "unexpected indent")
	case t.Kind == tOp && t.Text == "@":
		return p.decorated()
	case t.Kind == tName:
		switch t.Text {
		case "def":
			return p.funcDef(nil, t.Pos.Line)
		case "class":
			return p.classDef(nil)
		case "for":
			return p.forStmt()
		case "while":
			p.i++
			cond := p.expr()
			body := p.suite("while header")
			return &pyWhile{P: t.Pos, Cond: cond, Body: body}
		case "with":
			return p.withStmt()
		case "if":
			return p.ifStmt()
		case "elif", "else":
			p.failAt(t.Pos, "'"+t.Text+"' without a matching 'if'")
		}
	}
	s := p.simpleStmt()
	p.endOfStmt("statement")
	return s
}

func (p *syntaxParser) decorated() pyStmt {
	first := p.tok().Pos.Line
	var decos []pyExpr
	for p.acceptOp("@") {
		decos = append(decos, p.expr())
		if p.tok().Kind != tNewline {
			p.failAt(p.tok().Pos, "expected end of line after decorator, found "+p.tok().describe())
		}
		p.i++
	}
	switch {
	case p.isKeyword("def"):
		return p.funcDef(decos, first)
	case p.isKeyword("class"):
		return p.classDef(decos)
	}
	p.failAt(p.tok().Pos, "expected 'def' or 'class' after decorator, found "+p.tok().describe())
	return nil
}

func (p *syntaxParser) funcDef(decos []pyExpr, first int) pyStmt {
	start := p.tok().Pos
	p.i++ // def
	name := p.expectName("function name")
	p.expectOp("(", "after function name")
	var params []pyParam
	for !p.isOp(")") {
		pp := pyParam{P: p.tok().Pos}
		if p.acceptOp("**") {
			pp.Star = "**"
		} else if p.acceptOp("*") {
			pp.Star = "*"
		}
		if pp.Star != "*" || p.tok().Kind == tName {
			pp.Name = p.expectName("parameter name").Text
		}
		if p.acceptOp(":") {
			pp.Annotation = p.expr()
		}
		if p.acceptOp("=") {
			pp.Default = p.expr()
		}
		params = append(params, pp)
		if !p.acceptOp(",") {
			break
		}
	}
	p.expectOp(")", "after parameters")
	var ret pyExpr
	if p.acceptOp("->") {
		ret = p.expr()
	}
	body := p.suite("function header")
	return &pyFuncDef{P: start, Decorators: decos, Name: name.Text, Params: params, Returns: ret, Body: body,
		FirstLine: first, LastLine: p.lastContentLine()}
}

// lastContentLine is the line where the last token before p.i (other than
// layout tokens) ends.
func (p *syntaxParser) lastContentLine() int {
	for j := p.i - 1; j >= 0; j-- {
		switch p.toks[j].Kind {
		case tNewline, tIndent, tDedent, tEOF:
			continue
		}
		return p.toks[j].End.Line
	}
	return 1
}

func (p *syntaxParser) classDef(decos []pyExpr) pyStmt {
	start := p.tok().Pos
	p.i++ // class
	name := p.expectName("class name")
	var bases []pyExpr
	if p.acceptOp("(") {
		for !p.isOp(")") {
			bases = append(bases, p.expr())
			if !p.acceptOp(",") {
				break
			}
		}
		p.expectOp(")", "after base classes")
	}
	body := p.suite("class header")
	return &pyClassDef{P: start, Decorators: decos, Name: name.Text, Bases: bases, Body: body}
}

// suite parses ':' and a block: an indented list of statements, or simple
// statements on the same line.
func (p *syntaxParser) suite(what string) []pyStmt {
	p.expectOp(":", "after "+what)
	if p.tok().Kind != tNewline {
		var out []pyStmt
		for {
			out = append(out, p.simpleStmt())
			if !p.acceptOp(";") || p.tok().Kind == tNewline || p.tok().Kind == tEOF {
				break
			}
		}
		p.endOfStmt("statement")
		return out
	}
	p.i++
	if p.tok().Kind != tIndent {
		p.failAt(p.tok().Pos, "expected an indented block after "+what)
	}
	p.i++
	var out []pyStmt
	for p.tok().Kind != tDedent && p.tok().Kind != tEOF {
		if p.tok().Kind == tNewline {
			p.i++
			continue
		}
		out = append(out, p.stmt())
	}
	if p.tok().Kind == tDedent {
		p.i++
	}
	return out
}

func (p *syntaxParser) forStmt() pyStmt {
	start := p.tok().Pos
	p.i++
	target := p.targetList()
	if !p.acceptKeyword("in") {
		p.failAt(p.tok().Pos, "expected 'in' in for header, found "+p.tok().describe())
	}
	iter := p.exprList()
	body := p.suite("for header")
	var els []pyStmt
	if p.isKeyword("else") && p.peekTok(1).Kind == tOp && p.peekTok(1).Text == ":" {
		p.i++
		els = p.suite("else")
	}
	return &pyFor{P: start, Target: target, Iter: iter, Body: body, Else: els}
}

// targetList parses the targets of a for loop: names, attributes,
// subscripts, separated by commas.
func (p *syntaxParser) targetList() pyExpr {
	start := p.tok().Pos
	var elts []pyExpr
	for {
		elts = append(elts, p.bitOr())
		if !p.acceptOp(",") || p.isKeyword("in") {
			break
		}
	}
	if len(elts) == 1 {
		return elts[0]
	}
	return &pyTuple{P: start, Elts: elts}
}

func (p *syntaxParser) withStmt() pyStmt {
	start := p.tok().Pos
	p.i++
	item := p.expr()
	var as pyExpr
	if p.acceptKeyword("as") {
		as = p.targetList()
	}
	body := p.suite("with header")
	return &pyWith{P: start, Item: item, As: as, Body: body}
}

func (p *syntaxParser) ifStmt() pyStmt {
	start := p.tok().Pos
	p.i++
	cond := p.expr()
	body := p.suite("if header")
	s := &pyIf{P: start, Cond: cond, Body: body}
	switch {
	case p.isKeyword("elif"):
		s.Else = []pyStmt{p.ifStmt()}
	case p.isKeyword("else"):
		p.i++
		s.Else = p.suite("else")
	}
	return s
}

func (p *syntaxParser) simpleStmt() pyStmt {
	t := p.tok()
	if t.Kind == tName {
		switch t.Text {
		case "pass":
			p.i++
			return &pyPass{P: t.Pos}
		case "return":
			p.i++
			var x pyExpr
			if k := p.tok().Kind; k != tNewline && k != tEOF && !p.isOp(";") {
				x = p.exprList()
			}
			return &pyReturn{P: t.Pos, X: x}
		case "assert":
			p.i++
			cond := p.expr()
			var msg pyExpr
			if p.acceptOp(",") {
				msg = p.expr()
			}
			return &pyAssert{P: t.Pos, Cond: cond, Msg: msg}
		case "import":
			p.i++
			return &pyImport{P: t.Pos, Names: p.importNames()}
		case "from":
			p.i++
			mod := p.dottedName()
			if !p.acceptKeyword("import") {
				p.failAt(p.tok().Pos, "expected 'import', found "+p.tok().describe())
			}
			return &pyImport{P: t.Pos, From: mod, Names: p.importNames()}
		}
	}
	x := p.exprList()
	switch {
	case p.isOp("="):
		targets := []pyExpr{x}
		var value pyExpr
		for p.acceptOp("=") {
			value = p.exprList()
			targets = append(targets, value)
		}
		return &pyAssign{P: t.Pos, Targets: targets[:len(targets)-1], Value: value}
	case p.isOp(":"):
		p.i++
		ann := p.expr()
		var value pyExpr
		if p.acceptOp("=") {
			value = p.exprList()
		}
		return &pyAnnAssign{P: t.Pos, Target: x, Annotation: ann, Value: value}
	}
	if op := p.tok(); op.Kind == tOp && len(op.Text) >= 2 && strings.HasSuffix(op.Text, "=") && !isCompareOp(op.Text) {
		p.i++
		return &pyAugAssign{P: t.Pos, Target: x, Op: strings.TrimSuffix(op.Text, "="), Value: p.exprList()}
	}
	return &pyExprStmt{P: t.Pos, X: x}
}

func isCompareOp(s string) bool {
	switch s {
	case "==", "!=", "<=", ">=", "<", ">":
		return true
	}
	return false
}

func (p *syntaxParser) dottedName() string {
	var b strings.Builder
	for p.isOp(".") {
		p.i++
		b.WriteByte('.')
	}
	b.WriteString(p.expectName("module name").Text)
	for p.acceptOp(".") {
		b.WriteString("." + p.expectName("module name").Text)
	}
	return b.String()
}

func (p *syntaxParser) importNames() []string {
	var names []string
	paren := p.acceptOp("(")
	for {
		n := p.dottedName()
		if p.acceptKeyword("as") {
			n += " as " + p.expectName("alias").Text
		}
		names = append(names, n)
		if !p.acceptOp(",") || paren && p.isOp(")") {
			break
		}
	}
	if paren {
		p.expectOp(")", "after imported names")
	}
	return names
}

// exprList parses expr (',' expr)* [','] and makes a tuple of several.
func (p *syntaxParser) exprList() pyExpr {
	start := p.tok().Pos
	first := p.starExpr()
	if !p.isOp(",") {
		return first
	}
	elts := []pyExpr{first}
	for p.acceptOp(",") {
		if p.endsList() {
			break
		}
		elts = append(elts, p.starExpr())
	}
	return &pyTuple{P: start, Elts: elts}
}

func (p *syntaxParser) endsList() bool {
	t := p.tok()
	if t.Kind == tNewline || t.Kind == tEOF {
		return true
	}
	if t.Kind == tOp {
		switch t.Text {
		case ")", "]", "}", "=", ":", ";":
			return true
		}
	}
	return false
}

func (p *syntaxParser) starExpr() pyExpr {
	if t := p.tok(); p.acceptOp("*") {
		return &pyStarred{P: t.Pos, X: p.bitOr()}
	}
	return p.expr()
}

func (p *syntaxParser) enter() {
	p.depth++
	if p.depth > maxNesting {
		p.failAt(p.tok().Pos, "expression nested too deeply")
	}
}

func (p *syntaxParser) leave() { p.depth-- }

// expr parses a conditional expression (Python's "test").
func (p *syntaxParser) expr() pyExpr {
	p.enter()
	defer p.leave()
	t := p.tok()
	switch t.Kind {
	case tNewline, tEOF, tIndent, tDedent:
		p.failAt(p.prevEnd(), "expected an expression")
	}
	if p.isKeyword("lambda") {
		p.failAt(t.Pos, "lambda is not supported")
	}
	x := p.orTest()
	if p.acceptKeyword("if") {
		cond := p.orTest()
		if !p.acceptKeyword("else") {
			p.failAt(p.tok().Pos, "expected 'else' in conditional expression, found "+p.tok().describe())
		}
		els := p.expr()
		return &pyIfExp{P: t.Pos, Cond: cond, Then: x, Else: els}
	}
	return x
}

func (p *syntaxParser) orTest() pyExpr {
	x := p.andTest()
	for p.isKeyword("or") {
		p.i++
		x = &pyBoolOp{P: x.at(), Op: "or", L: x, R: p.andTest()}
	}
	return x
}

func (p *syntaxParser) andTest() pyExpr {
	x := p.notTest()
	for p.isKeyword("and") {
		p.i++
		x = &pyBoolOp{P: x.at(), Op: "and", L: x, R: p.notTest()}
	}
	return x
}

func (p *syntaxParser) notTest() pyExpr {
	if t := p.tok(); p.acceptKeyword("not") {
		p.enter()
		defer p.leave()
		return &pyUnary{P: t.Pos, Op: "not", X: p.notTest()}
	}
	return p.comparison()
}

func (p *syntaxParser) compareOp() string {
	t := p.tok()
	if t.Kind == tOp && (isCompareOp(t.Text)) {
		p.i++
		return t.Text
	}
	if t.Kind == tName {
		switch t.Text {
		case "in":
			p.i++
			return "in"
		case "not":
			if n := p.peekTok(1); n.Kind == tName && n.Text == "in" {
				p.i += 2
				return "not in"
			}
		case "is":
			p.i++
			if p.acceptKeyword("not") {
				return "is not"
			}
			return "is"
		}
	}
	return ""
}

func (p *syntaxParser) comparison() pyExpr {
	start := p.tok().Pos
	x := p.bitOr()
	var ops []string
	xs := []pyExpr{x}
	for {
		op := p.compareOp()
		if op == "" {
			break
		}
		ops = append(ops, op)
		xs = append(xs, p.bitOr())
	}
	if len(ops) == 0 {
		return x
	}
	return &pyCompare{P: start, Ops: ops, Xs: xs}
}

// binary parses left-associative levels of binary operators.
func (p *syntaxParser) binary(ops []string, next func() pyExpr) pyExpr {
	x := next()
	for {
		t := p.tok()
		if t.Kind != tOp {
			return x
		}
		found := false
		for _, o := range ops {
			if t.Text == o {
				found = true
				break
			}
		}
		if !found {
			return x
		}
		p.i++
		x = &pyBinOp{P: x.at(), Op: t.Text, L: x, R: next()}
	}
}

func (p *syntaxParser) bitOr() pyExpr  { return p.binary([]string{"|"}, p.bitXor) }
func (p *syntaxParser) bitXor() pyExpr { return p.binary([]string{"^"}, p.bitAnd) }
func (p *syntaxParser) bitAnd() pyExpr { return p.binary([]string{"&"}, p.shift) }
func (p *syntaxParser) shift() pyExpr  { return p.binary([]string{"<<", ">>"}, p.arith) }
func (p *syntaxParser) arith() pyExpr  { return p.binary([]string{"+", "-"}, p.term) }
func (p *syntaxParser) term() pyExpr {
	return p.binary([]string{"*", "/", "//", "%", "@"}, p.factor)
}

func (p *syntaxParser) factor() pyExpr {
	t := p.tok()
	if t.Kind == tOp && (t.Text == "-" || t.Text == "+" || t.Text == "~") {
		p.i++
		p.enter()
		defer p.leave()
		return &pyUnary{P: t.Pos, Op: t.Text, X: p.factor()}
	}
	return p.power()
}

func (p *syntaxParser) power() pyExpr {
	x := p.primary()
	if p.acceptOp("**") {
		p.enter()
		defer p.leave()
		return &pyBinOp{P: x.at(), Op: "**", L: x, R: p.factor()}
	}
	return x
}

func (p *syntaxParser) primary() pyExpr {
	x := p.atom()
	for {
		t := p.tok()
		switch {
		case p.acceptOp("."):
			n := p.expectName("attribute name after '.'")
			x = &pyAttr{P: x.at(), X: x, Name: n.Text}
		case p.acceptOp("("):
			x = p.callArgs(x, t.Pos)
		case p.acceptOp("["):
			x = p.subscript(x, t.Pos)
		default:
			return x
		}
	}
}

func (p *syntaxParser) callArgs(fn pyExpr, at pos) pyExpr {
	p.enter()
	defer p.leave()
	c := &pyCall{P: fn.at(), Fn: fn}
	for !p.isOp(")") {
		t := p.tok()
		switch {
		case p.acceptOp("**"):
			c.Kwargs = append(c.Kwargs, pyKeyword{P: t.Pos, Value: p.expr()})
		case t.Kind == tName && p.peekTok(1).Kind == tOp && p.peekTok(1).Text == "=":
			p.i += 2
			c.Kwargs = append(c.Kwargs, pyKeyword{P: t.Pos, Name: t.Text, Value: p.expr()})
		default:
			if len(c.Kwargs) > 0 {
				p.failAt(t.Pos, "positional argument follows keyword argument")
			}
			c.Args = append(c.Args, p.starExpr())
		}
		if !p.acceptOp(",") {
			break
		}
	}
	p.expectOp(")", "to close the call opened at "+strconv.Itoa(at.Line)+":"+strconv.Itoa(at.Col))
	return c
}

func (p *syntaxParser) subscript(x pyExpr, at pos) pyExpr {
	p.enter()
	defer p.leave()
	s := &pySubscript{P: x.at(), X: x}
	for !p.isOp("]") {
		s.Index = append(s.Index, p.sliceItem())
		if !p.acceptOp(",") {
			break
		}
		if p.isOp("]") {
			s.Trailing = true
		}
	}
	if len(s.Index) == 0 {
		p.failAt(p.tok().Pos, "expected an index")
	}
	p.expectOp("]", "to close the subscript")
	return s
}

func (p *syntaxParser) sliceItem() pyExpr {
	start := p.tok().Pos
	var lo pyExpr
	if !p.isOp(":") {
		lo = p.expr()
		if !p.isOp(":") {
			return lo
		}
	}
	p.i++ // ':'
	s := &pySlice{P: start, Lower: lo}
	if !p.isOp(":") && !p.isOp(",") && !p.isOp("]") {
		s.Upper = p.expr()
	}
	if p.acceptOp(":") && !p.isOp(",") && !p.isOp("]") {
		s.Step = p.expr()
	}
	return s
}

func (p *syntaxParser) atom() pyExpr {
	t := p.tok()
	switch t.Kind {
	case tName:
		switch t.Text {
		case "True", "False", "None":
			p.i++
			return &pyConst{P: t.Pos, Value: t.Text}
		}
		if isReserved(t.Text) {
			p.failAt(t.Pos, "unexpected keyword "+strconv.Quote(t.Text))
		}
		p.i++
		return &pyName{P: t.Pos, ID: t.Text}
	case tInt:
		p.i++
		text := strings.ReplaceAll(t.Text, "_", "")
		v, err := strconv.ParseInt(text, 0, 64)
		if err != nil {
			if len(text) > 1 && text[0] == '0' && text[1] >= '0' && text[1] <= '9' {
				p.failAt(t.Pos, "leading zeros in a decimal integer are not allowed")
			}
			p.failAt(t.Pos, "integer "+t.Text+" does not fit in 64 bits")
		}
		return &pyInt{P: t.Pos, Value: v, Text: t.Text}
	case tFloat:
		p.i++
		v, err := strconv.ParseFloat(strings.ReplaceAll(t.Text, "_", ""), 64)
		if err != nil && !math.IsInf(v, 0) {
			p.failAt(t.Pos, "bad number "+t.Text)
		}
		return &pyFloat{P: t.Pos, Value: v}
	case tString:
		p.i++
		s := t.Text
		for p.tok().Kind == tString { // implicit concatenation
			s += p.tok().Text
			p.i++
		}
		return &pyStr{P: t.Pos, Value: s}
	case tOp:
		switch t.Text {
		case "(":
			p.i++
			p.enter()
			defer p.leave()
			if p.acceptOp(")") {
				return &pyTuple{P: t.Pos, Paren: true}
			}
			x := p.starExpr()
			if p.isKeyword("for") {
				p.failAt(p.tok().Pos, "generator expressions are not supported")
			}
			if !p.isOp(",") {
				p.expectOp(")", "to close the parenthesis")
				return x
			}
			elts := []pyExpr{x}
			for p.acceptOp(",") && !p.isOp(")") {
				elts = append(elts, p.starExpr())
			}
			p.expectOp(")", "to close the tuple")
			return &pyTuple{P: t.Pos, Elts: elts, Paren: true}
		case "[":
			p.i++
			p.enter()
			defer p.leave()
			l := &pyList{P: t.Pos}
			for !p.isOp("]") {
				l.Elts = append(l.Elts, p.starExpr())
				if p.isKeyword("for") {
					p.failAt(p.tok().Pos, "list comprehensions are not supported")
				}
				if !p.acceptOp(",") {
					break
				}
			}
			p.expectOp("]", "to close the list")
			return l
		case "{":
			p.i++
			p.enter()
			defer p.leave()
			d := &pyDict{P: t.Pos}
			for !p.isOp("}") {
				k := p.expr()
				p.expectOp(":", "after dict key")
				d.Keys = append(d.Keys, k)
				d.Values = append(d.Values, p.expr())
				if !p.acceptOp(",") {
					break
				}
			}
			p.expectOp("}", "to close the dict")
			return d
		case "...":
			p.i++
			return &pyConst{P: t.Pos, Value: "..."}
		}
	}
	at := t.Pos
	if t.Kind == tNewline || t.Kind == tEOF || t.Kind == tDedent || t.Kind == tIndent {
		at = p.prevEnd()
		p.failAt(at, "expected an expression")
	}
	p.failAt(at, "expected an expression, found "+t.describe())
	return nil
}
