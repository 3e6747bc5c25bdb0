package script

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// tokKind is the kind of a token.
type tokKind uint8

const (
	tEOF tokKind = iota
	tNewline
	tIndent
	tDedent
	tName
	tInt
	tFloat
	tString
	tOp
)

func (k tokKind) String() string {
	return [...]string{"end of file", "end of line", "indent", "dedent", "name", "integer", "number", "string", "operator"}[k]
}

// pos is a place in the source: 1-based line and column (in runes).
type pos struct {
	Line, Col int
}

// token is one lexical token. Text is the operator, the name, the literal's
// source text or, for strings, the decoded value.
type token struct {
	Kind tokKind
	Text string
	Pos  pos
	// End is the position just after the token.
	End pos
}

// describe names the token for "expected X, found Y" messages.
func (t token) describe() string {
	switch t.Kind {
	case tName, tOp:
		return strconv.Quote(t.Text)
	case tInt, tFloat:
		return "number " + t.Text
	case tString:
		return "string " + strconv.Quote(t.Text)
	}
	return t.Kind.String()
}

// maxIndentDepth bounds nesting of indented blocks, as Python does.
const maxIndentDepth = 100

type lexer struct {
	src     string
	off     int
	line    int
	col     int
	depth   int // bracket depth
	indents []int
	// altIndents are the same levels measured with tabs as one column,
	// to reject indentation whose meaning depends on the tab size (as
	// Python's TabError does).
	altIndents []int
	toks       []token
	atBOL      bool
	err        *Error
	file       string
}

// tokenize splits src into tokens, with NEWLINE, INDENT and DEDENT tokens
// for Python's layout rules. Comments and blank lines are dropped.
func tokenize(file, src string) ([]token, *Error) {
	lx := &lexer{src: src, line: 1, col: 1, indents: []int{0}, altIndents: []int{0}, atBOL: true, file: file}
	lx.run()
	if lx.err != nil {
		return nil, lx.err
	}
	return lx.toks, nil
}

func (lx *lexer) errorf(p pos, format string, args ...any) {
	if lx.err == nil {
		lx.err = newError(lx.file, lx.src, p, fmt.Sprintf(format, args...))
	}
}

func (lx *lexer) peek() rune {
	if lx.off >= len(lx.src) {
		return -1
	}
	r, _ := utf8.DecodeRuneInString(lx.src[lx.off:])
	return r
}

func (lx *lexer) peekAt(n int) rune {
	off := lx.off
	for i := 0; i < n; i++ {
		if off >= len(lx.src) {
			return -1
		}
		_, sz := utf8.DecodeRuneInString(lx.src[off:])
		off += sz
	}
	if off >= len(lx.src) {
		return -1
	}
	r, _ := utf8.DecodeRuneInString(lx.src[off:])
	return r
}

func (lx *lexer) next() rune {
	if lx.off >= len(lx.src) {
		return -1
	}
	r, sz := utf8.DecodeRuneInString(lx.src[lx.off:])
	lx.off += sz
	if r == '\n' {
		lx.line++
		lx.col = 1
	} else {
		lx.col++
	}
	return r
}

func (lx *lexer) here() pos { return pos{lx.line, lx.col} }

func (lx *lexer) emit(k tokKind, text string, p pos) {
	lx.toks = append(lx.toks, token{Kind: k, Text: text, Pos: p, End: lx.here()})
}

func (lx *lexer) run() {
	for lx.err == nil {
		if lx.atBOL && lx.depth == 0 {
			if !lx.indentation() {
				continue
			}
		}
		r := lx.peek()
		p := lx.here()
		switch {
		case r == -1:
			if n := len(lx.toks); n > 0 && lx.toks[n-1].Kind != tNewline && lx.toks[n-1].Kind != tDedent {
				lx.emit(tNewline, "", p)
			}
			for len(lx.indents) > 1 {
				lx.indents = lx.indents[:len(lx.indents)-1]
				lx.altIndents = lx.altIndents[:len(lx.altIndents)-1]
				lx.emit(tDedent, "", p)
			}
			lx.emit(tEOF, "", p)
			return
		case r == '\n':
			lx.next()
			if lx.depth == 0 {
				lx.emit(tNewline, "", p)
				lx.atBOL = true
			}
		case r == ' ' || r == '\t' || r == '\r' || r == '\f':
			lx.next()
		case r == '#':
			for lx.peek() != '\n' && lx.peek() != -1 {
				lx.next()
			}
		case r == '\\':
			lx.next()
			if lx.peek() == '\r' {
				lx.next()
			}
			if lx.peek() != '\n' {
				lx.errorf(p, "unexpected character after line continuation")
				return
			}
			lx.next()
		case r == '"' || r == '\'':
			lx.str(p, false)
		case (r == 'r' || r == 'R' || r == 'b' || r == 'B' || r == 'u' || r == 'U') && (lx.peekAt(1) == '"' || lx.peekAt(1) == '\''):
			raw := r == 'r' || r == 'R'
			lx.next()
			lx.str(p, raw)
		case r == '_' || unicode.IsLetter(r):
			start := lx.off
			for r := lx.peek(); r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r); r = lx.peek() {
				lx.next()
			}
			lx.emit(tName, lx.src[start:lx.off], p)
		case r >= '0' && r <= '9' || r == '.' && lx.peekAt(1) >= '0' && lx.peekAt(1) <= '9':
			lx.number(p)
		default:
			lx.op(p)
		}
	}
}

// indentation measures the indentation of a new line. It returns false when
// the line is blank or a comment (and has been consumed).
func (lx *lexer) indentation() bool {
	width, alt := 0, 0
	start := lx.here()
	for {
		switch lx.peek() {
		case ' ':
			width++
			alt++
		case '\t':
			width = (width/8 + 1) * 8
			alt++
		case '\f', '\r':
		default:
			goto done
		}
		lx.next()
	}
done:
	switch lx.peek() {
	case '#':
		for lx.peek() != '\n' && lx.peek() != -1 {
			lx.next()
		}
		fallthrough
	case '\n':
		if lx.peek() == '\n' {
			lx.next()
		}
		return false
	case -1:
		lx.atBOL = false
		return true
	}
	lx.atBOL = false
	p := lx.here()
	cur, curAlt := lx.indents[len(lx.indents)-1], lx.altIndents[len(lx.altIndents)-1]
	if (width > cur) != (alt > curAlt) || (width == cur) != (alt == curAlt) {
		lx.errorf(p, "inconsistent use of tabs and spaces in indentation")
		return true
	}
	switch {
	case width > cur:
		if len(lx.indents) > maxIndentDepth {
			lx.errorf(p, "too many levels of indentation")
			return true
		}
		if len(lx.toks) == 0 {
			lx.errorf(pos{start.Line, 1}, "unexpected indent")
			return true
		}
		lx.indents = append(lx.indents, width)
		lx.altIndents = append(lx.altIndents, alt)
		lx.emit(tIndent, "", p)
	case width < cur:
		for width < lx.indents[len(lx.indents)-1] {
			lx.indents = lx.indents[:len(lx.indents)-1]
			lx.altIndents = lx.altIndents[:len(lx.altIndents)-1]
			lx.emit(tDedent, "", p)
		}
		if width != lx.indents[len(lx.indents)-1] {
			lx.errorf(p, "unindent does not match any outer indentation level")
		} else if alt != lx.altIndents[len(lx.altIndents)-1] {
			lx.errorf(p, "inconsistent use of tabs and spaces in indentation")
		}
	}
	return true
}

func (lx *lexer) str(p pos, raw bool) {
	q := lx.next()
	triple := lx.peek() == q && lx.peekAt(1) == q
	if triple {
		lx.next()
		lx.next()
	}
	var b strings.Builder
	for {
		r := lx.peek()
		switch {
		case r == -1:
			lx.errorf(p, "unterminated string")
			return
		case r == '\n' && !triple:
			lx.errorf(p, "unterminated string")
			return
		case r == q:
			if !triple {
				lx.next()
				lx.emit(tString, b.String(), p)
				return
			}
			if lx.peekAt(1) == q && lx.peekAt(2) == q {
				lx.next()
				lx.next()
				lx.next()
				lx.emit(tString, b.String(), p)
				return
			}
			b.WriteRune(lx.next())
		case r == '\\' && !raw:
			lx.next()
			e := lx.next()
			switch e {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'r':
				b.WriteByte('\r')
			case '0':
				b.WriteByte(0)
			case '\\', '\'', '"':
				b.WriteRune(e)
			case '\n':
			case 'x', 'u', 'U':
				n := map[rune]int{'x': 2, 'u': 4, 'U': 8}[e]
				h := make([]rune, n)
				for i := range h {
					h[i] = lx.next()
				}
				v, err := strconv.ParseUint(string(h), 16, 32)
				if err != nil || v > unicode.MaxRune {
					lx.errorf(p, "bad \\%c escape in string", e)
					return
				}
				b.WriteRune(rune(v))
			case -1:
				lx.errorf(p, "unterminated string")
				return
			default:
				b.WriteByte('\\')
				b.WriteRune(e)
			}
		case r == '\\' && raw:
			b.WriteRune(lx.next())
			if n := lx.peek(); n == q || n == '\\' {
				b.WriteRune(lx.next())
			}
		default:
			b.WriteRune(lx.next())
		}
	}
}

func (lx *lexer) number(p pos) {
	start := lx.off
	isFloat := false
	digits := func(ok func(rune) bool) {
		for r := lx.peek(); ok(r) || r == '_'; r = lx.peek() {
			lx.next()
		}
	}
	dec := func(r rune) bool { return r >= '0' && r <= '9' }
	if lx.peek() == '0' && (lx.peekAt(1) == 'x' || lx.peekAt(1) == 'X' || lx.peekAt(1) == 'b' || lx.peekAt(1) == 'B' || lx.peekAt(1) == 'o' || lx.peekAt(1) == 'O') {
		lx.next()
		lx.next()
		digits(func(r rune) bool {
			return dec(r) || r >= 'a' && r <= 'f' || r >= 'A' && r <= 'F'
		})
	} else {
		digits(dec)
		if lx.peek() == '.' {
			isFloat = true
			lx.next()
			digits(dec)
		}
		if r := lx.peek(); r == 'e' || r == 'E' {
			n := lx.peekAt(1)
			if dec(n) || (n == '+' || n == '-') && dec(lx.peekAt(2)) {
				isFloat = true
				lx.next()
				if n == '+' || n == '-' {
					lx.next()
				}
				digits(dec)
			}
		}
	}
	text := lx.src[start:lx.off]
	if r := lx.peek(); r == '_' || unicode.IsLetter(r) {
		lx.errorf(p, "invalid number %q", text+string(r))
		return
	}
	if isFloat {
		lx.emit(tFloat, text, p)
	} else {
		lx.emit(tInt, text, p)
	}
}

var threeCharOps = []string{"**=", "//=", ">>=", "<<=", "..."}
var twoCharOps = []string{"**", "//", "==", "!=", "<=", ">=", "->", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<", ">>", ":="}

func (lx *lexer) op(p pos) {
	rest := lx.src[lx.off:]
	for _, set := range [][]string{threeCharOps, twoCharOps} {
		for _, o := range set {
			if strings.HasPrefix(rest, o) {
				for range o {
					lx.next()
				}
				lx.emit(tOp, o, p)
				return
			}
		}
	}
	r := lx.peek()
	switch r {
	case '(', '[', '{':
		lx.depth++
	case ')', ']', '}':
		if lx.depth == 0 {
			lx.errorf(p, "unmatched %q", string(r))
			return
		}
		lx.depth--
	}
	if strings.ContainsRune("+-*/%@&|^~<>()[]{},:.;=", r) {
		lx.next()
		lx.emit(tOp, string(r), p)
		return
	}
	lx.errorf(p, "unexpected character %q", r)
}
