package schedule

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/ndarray"
)

// Replay applies a trace, as Trace prints it (one primitive a line, in
// TVM's Python syntax, handles named by the variables that earlier lines
// assign), to f and returns the schedule: Replay(f, s.Trace()) gives a
// function structurally equal to s.Func(). Sampling lines replay their
// recorded decisions. An error names the line and what was wrong with it.
func Replay(f *ir.PrimFunc, trace []string) (*Schedule, error) {
	s, err := New(f)
	if err != nil {
		return nil, err
	}
	r := &replayer{s: s, env: map[string]any{}}
	for n, line := range trace {
		if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if err := r.line(line); err != nil {
			return nil, fmt.Errorf("replay: line %d %q: %w", n+1, line, err)
		}
	}
	return s, nil
}

type replayer struct {
	s   *Schedule
	env map[string]any // variable → BlockRV or LoopRV
}

// pyVal is a parsed argument: a name, a string, a number, None, True or
// False, a list or a lambda (an index map).
type pyVal struct {
	kind  byte // 'n' name, 's' string, 'i' int, 'f' float, '0' None, 'b' bool, 'l' list, 'm' index map
	str   string
	num   int64
	flt   float64
	list  []pyVal
	index *IndexMap
}

func (v pyVal) describe() string {
	switch v.kind {
	case 'n':
		return "name " + v.str
	case 's':
		return strconv.Quote(v.str)
	case 'i':
		return fmt.Sprint(v.num)
	case 'f':
		return fmt.Sprint(v.flt)
	case '0':
		return "None"
	case 'b':
		return v.str
	case 'l':
		return "a list"
	case 'm':
		return "a lambda"
	}
	return "?"
}

// args are a call's arguments, positional and by keyword.
type args struct {
	prim string
	pos  []pyVal
	kw   map[string]pyVal
}

// get returns argument i, given by position or as keyword name.
func (a *args) get(i int, name string) (pyVal, error) {
	if i < len(a.pos) {
		return a.pos[i], nil
	}
	if v, ok := a.kw[name]; ok {
		return v, nil
	}
	return pyVal{}, fmt.Errorf("%s: argument %d (%s) is missing", a.prim, i+1, name)
}

func (a *args) has(i int, name string) bool {
	_, ok := a.kw[name]
	return i < len(a.pos) || ok
}

func (r *replayer) block(a *args, i int, name string) (BlockRV, error) {
	v, err := a.get(i, name)
	if err != nil {
		return BlockRV{}, err
	}
	b, ok := r.env[v.str].(BlockRV)
	if v.kind != 'n' || !ok {
		return BlockRV{}, fmt.Errorf("%s: %s is %s, not a block that an earlier line assigned", a.prim, name, v.describe())
	}
	return b, nil
}

func (r *replayer) loop(a *args, i int, name string) (LoopRV, error) {
	v, err := a.get(i, name)
	if err != nil {
		return LoopRV{}, err
	}
	return r.loopVal(a.prim, name, v)
}

func (r *replayer) loopVal(prim, name string, v pyVal) (LoopRV, error) {
	l, ok := r.env[v.str].(LoopRV)
	if v.kind != 'n' || !ok {
		return LoopRV{}, fmt.Errorf("%s: %s is %s, not a loop that an earlier line assigned", prim, name, v.describe())
	}
	return l, nil
}

func (a *args) str(i int, name string) (string, error) {
	v, err := a.get(i, name)
	if err != nil {
		return "", err
	}
	if v.kind != 's' {
		return "", fmt.Errorf("%s: %s is %s, want a string", a.prim, name, v.describe())
	}
	return v.str, nil
}

func (a *args) int(i int, name string) (int64, error) {
	v, err := a.get(i, name)
	if err != nil {
		return 0, err
	}
	if v.kind != 'i' {
		return 0, fmt.Errorf("%s: %s is %s, want an integer", a.prim, name, v.describe())
	}
	return v.num, nil
}

// ints reads a list of integers; None reads as -1 when none is set.
func (a *args) ints(i int, name string, none bool) ([]int64, error) {
	v, err := a.get(i, name)
	if err != nil {
		return nil, err
	}
	if v.kind != 'l' {
		return nil, fmt.Errorf("%s: %s is %s, want a list of integers", a.prim, name, v.describe())
	}
	out := make([]int64, len(v.list))
	for j, x := range v.list {
		switch {
		case x.kind == 'i':
			out[j] = x.num
		case x.kind == '0' && none:
			out[j] = -1
		default:
			return nil, fmt.Errorf("%s: element %d of %s is %s, want an integer", a.prim, j, name, x.describe())
		}
	}
	return out, nil
}

func (a *args) floats(i int, name string) ([]float64, error) {
	v, err := a.get(i, name)
	if err != nil {
		return nil, err
	}
	if v.kind != 'l' {
		return nil, fmt.Errorf("%s: %s is %s, want a list of numbers", a.prim, name, v.describe())
	}
	out := make([]float64, len(v.list))
	for j, x := range v.list {
		switch x.kind {
		case 'i':
			out[j] = float64(x.num)
		case 'f':
			out[j] = x.flt
		default:
			return nil, fmt.Errorf("%s: element %d of %s is %s, want a number", a.prim, j, name, x.describe())
		}
	}
	return out, nil
}

func (r *replayer) loops(a *args) ([]LoopRV, error) {
	out := make([]LoopRV, len(a.pos))
	for i, v := range a.pos {
		l, err := r.loopVal(a.prim, fmt.Sprintf("argument %d", i+1), v)
		if err != nil {
			return nil, err
		}
		out[i] = l
	}
	return out, nil
}

// line parses and applies one line.
func (r *replayer) line(line string) error {
	p := &pyParser{src: line}
	var lhs []string
	// name[, name…][,] = sch.prim(…) or sch.prim(…)
	if eq := assignment(line); eq >= 0 {
		for _, n := range strings.Split(line[:eq], ",") {
			n = strings.TrimSpace(n)
			if n == "" {
				continue
			}
			if !isIdent(n) {
				return fmt.Errorf("%q is not a variable name", n)
			}
			lhs = append(lhs, n)
		}
		p.pos = eq + 1
	}
	p.space()
	if !p.eat("sch.") {
		return fmt.Errorf("want sch.primitive(…)")
	}
	prim := p.ident()
	if prim == "" {
		return fmt.Errorf("want a primitive's name after sch.")
	}
	a := &args{prim: prim, kw: map[string]pyVal{}}
	if err := p.call(a); err != nil {
		return err
	}
	res, err := r.apply(a)
	if err != nil {
		return err
	}
	var vals []any
	switch res := res.(type) {
	case nil:
	case []LoopRV:
		for _, l := range res {
			vals = append(vals, l)
		}
	case []BlockRV:
		for _, b := range res {
			vals = append(vals, b)
		}
	default:
		vals = []any{res}
	}
	if len(lhs) == 0 {
		return nil
	}
	if len(lhs) != len(vals) {
		return fmt.Errorf("%s returned %d handles, the line assigns %d", prim, len(vals), len(lhs))
	}
	for i, n := range lhs {
		r.env[n] = vals[i]
		// The replayed schedule prints the names the trace used.
		switch v := vals[i].(type) {
		case BlockRV:
			r.s.renameRV(v.id, n)
		case LoopRV:
			r.s.renameRV(v.v, n)
		}
	}
	return nil
}

// renameRV makes the trace call handle key by name (replay keeps the
// names of the trace it reads). The line that returned the handle has
// been recorded already: its text is rewritten too.
func (s *Schedule) renameRV(key rvKey, name string) {
	old, ok := s.names[key]
	if !ok || old == name || s.taken[name] {
		return // a name the trace binds twice keeps the schedule's own
	}
	delete(s.taken, old)
	s.names[key] = name
	s.taken[name] = true
	last := len(s.trace) - 1
	if eq := assignment(s.trace[last]); eq >= 0 {
		parts := strings.Split(s.trace[last][:eq], ",")
		for i, p := range parts {
			if strings.TrimSpace(p) == old {
				parts[i] = strings.Replace(p, old, name, 1)
			}
		}
		s.trace[last] = strings.Join(parts, ",") + s.trace[last][eq:]
	}
}

// assignment returns the index of the = of "names = sch…", or -1.
func assignment(line string) int {
	i := strings.Index(line, "sch.")
	if i < 0 {
		return -1
	}
	j := strings.LastIndex(line[:i], "=")
	if j < 0 || strings.TrimSpace(line[j+1:i]) != "" {
		return -1
	}
	return j
}

func isIdent(s string) bool {
	for i, r := range s {
		if !(r == '_' || unicode.IsLetter(r) || i > 0 && unicode.IsDigit(r)) {
			return false
		}
	}
	return s != ""
}

// pyParser reads the arguments of one call.
type pyParser struct {
	src string
	pos int
}

func (p *pyParser) space() {
	for p.pos < len(p.src) && (p.src[p.pos] == ' ' || p.src[p.pos] == '\t') {
		p.pos++
	}
}

func (p *pyParser) eat(s string) bool {
	p.space()
	if strings.HasPrefix(p.src[p.pos:], s) {
		p.pos += len(s)
		return true
	}
	return false
}

func (p *pyParser) peek() byte {
	p.space()
	if p.pos < len(p.src) {
		return p.src[p.pos]
	}
	return 0
}

func (p *pyParser) ident() string {
	p.space()
	start := p.pos
	for p.pos < len(p.src) {
		r := rune(p.src[p.pos])
		if r == '_' || r >= 0x80 || unicode.IsLetter(r) || p.pos > start && unicode.IsDigit(r) {
			p.pos++
			continue
		}
		break
	}
	return p.src[start:p.pos]
}

func (p *pyParser) errorf(format string, a ...any) error {
	return fmt.Errorf("column %d: %s", p.pos+1, fmt.Sprintf(format, a...))
}

// call reads (arg, …, name=arg, …) and the end of the line.
func (p *pyParser) call(a *args) error {
	if !p.eat("(") {
		return p.errorf("want ( after sch.%s", a.prim)
	}
	for !p.eat(")") {
		if len(a.pos)+len(a.kw) > 0 && !p.eat(",") {
			return p.errorf("want , or ) between arguments")
		}
		if p.eat(")") {
			break
		}
		save := p.pos
		name := p.ident()
		if name != "" && p.eat("=") && !strings.HasPrefix(p.src[p.pos:], "=") {
			v, err := p.value()
			if err != nil {
				return err
			}
			a.kw[name] = v
			continue
		}
		p.pos = save
		if len(a.kw) > 0 {
			return p.errorf("a positional argument after keyword arguments")
		}
		v, err := p.value()
		if err != nil {
			return err
		}
		a.pos = append(a.pos, v)
	}
	p.space()
	if p.pos != len(p.src) {
		return p.errorf("unexpected %q after the call", p.src[p.pos:])
	}
	return nil
}

func (p *pyParser) value() (pyVal, error) {
	c := p.peek()
	switch {
	case c == '"' || c == '\'':
		return p.stringLit()
	case c == '[' || c == '(':
		closer := "]"
		if c == '(' {
			closer = ")"
		}
		p.pos++
		var out pyVal
		out.kind = 'l'
		for !p.eat(closer) {
			if len(out.list) > 0 && !p.eat(",") {
				return pyVal{}, p.errorf("want , or %s in a list", closer)
			}
			if p.eat(closer) {
				break
			}
			v, err := p.value()
			if err != nil {
				return pyVal{}, err
			}
			out.list = append(out.list, v)
		}
		return out, nil
	case c == '-' || c >= '0' && c <= '9':
		start := p.pos
		p.pos++
		for p.pos < len(p.src) && strings.IndexByte("0123456789.eE+-xabcdefABCDEF", p.src[p.pos]) >= 0 {
			if (p.src[p.pos] == '+' || p.src[p.pos] == '-') && !strings.ContainsAny(p.src[p.pos-1:p.pos], "eE") {
				break
			}
			p.pos++
		}
		text := p.src[start:p.pos]
		if n, err := strconv.ParseInt(text, 0, 64); err == nil {
			return pyVal{kind: 'i', num: n}, nil
		}
		f, err := strconv.ParseFloat(text, 64)
		if err != nil {
			return pyVal{}, p.errorf("bad number %q", text)
		}
		return pyVal{kind: 'f', flt: f}, nil
	}
	name := p.ident()
	switch name {
	case "":
		return pyVal{}, p.errorf("want an argument")
	case "None":
		return pyVal{kind: '0'}, nil
	case "True", "False":
		return pyVal{kind: 'b', str: name}, nil
	case "nan", "inf":
		f, _ := strconv.ParseFloat(name, 64)
		return pyVal{kind: 'f', flt: f}, nil
	case "lambda":
		m, err := p.indexMap()
		if err != nil {
			return pyVal{}, err
		}
		return pyVal{kind: 'm', index: m}, nil
	}
	return pyVal{kind: 'n', str: name}, nil
}

func (p *pyParser) stringLit() (pyVal, error) {
	q := p.src[p.pos]
	end := p.pos + 1
	for end < len(p.src) && p.src[end] != q {
		if p.src[end] == '\\' {
			end++
		}
		end++
	}
	if end >= len(p.src) {
		return pyVal{}, p.errorf("unterminated string")
	}
	text := p.src[p.pos : end+1]
	if q == '\'' {
		text = `"` + strings.ReplaceAll(text[1:len(text)-1], `"`, `\"`) + `"`
	}
	s, err := strconv.Unquote(text)
	if err != nil {
		return pyVal{}, p.errorf("bad string %s", p.src[p.pos:end+1])
	}
	p.pos = end + 1
	return pyVal{kind: 's', str: s}, nil
}

// apply runs one primitive; it returns nil, a handle or a list of them.
func (r *replayer) apply(a *args) (any, error) {
	p, ok := replayPrims[a.prim]
	if !ok {
		return nil, fmt.Errorf("unknown primitive sch.%s", a.prim)
	}
	vals, err := r.read(a, p.params)
	if err != nil {
		return nil, err
	}
	return p.run(r.s, vals)
}

// Apply runs primitive prim (by its trace name, "rfactor") with args,
// Go values of the kinds its trace line takes: BlockRV, LoopRV, []LoopRV
// (fuse, reorder), string, int64, []int64 (factors with -1 for None),
// []float64, *IndexMap, BufferIndex, *float64 (a pad value or nil), a
// dtype's name (cache_write's last argument, which may be left out for
// none) and an annotation's value. It returns what the primitive returns (nil, a
// handle or a list of them). It is the way to reach every primitive by
// name, as bindings to other languages do.
func (s *Schedule) Apply(prim string, args ...any) (any, error) {
	p, ok := replayPrims[prim]
	if !ok {
		return nil, fmt.Errorf("unknown primitive %q", prim)
	}
	params := strings.Fields(p.params)
	if len(args) == len(params)-1 && params[len(params)-1][0] == 'd' {
		// An optional dtype left out is none.
		args = append(slices.Clone(args), "")
	}
	if len(args) != len(params) {
		names := make([]string, len(params))
		for i, par := range params {
			names[i] = par[2:]
		}
		return nil, fmt.Errorf("%s takes %d arguments (%s), not %d", prim, len(params), strings.Join(names, ", "), len(args))
	}
	for i, par := range params {
		ok := true
		switch par[0] {
		case 'b':
			_, ok = args[i].(BlockRV)
		case 'l':
			_, ok = args[i].(LoopRV)
		case 'L':
			_, ok = args[i].([]LoopRV)
		case 's':
			_, ok = args[i].(string)
		case 'i':
			_, ok = args[i].(int64)
		case 'n', 'N':
			_, ok = args[i].([]int64)
		case 'f':
			_, ok = args[i].([]float64)
		case 'm':
			m, isMap := args[i].(*IndexMap)
			ok = isMap && m != nil
		case 'x':
			_, ok = args[i].(BufferIndex)
		case 'p':
			_, ok = args[i].(*float64)
		case 'd':
			_, ok = args[i].(string)
		case 'v':
			switch args[i].(type) {
			case bool, int64, float64, string:
			default:
				ok = false
			}
		}
		if !ok {
			return nil, fmt.Errorf("%s: argument %d (%s) is %T", prim, i+1, par[2:], args[i])
		}
	}
	return p.run(s, args)
}

// A replayed primitive: its parameters, each kind:name (see read), and
// the call.
type replayPrim struct {
	params string
	run    func(s *Schedule, v []any) (any, error)
}

// noResult adapts a primitive that returns only an error.
func noResult(err error) (any, error) { return nil, err }

var replayPrims = map[string]replayPrim{
	"get_block":        {"s:name", func(s *Schedule, v []any) (any, error) { return s.GetBlock(v[0].(string)) }},
	"get_loops":        {"b:block", func(s *Schedule, v []any) (any, error) { return s.GetLoops(v[0].(BlockRV)) }},
	"get_child_blocks": {"l:block_or_loop", func(s *Schedule, v []any) (any, error) { return s.GetChildBlocks(v[0].(LoopRV)) }},
	"split":            {"l:loop N:factors", func(s *Schedule, v []any) (any, error) { return s.Split(v[0].(LoopRV), v[1].([]int64)...) }},
	"fuse":             {"L:loops", func(s *Schedule, v []any) (any, error) { return s.Fuse(v[0].([]LoopRV)...) }},
	"reorder":          {"L:loops", func(s *Schedule, v []any) (any, error) { return noResult(s.Reorder(v[0].([]LoopRV)...)) }},
	"parallel":         {"l:loop", func(s *Schedule, v []any) (any, error) { return noResult(s.Parallel(v[0].(LoopRV))) }},
	"vectorize":        {"l:loop", func(s *Schedule, v []any) (any, error) { return noResult(s.Vectorize(v[0].(LoopRV))) }},
	"unroll":           {"l:loop", func(s *Schedule, v []any) (any, error) { return noResult(s.Unroll(v[0].(LoopRV))) }},
	"bind":             {"l:loop s:thread_axis", func(s *Schedule, v []any) (any, error) { return noResult(s.Bind(v[0].(LoopRV), v[1].(string))) }},
	"annotate": {"l:block_or_loop s:ann_key v:ann_val", func(s *Schedule, v []any) (any, error) {
		return noResult(s.Annotate(v[0].(LoopRV), v[1].(string), v[2]))
	}},
	"cache_read": {"b:block i:read_buffer_index s:storage_scope", func(s *Schedule, v []any) (any, error) {
		return s.CacheRead(v[0].(BlockRV), int(v[1].(int64)), v[2].(string))
	}},
	"cache_write": {"b:block i:write_buffer_index s:storage_scope d:dtype", func(s *Schedule, v []any) (any, error) {
		if v[3].(string) == "" {
			return s.CacheWrite(v[0].(BlockRV), int(v[1].(int64)), v[2].(string))
		}
		dt, err := ndarray.ParseDType(v[3].(string))
		if err != nil {
			return nil, fmt.Errorf("cache_write: dtype: %w", err)
		}
		return s.CacheWriteDType(v[0].(BlockRV), int(v[1].(int64)), v[2].(string), dt)
	}},
	"compute_at": {"b:block l:loop", func(s *Schedule, v []any) (any, error) { return noResult(s.ComputeAt(v[0].(BlockRV), v[1].(LoopRV))) }},
	"reverse_compute_at": {"b:block l:loop", func(s *Schedule, v []any) (any, error) {
		return noResult(s.ReverseComputeAt(v[0].(BlockRV), v[1].(LoopRV)))
	}},
	"compute_inline":         {"b:block", func(s *Schedule, v []any) (any, error) { return noResult(s.ComputeInline(v[0].(BlockRV))) }},
	"reverse_compute_inline": {"b:block", func(s *Schedule, v []any) (any, error) { return noResult(s.ReverseComputeInline(v[0].(BlockRV))) }},
	"decompose_reduction": {"b:block l:loop", func(s *Schedule, v []any) (any, error) {
		return s.DecomposeReduction(v[0].(BlockRV), v[1].(LoopRV))
	}},
	"rfactor": {"l:loop i:factor_axis", func(s *Schedule, v []any) (any, error) { return s.RFactor(v[0].(LoopRV), int(v[1].(int64))) }},
	"set_scope": {"b:block i:buffer_index s:storage_scope", func(s *Schedule, v []any) (any, error) {
		return noResult(s.SetScope(v[0].(BlockRV), int(v[1].(int64)), v[2].(string)))
	}},
	"storage_align": {"b:block i:buffer_index i:axis i:factor i:offset", func(s *Schedule, v []any) (any, error) {
		return noResult(s.StorageAlign(v[0].(BlockRV), int(v[1].(int64)), int(v[2].(int64)), v[3].(int64), v[4].(int64)))
	}},
	"transform_layout": {"b:block x:buffer m:index_map p:pad_value", func(s *Schedule, v []any) (any, error) {
		return noResult(s.TransformLayout(v[0].(BlockRV), v[1].(BufferIndex), v[2].(*IndexMap), v[3].(*float64)))
	}},
	"transform_block_layout": {"b:block m:index_map", func(s *Schedule, v []any) (any, error) {
		return noResult(s.TransformBlockLayout(v[0].(BlockRV), v[1].(*IndexMap)))
	}},
	"split_overlap": {"l:loop N:factors", func(s *Schedule, v []any) (any, error) { return s.SplitOverlap(v[0].(LoopRV), v[1].([]int64)...) }},
	"split_overlap_tail": {"l:loop N:factors", func(s *Schedule, v []any) (any, error) {
		return s.SplitOverlapTail(v[0].(LoopRV), v[1].([]int64)...)
	}},
	"pad_einsum": {"b:block n:padding", func(s *Schedule, v []any) (any, error) { return noResult(s.PadEinsum(v[0].(BlockRV), v[1].([]int64))) }},
	"blockize":   {"l:target", func(s *Schedule, v []any) (any, error) { return s.Blockize(v[0].(LoopRV)) }},
	"tensorize": {"l:block_or_loop s:tensor_intrin", func(s *Schedule, v []any) (any, error) {
		return noResult(s.Tensorize(v[0].(LoopRV), v[1].(string)))
	}},
	"sample_perfect_tile": {"l:loop i:n i:max_innermost_factor n:decision", func(s *Schedule, v []any) (any, error) {
		_, err := s.SamplePerfectTile(nil, v[0].(LoopRV), int(v[1].(int64)), v[2].(int64), v[3].([]int64))
		return nil, err
	}},
	"sample_categorical": {"n:candidates f:probs i:decision", func(s *Schedule, v []any) (any, error) {
		_, err := s.SampleCategorical(nil, v[0].([]int64), v[1].([]float64), int(v[2].(int64)))
		return nil, err
	}},
}

// read decodes the arguments by the kinds of params: b a block, l a loop,
// L all the positional arguments as loops, s a string, i an integer, n a
// list of integers, N one with None for -1, f a list of numbers, m an
// index map, x a buffer index ("read", i), p an optional number, d an
// optional dtype (a string, "" when absent) and v an annotation value.
func (r *replayer) read(a *args, params string) ([]any, error) {
	var out []any
	for i, p := range strings.Fields(params) {
		kind, name := p[0], p[2:]
		var v any
		var err error
		switch kind {
		case 'b':
			v, err = r.block(a, i, name)
		case 'l':
			v, err = r.loop(a, i, name)
		case 'L':
			v, err = r.loops(a)
		case 's':
			v, err = a.str(i, name)
		case 'i':
			v, err = a.int(i, name)
		case 'n', 'N':
			v, err = a.ints(i, name, kind == 'N')
		case 'f':
			v, err = a.floats(i, name)
		case 'x':
			v, err = a.bufferIndex(i, name)
		case 'p':
			v, err = a.optFloat(i, name)
		case 'd':
			v = ""
			if a.has(i, name) {
				v, err = a.str(i, name)
			}
		case 'm':
			var x pyVal
			if x, err = a.get(i, name); err == nil && x.kind != 'm' {
				err = fmt.Errorf("%s: %s is %s, want a lambda", a.prim, name, x.describe())
			}
			v = x.index
		case 'v':
			v, err = a.annValue(i, name)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// annValue reads a bool, integer, float or string.
func (a *args) annValue(i int, name string) (any, error) {
	v, err := a.get(i, name)
	if err != nil {
		return nil, err
	}
	switch v.kind {
	case 'i':
		return v.num, nil
	case 'f':
		return v.flt, nil
	case 's':
		return v.str, nil
	case 'b':
		return v.str == "True", nil
	}
	return nil, fmt.Errorf("%s: %s %s is not a bool, integer, float or string", a.prim, name, v.describe())
}

// bufferIndex reads ("read", i) or ("write", i).
func (a *args) bufferIndex(i int, name string) (BufferIndex, error) {
	v, err := a.get(i, name)
	if err != nil {
		return BufferIndex{}, err
	}
	if v.kind != 'l' || len(v.list) != 2 || v.list[0].kind != 's' || v.list[1].kind != 'i' || v.list[0].str != "read" && v.list[0].str != "write" {
		return BufferIndex{}, fmt.Errorf("%s: %s is %s, want (\"read\", i) or (\"write\", i)", a.prim, name, v.describe())
	}
	return BufferIndex{Write: v.list[0].str == "write", Index: int(v.list[1].num)}, nil
}

// optFloat reads a number or None; absent is None.
func (a *args) optFloat(i int, name string) (*float64, error) {
	if !a.has(i, name) {
		return nil, nil
	}
	v, _ := a.get(i, name)
	switch v.kind {
	case '0':
		return nil, nil
	case 'i':
		f := float64(v.num)
		return &f, nil
	case 'f':
		return &v.flt, nil
	}
	return nil, fmt.Errorf("%s: %s is %s, want a number or None", a.prim, name, v.describe())
}
