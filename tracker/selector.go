package tracker

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// Selector is a parsed attribute selector: every term must hold.
type Selector struct {
	src   string
	terms []term
}

type term struct {
	name, op, value string
	num             float64
	isNum           bool
}

// ops lists the comparison operators, longest first so ">=" wins over ">".
var ops = []string{">=", "<=", "!=", "==", "=", ">", "<"}

// ParseSelector parses a selector: comma-separated terms "name OP value"
// with OP one of = (or ==) != > >= < <=, or a bare name meaning
// "name=true". Ordering operators need a numeric value. An empty string is
// the selector that matches everything.
func ParseSelector(s string) (*Selector, error) {
	sel := &Selector{src: strings.TrimSpace(s)}
	if sel.src == "" {
		return sel, nil
	}
	for i, raw := range strings.Split(sel.src, ",") {
		t, err := parseTerm(strings.TrimSpace(raw))
		if err != nil {
			return nil, fmt.Errorf("parse selector %q: term %d %q: %w", s, i+1, strings.TrimSpace(raw), err)
		}
		sel.terms = append(sel.terms, t)
	}
	return sel, nil
}

func parseTerm(s string) (term, error) {
	if s == "" {
		return term{}, fmt.Errorf("empty term: %w", proto.ErrBadRequest)
	}
	at, op := -1, ""
	for i := 0; i < len(s) && at < 0; i++ {
		for _, o := range ops {
			if strings.HasPrefix(s[i:], o) {
				at, op = i, o
				break
			}
		}
	}
	var t term
	if at < 0 {
		t = term{name: s, op: "=", value: "true"}
	} else {
		t = term{name: strings.TrimSpace(s[:at]), op: op, value: strings.TrimSpace(s[at+len(op):])}
	}
	if t.op == "==" {
		t.op = "="
	}
	if t.name == "" {
		return term{}, fmt.Errorf("missing attribute name before %q: %w", op, proto.ErrBadRequest)
	}
	if strings.ContainsAny(t.name, " \t<>=!") {
		return term{}, fmt.Errorf("bad attribute name %q: %w", t.name, proto.ErrBadRequest)
	}
	if t.value == "" {
		return term{}, fmt.Errorf("missing value after %q: %w", op, proto.ErrBadRequest)
	}
	if strings.ContainsAny(t.value, "<>=!") {
		return term{}, fmt.Errorf("bad value %q: %w", t.value, proto.ErrBadRequest)
	}
	if f, err := strconv.ParseFloat(t.value, 64); err == nil {
		t.num, t.isNum = f, true
	}
	if (t.op != "=" && t.op != "!=") && !t.isNum {
		return term{}, fmt.Errorf("operator %q needs a number, got %q: %w", t.op, t.value, proto.ErrBadRequest)
	}
	return t, nil
}

// String returns the selector as written.
func (s *Selector) String() string { return s.src }

// Empty reports whether s matches everything.
func (s *Selector) Empty() bool { return s == nil || len(s.terms) == 0 }

// Match reports whether the flattened attributes satisfy every term. A
// missing attribute matches only "!=".
func (s *Selector) Match(attrs map[string]string) bool {
	if s == nil {
		return true
	}
	for _, t := range s.terms {
		if !t.match(attrs) {
			return false
		}
	}
	return true
}

func (t term) match(attrs map[string]string) bool {
	v, ok := attrs[t.name]
	if !ok {
		return t.op == "!="
	}
	if t.isNum {
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			switch t.op {
			case "=":
				return f == t.num
			case "!=":
				return f != t.num
			case ">":
				return f > t.num
			case ">=":
				return f >= t.num
			case "<":
				return f < t.num
			case "<=":
				return f <= t.num
			}
		}
		if t.op != "=" && t.op != "!=" {
			return false
		}
	}
	eq := strings.EqualFold(v, t.value)
	if t.op == "!=" {
		return !eq
	}
	return eq
}
