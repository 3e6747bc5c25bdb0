package schedule

import (
	"fmt"
	"maps"
	"strconv"
	"strings"
	"unicode"
)

// The trace names every handle it mentions by a Python variable, assigned
// where a primitive returns it: C = sch.get_block("C"), i, j, k =
// sch.get_loops(C). A handle is named after its block or loop variable;
// when another handle already has that name, a suffix _rv1, _rv2 …
// tells them apart (the loops i and j of two blocks are different loops).
// Replay reads such lines back.

// rvKey identifies a handle for naming: a block handle's id or a loop's
// variable.
type rvKey = any

// traceName returns the variable that names handle key in the trace,
// choosing one from base when the handle has none yet.
func (s *Schedule) traceName(key rvKey, base string) string {
	if n, ok := s.names[key]; ok {
		return n
	}
	if s.names == nil {
		s.names = map[rvKey]string{}
		s.taken = map[string]bool{}
	}
	base = pyIdent(base)
	name := base
	for i := 1; s.taken[name]; i++ {
		name = fmt.Sprintf("%s_rv%d", base, i)
	}
	s.names[key] = name
	s.taken[name] = true
	return name
}

// bn and ln name block and loop handles for the trace.
func (s *Schedule) bn(b BlockRV) string { return s.traceName(b.id, b.name) }

func (s *Schedule) ln(l LoopRV) string {
	if l.v == nil {
		return "None"
	}
	return s.traceName(l.v, l.v.Name)
}

// lns names loops: i, j, k.
func (s *Schedule) lns(loops []LoopRV) string {
	names := make([]string, len(loops))
	for i, l := range loops {
		names[i] = s.ln(l)
	}
	return strings.Join(names, ", ")
}

// assignLoops is the left side that binds a list of loops: "i, j = ",
// "i, = " for one and "" for none.
func (s *Schedule) assignLoops(loops []LoopRV) string {
	switch len(loops) {
	case 0:
		return ""
	case 1:
		return s.ln(loops[0]) + ", = "
	}
	return s.lns(loops) + " = "
}

var pyKeywords = map[string]bool{"False": true, "None": true, "True": true, "and": true, "as": true, "assert": true,
	"async": true, "await": true, "break": true, "class": true, "continue": true, "def": true, "del": true,
	"elif": true, "else": true, "except": true, "finally": true, "for": true, "from": true, "global": true,
	"if": true, "import": true, "in": true, "is": true, "lambda": true, "nonlocal": true, "not": true,
	"or": true, "pass": true, "raise": true, "return": true, "try": true, "while": true, "with": true,
	"yield": true, "sch": true, "T": true}

// pyIdent turns a block or loop name into a Python identifier.
func pyIdent(name string) string {
	var b strings.Builder
	for i, r := range name {
		switch {
		case r == '_' || unicode.IsLetter(r) || i > 0 && unicode.IsDigit(r):
			b.WriteRune(r)
		case i == 0 && unicode.IsDigit(r):
			b.WriteString("_")
			b.WriteRune(r)
		default:
			b.WriteString("_")
		}
	}
	out := b.String()
	if out == "" || pyKeywords[out] {
		out += "_"
	}
	return out
}

// pyValue prints an annotation value as a Python literal.
func pyValue(v any) string {
	switch v := v.(type) {
	case bool:
		if v {
			return "True"
		}
		return "False"
	case string:
		return strconv.Quote(v)
	case float64:
		s := strconv.FormatFloat(v, 'g', -1, 64)
		if !strings.ContainsAny(s, ".eEn") { // NaN and Inf carry an n
			s += ".0"
		}
		return s
	}
	return fmt.Sprint(v)
}

// pyInts prints integers as a Python list, -1 as None when none is set.
func pyInts(xs []int64, none bool) string {
	fs := make([]string, len(xs))
	for i, f := range xs {
		fs[i] = fmt.Sprint(f)
		if none && f == -1 {
			fs[i] = "None"
		}
	}
	return "[" + strings.Join(fs, ", ") + "]"
}

// cloneNames copies the naming state for Copy.
func (s *Schedule) cloneNames() (map[rvKey]string, map[string]bool) {
	return maps.Clone(s.names), maps.Clone(s.taken)
}
