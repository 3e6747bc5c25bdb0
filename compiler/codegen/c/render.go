package c

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/ndarray"
)

// maxStackBytes bounds an allocation placed on the stack; larger or
// dynamically sized ones use the heap.
const maxStackBytes = 64 << 10

// Renderer prints lowered functions in a Dialect. It collects the vector
// types and helpers the functions need, which Source prints before them.
type Renderer struct {
	d Dialect

	// Module-wide state.
	vecTypes map[ir.DType]bool // vector types used, with their helpers
	vecMath  map[string]bool   // vector math helpers used ("exp float32x16")
	vecLoad2 map[ir.DType]bool // vector types loaded with a stride of 2
	vecLoadR map[ir.DType]bool // vector types loaded into registers (see vectorRegisterDecl)
	funcs    strings.Builder
	externs  map[string]bool // the module's own functions, which call_extern may call

	// Per-function state.
	fn         string
	b          *strings.Builder
	indent     int
	names      map[*ir.Var]string
	used       map[string]bool
	ptrType    map[*ir.Var]ir.DType       // element type of each data pointer
	promoted   map[*ir.Var]map[int64]slot // local buffers kept in variables
	noalias    bool
	inParallel int
	inRegister int      // loops annotated ir.AttrVectorLoadsInRegisters around the statement printed
	nParallel  int      // parallel loops outlined so far
	outlined   []string // their closures and functions, printed before fn
	heap       []string // heap allocations live here, freed by a return
	err        error
}

// NewRenderer returns a renderer for dialect d.
func NewRenderer(d Dialect) *Renderer {
	if d.Fail == nil {
		d.Fail = cFail
	}
	return &Renderer{d: d, vecTypes: map[ir.DType]bool{}, vecLoad2: map[ir.DType]bool{}, vecLoadR: map[ir.DType]bool{}}
}

// Func renders one lowered function, exported as name. Errors name the
// function and the node that cannot be printed.
func (r *Renderer) Func(name string, f *ir.PrimFunc) error {
	r.fn = name
	r.b = &strings.Builder{}
	r.nParallel = 0
	r.outlined = nil
	r.indent = 0
	r.names = map[*ir.Var]string{}
	r.used = map[string]bool{}
	r.ptrType = map[*ir.Var]ir.DType{}
	r.promoted = map[*ir.Var]map[int64]slot{}
	r.inParallel = 0
	r.heap = nil
	r.err = nil
	r.noalias, _ = f.Attrs[ir.AttrNoAlias].(bool)
	r.scanPointers(f.Body)

	var sig string
	var err error
	if r.d.Signature != nil {
		sig, err = r.d.Signature(r, name, f)
	} else {
		sig, err = r.packedSignature(name, f)
	}
	if err != nil {
		return fmt.Errorf("function %q: %w", name, err)
	}
	r.line(sig)
	r.indent++
	r.stmt(f.Body)
	if r.d.Return != "" {
		r.line(r.d.Return)
	} else {
		r.line("return 0;")
	}
	r.indent--
	r.line("}")
	if r.err != nil {
		return fmt.Errorf("function %q: %w", name, r.err)
	}
	for _, o := range r.outlined {
		r.funcs.WriteString(o)
	}
	r.funcs.WriteString(r.b.String())
	r.funcs.WriteString("\n")
	return nil
}

// Source returns the functions rendered so far, after the vector types
// they use.
func (r *Renderer) Source() string {
	return r.vectorDecls() + r.funcs.String()
}

func (r *Renderer) packedSignature(name string, f *ir.PrimFunc) (string, error) {
	if f.Attrs[transform.AttrCallingConv] != transform.CallingConvPacked || (len(f.Params) != 3 && len(f.Params) != 5) {
		return "", fmt.Errorf("no packed API: run transform.MakePackedAPI (lower the function) first")
	}
	if len(f.Params) == 5 {
		// A function with a result: TVM's ret_value and ret_tcode.
		return fmt.Sprintf("KILN_EXPORT int32_t %s(KilnValue* %s, int32_t* %s, int32_t %s, KilnValue* %s, int32_t* %s) {",
			name, r.VarName(f.Params[0]), r.VarName(f.Params[1]), r.VarName(f.Params[2]), r.VarName(f.Params[3]), r.VarName(f.Params[4])), nil
	}
	return fmt.Sprintf("KILN_EXPORT int32_t %s(KilnValue* %s, int32_t* %s, int32_t %s) {",
		name, r.VarName(f.Params[0]), r.VarName(f.Params[1]), r.VarName(f.Params[2])), nil
}

// scanPointers records the element type of each data variable from the
// buffers that use it (an allocation's own buffer wins).
func (r *Renderer) scanPointers(s ir.Stmt) {
	ir.Visit(s, func(n ir.Node) bool {
		var b *ir.Buffer
		switch n := n.(type) {
		case *ir.Allocate:
			r.ptrType[n.Buffer.Data] = n.Buffer.DType
			return true
		case *ir.BufferLoad:
			b = n.Buffer
		case *ir.BufferStore:
			b = n.Buffer
		case *ir.DeclBuffer:
			b = n.Buffer
		}
		if b != nil {
			if _, ok := r.ptrType[b.Data]; !ok {
				r.ptrType[b.Data] = b.DType
			}
		}
		return true
	})
}

func (r *Renderer) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
}

func (r *Renderer) line(s string) {
	r.b.WriteString(strings.Repeat("  ", r.indent))
	r.b.WriteString(s)
	r.b.WriteByte('\n')
}

var cKeywords = map[string]bool{
	"auto": true, "break": true, "case": true, "char": true, "const": true, "continue": true, "default": true,
	"do": true, "double": true, "else": true, "enum": true, "extern": true, "float": true, "for": true,
	"goto": true, "if": true, "inline": true, "int": true, "long": true, "register": true, "restrict": true,
	"return": true, "short": true, "signed": true, "sizeof": true, "static": true, "struct": true,
	"switch": true, "typedef": true, "union": true, "unsigned": true, "void": true, "volatile": true,
	"while": true, "bool": true, "true": true, "false": true, "main": true, "errno": true,
}

// VarName returns the C identifier of v, unique in the function.
func (r *Renderer) VarName(v *ir.Var) string {
	if n, ok := r.names[v]; ok {
		return n
	}
	var sb strings.Builder
	for i, c := range v.Name {
		ok := c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && c >= '0' && c <= '9')
		if ok {
			sb.WriteRune(c)
		} else {
			sb.WriteByte('_')
		}
	}
	base := sb.String()
	if base == "" {
		base = "v"
	}
	if cKeywords[base] || strings.HasPrefix(base, "kiln_") || strings.HasPrefix(base, "KILN_") || strings.HasSuffix(base, "_") {
		base = "v_" + base
	}
	n := base
	for i := 1; r.used[n]; i++ {
		n = base + "_" + strconv.Itoa(i)
	}
	r.used[n] = true
	r.names[v] = n
	return n
}

// Type returns the C type of a scalar or vector dtype.
func (r *Renderer) Type(t ir.DType) string {
	if t.Lanes > 1 {
		r.useVector(t)
		return t.String()
	}
	switch t.Code {
	case ndarray.Int:
		return fmt.Sprintf("int%d_t", t.Bits)
	case ndarray.UInt:
		if t.Bits == 1 {
			return "bool"
		}
		return fmt.Sprintf("uint%d_t", t.Bits)
	case ndarray.BFloat:
		if r.d.BFloat16 && t.Bits == 16 {
			return bfloat16Type
		}
	case ndarray.Float:
		switch t.Bits {
		case 16:
			return "_Float16"
		case 32:
			return "float"
		case 64:
			return "double"
		}
	case ndarray.Float8E4M3, ndarray.Float8E5M2:
		if r.d.Float8 {
			return Float8Type(t)
		}
	case ndarray.Bool:
		return "bool"
	case ndarray.Handle:
		return "void*"
	}
	r.fail("dtype %s has no C type", t)
	return "void"
}

// useVector records vector type t (and the integer mask type of the same
// shape, used by min and max).
func (r *Renderer) useVector(t ir.DType) {
	if r.vecTypes[t] {
		return
	}
	s := t.Scalar()
	if !(s.IsFloat() || s.IsInt()) || (s.Code == ndarray.BFloat && !r.d.BFloat16) || (s.IsFloat8() && !r.d.Float8) || t.Lanes&(t.Lanes-1) != 0 {
		r.fail("no C vector type for %s", t)
		return
	}
	r.vecTypes[t] = true
	if mask := maskType(t); mask != t {
		r.useVector(mask)
	}
}

func maskType(t ir.DType) ir.DType {
	return ir.DType{Code: ndarray.Int, Bits: t.Bits, Lanes: t.Lanes}
}

// vectorRegisterDecl defines KILN_IN_REGISTER_N(v), which kiln_vload_reg_T
// applies to the vector of N bytes it loads: on x86-64, where the ISA
// compiled for has registers of N bytes, an empty asm that takes and
// gives the vector in a register, so that the vector stays one load in
// a register however many operations use it; elsewhere nothing (a
// register constraint on a vector wider than the registers would not
// hold it). Loads in a loop annotated ir.AttrVectorLoadsInRegisters use
// it. Without it GCC may fold a load that several multiply-adds share
// into each of them as a memory operand (its tuning for AMD Zen does),
// a load per use where the schedule meant one.
const vectorRegisterDecl = `#if defined(__x86_64__) && defined(__AVX512F__)
#define KILN_IN_REGISTER_64(v) __asm__("" : "+v"(v))
#define KILN_IN_REGISTER_32(v) __asm__("" : "+v"(v))
#define KILN_IN_REGISTER_16(v) __asm__("" : "+v"(v))
#elif defined(__x86_64__) && defined(__AVX__)
#define KILN_IN_REGISTER_32(v) __asm__("" : "+x"(v))
#define KILN_IN_REGISTER_16(v) __asm__("" : "+x"(v))
#elif defined(__x86_64__) && defined(__SSE2__)
#define KILN_IN_REGISTER_16(v) __asm__("" : "+x"(v))
#endif
#ifndef KILN_IN_REGISTER_64
#define KILN_IN_REGISTER_64(v) ((void)0)
#endif
#ifndef KILN_IN_REGISTER_32
#define KILN_IN_REGISTER_32(v) ((void)0)
#endif
#ifndef KILN_IN_REGISTER_16
#define KILN_IN_REGISTER_16(v) ((void)0)
#endif
`

// vectorBytes is the size of vector type t in bytes.
func vectorBytes(t ir.DType) int { return int(t.Lanes) * int(t.Bits) / 8 }

// vectorDecls prints the typedefs and helpers of the vector types used.
func (r *Renderer) vectorDecls() string {
	ts := make([]ir.DType, 0, len(r.vecTypes))
	for t := range r.vecTypes {
		ts = append(ts, t)
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].String() < ts[j].String() })
	var b strings.Builder
	if r.d.VectorDecl != nil {
		for _, t := range ts {
			b.WriteString(r.d.VectorDecl(t, r.Type(t.Scalar())))
		}
		return b.String()
	}
	for _, t := range ts {
		name, elem := t.String(), r.Type(t.Scalar())
		fmt.Fprintf(&b, "typedef %s %s __attribute__((vector_size(%d)));\n", elem, name, vectorBytes(t))
	}
	if len(r.vecLoadR) > 0 {
		b.WriteString(vectorRegisterDecl)
	}
	for _, t := range ts {
		name, elem := t.String(), r.Type(t.Scalar())
		fmt.Fprintf(&b, "static inline %s kiln_vload_%s(const %s* p) { %s v; __builtin_memcpy(&v, p, sizeof v); return v; }\n", name, name, elem, name)
		fmt.Fprintf(&b, "static inline void kiln_vstore_%s(%s* p, %s v) { __builtin_memcpy(p, &v, sizeof v); }\n", name, elem, name)
		lanes := make([]string, t.Lanes)
		for i := range lanes {
			lanes[i] = "x"
		}
		fmt.Fprintf(&b, "static inline %s kiln_bcast_%s(%s x) { return (%s){%s}; }\n", name, name, elem, name, strings.Join(lanes, ", "))
		m := maskType(t).String()
		fmt.Fprintf(&b, "static inline %s kiln_vmin_%s(%s a, %s b) { %s m = a < b; return (%s)((m & (%s)a) | (~m & (%s)b)); }\n", name, name, name, name, m, name, m, m)
		fmt.Fprintf(&b, "static inline %s kiln_vmax_%s(%s a, %s b) { %s m = a > b; return (%s)((m & (%s)a) | (~m & (%s)b)); }\n", name, name, name, name, m, name, m, m)
		if r.vecLoad2[t] {
			b.WriteString(load2Decl(t, name, elem))
		}
		if r.vecLoadR[t] {
			pin := "" // other sizes: a plain load
			if size := vectorBytes(t); size == 16 || size == 32 || size == 64 {
				pin = fmt.Sprintf(" KILN_IN_REGISTER_%d(v);", size)
			}
			fmt.Fprintf(&b, "static inline %s kiln_vload_reg_%s(const %s* p) { %s v; __builtin_memcpy(&v, p, sizeof v);%s return v; }\n", name, name, elem, name, pin)
		}
	}
	b.WriteString(r.vectorMathDecls())
	return b.String()
}

// stmt prints a statement.
func (r *Renderer) stmt(s ir.Stmt) {
	switch s := s.(type) {
	case nil:
	case *ir.SeqStmt:
		for _, c := range s.Seq {
			r.stmt(c)
		}
	case *ir.For:
		r.forStmt(s)
	case *ir.BufferStore:
		r.store(s)
	case *ir.Allocate:
		r.allocate(s)
	case *ir.DeclBuffer:
		r.stmt(s.Body)
	case *ir.IfThenElse:
		r.line("if (" + unparen(r.Expr(s.Cond)) + ") {")
		r.indent++
		r.stmt(s.Then)
		r.indent--
		for s.Else != nil {
			if elif, ok := s.Else.(*ir.IfThenElse); ok {
				r.line("} else if (" + unparen(r.Expr(elif.Cond)) + ") {")
				r.indent++
				r.stmt(elif.Then)
				r.indent--
				s = elif
				continue
			}
			r.line("} else {")
			r.indent++
			r.stmt(s.Else)
			r.indent--
			break
		}
		r.line("}")
	case *ir.LetStmt:
		r.letStmt(s)
	case *ir.Evaluate:
		if v := ir.RetValue(s); v != nil {
			if r.inParallel > 0 {
				r.fail("return inside a parallel loop")
				return
			}
			for i := len(r.heap) - 1; i >= 0; i-- {
				r.line("free(" + r.heap[i] + ");")
			}
			r.line("return " + unparen(r.Expr(v)) + ";")
			return
		}
		switch s.Value.(type) {
		case *ir.IntImm, *ir.FloatImm:
			return
		}
		r.line(r.Expr(s.Value) + ";")
	case *ir.AttrStmt:
		r.stmt(s.Body)
	case *ir.AssertStmt:
		r.line("if (!(" + unparen(r.Expr(s.Cond)) + ")) " + r.d.Fail(s.Message, r.inParallel > 0))
	case *ir.BlockRealize:
		r.fail("block %q was not lowered: run transform.Lower first", s.Block.Name)
	default:
		r.fail("cannot print statement %T", s)
	}
}

func (r *Renderer) forStmt(f *ir.For) {
	if on, _ := f.Annotations[ir.AttrVectorLoadsInRegisters].(bool); on {
		r.inRegister++
		defer func() { r.inRegister-- }()
	}
	if f.Kind != ir.ForSerial {
		if r.d.Loop != nil {
			lines, handled, err := r.d.Loop(r, f)
			if err != nil {
				r.fail("%v", err)
				return
			}
			if handled {
				for _, l := range lines {
					r.line(l)
				}
				r.loopBody(f)
				return
			}
		}
	}
	switch f.Kind {
	case ir.ForParallel:
		r.parallelFor(f)
		return
	case ir.ForUnrolled:
		n := int64(8)
		if e, ok := ir.IsConstInt(f.Extent); ok && e > 0 && e < 65536 {
			n = e
		}
		r.line(fmt.Sprintf("#pragma GCC unroll %d", n))
	case ir.ForVectorized:
		r.line("#pragma GCC ivdep")
	case ir.ForThreadBinding:
		r.fail("loop %q is bound to thread axis %q, which target %q cannot run", f.Var.Name, f.ThreadTag, r.d.Name)
		return
	}
	r.line(r.ForHeader(f))
	r.loopBody(f)
}

// ForHeader returns "for (T v = min; v < end; ++v) {" for loop f.
func (r *Renderer) ForHeader(f *ir.For) string {
	v := r.VarName(f.Var)
	end := r.Expr(f.Extent)
	if !isZero(f.Min) {
		end = r.Expr(ir.Add(f.Min, f.Extent))
	}
	return fmt.Sprintf("for (%s %s = %s; %s < %s; ++%s) {", r.Type(f.Var.Type), v, r.Expr(f.Min), v, end, v)
}

func (r *Renderer) loopBody(f *ir.For) {
	par := f.Kind == ir.ForParallel
	if par {
		r.inParallel++
	}
	r.indent++
	r.stmt(f.Body)
	r.indent--
	if par {
		r.inParallel--
	}
	r.line("}")
}

func isZero(e ir.Expr) bool {
	v, ok := ir.IsConstInt(e)
	return ok && v == 0
}

func (r *Renderer) allocate(a *ir.Allocate) {
	b := a.Buffer
	if slots := registerSlots(b, a.Body); slots != nil {
		r.promote(b, slots)
		r.stmt(a.Body)
		return
	}
	if r.d.Allocate != nil {
		decl, handled, err := r.d.Allocate(r, b)
		if err != nil {
			r.fail("%v", err)
			return
		}
		if handled {
			r.line(decl)
			r.stmt(a.Body)
			return
		}
	}
	name := r.VarName(b.Data)
	elem := r.Type(b.DType)
	var count ir.Expr = ir.I64(1)
	for _, s := range b.Shape {
		count = ir.Mul(count, ir.NewCast(ir.Int64, s))
	}
	if n, ok := constCount(b); ok && n*int64(b.DType.Size()) <= maxStackBytes {
		r.line(fmt.Sprintf("%s %s[%d] __attribute__((aligned(64)));", elem, name, max(n, 1)))
		r.stmt(a.Body)
		return
	}
	bytes := r.Expr(ir.Mul(count, ir.I64(int64(b.DType.Size()))))
	r.line("{")
	r.indent++
	r.line(fmt.Sprintf("%s* %s = (%s*)kiln_alloc(%s);", elem, name, elem, bytes))
	r.line(fmt.Sprintf("if (%s == NULL) %s", name, r.d.Fail(fmt.Sprintf("%s: out of memory allocating %q", r.fn, b.Name), r.inParallel > 0)))
	r.heap = append(r.heap, name)
	r.stmt(a.Body)
	r.heap = r.heap[:len(r.heap)-1]
	r.line(fmt.Sprintf("free(%s);", name))
	r.indent--
	r.line("}")
}

// slot is one variable holding part of a local buffer kept in registers:
// lanes elements from its base index.
type slot struct {
	name  string
	lanes int
}

// maxRegisterSlots bounds the variables one local buffer becomes.
const maxRegisterSlots = 256

// registerSlots decides whether a "local" allocation can live in
// variables instead of memory (scalar replacement): its size is constant,
// and every access under body is at a constant index, or a stride-1 ramp
// with a constant base, with no two accesses overlapping partly. It
// returns the accessed slots (base index → lanes), or nil. GCC then keeps
// such a buffer, a register-blocked accumulator tile for one, in vector
// registers instead of loading and storing it around every use.
func registerSlots(b *ir.Buffer, body ir.Stmt) map[int64]int {
	if b.Scope != "local" || len(b.Shape) != 1 {
		return nil
	}
	size, ok := constCount(b)
	if !ok || size == 0 {
		return nil
	}
	slots := map[int64]int{}
	ok = true
	access := func(buf *ir.Buffer, idx []ir.Expr) {
		if buf.DType != b.DType || len(idx) != 1 {
			ok = false
			return
		}
		base, lanes := int64(0), 1
		switch e := idx[0].(type) {
		case *ir.IntImm:
			base = e.Value
		case *ir.Ramp:
			c, isConst := ir.IsConstInt(e.Base)
			if !isConst || !isOne(e.Stride) {
				ok = false
				return
			}
			base, lanes = c, e.Lanes
		default:
			ok = false
			return
		}
		if base < 0 || base+int64(lanes) > size {
			ok = false
			return
		}
		if l, seen := slots[base]; seen && l != lanes {
			ok = false
			return
		}
		slots[base] = lanes
	}
	ir.Visit(body, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.BufferLoad:
			if n.Buffer.Data == b.Data {
				access(n.Buffer, n.Indices)
			}
		case *ir.BufferStore:
			if n.Buffer.Data == b.Data {
				access(n.Buffer, n.Indices)
			}
		case *ir.DeclBuffer:
			ok = ok && n.Buffer.Data != b.Data
		case *ir.Var:
			ok = ok && n != b.Data
		case *ir.For:
			// A parallel loop's body is outlined into a function of its
			// own, which reaches the buffer through its pointer.
			ok = ok && n.Kind != ir.ForParallel
		}
		return ok
	})
	if !ok || len(slots) == 0 || len(slots) > maxRegisterSlots {
		return nil
	}
	bases := make([]int64, 0, len(slots))
	for base := range slots {
		bases = append(bases, base)
	}
	sort.Slice(bases, func(i, j int) bool { return bases[i] < bases[j] })
	for i := 1; i < len(bases); i++ {
		if bases[i-1]+int64(slots[bases[i-1]]) > bases[i] {
			return nil // partial overlap
		}
	}
	return slots
}

// promote declares one zero-initialised variable per slot of b and makes
// loads and stores of b use them.
func (r *Renderer) promote(b *ir.Buffer, slots map[int64]int) {
	bases := make([]int64, 0, len(slots))
	for base := range slots {
		bases = append(bases, base)
	}
	sort.Slice(bases, func(i, j int) bool { return bases[i] < bases[j] })
	vars := make(map[int64]slot, len(slots))
	for _, base := range bases {
		lanes := slots[base]
		name := r.VarName(ir.NewVar(fmt.Sprintf("%s_%d", b.Name, base), ir.Handle))
		t := b.DType.WithLanes(lanes)
		init := "0"
		if lanes > 1 {
			init = "{0}"
		}
		r.line(fmt.Sprintf("%s %s = %s;", r.Type(t), name, init))
		vars[base] = slot{name: name, lanes: lanes}
	}
	r.promoted[b.Data] = vars
}

// promotedSlot returns the variable of a promoted buffer's access.
func (r *Renderer) promotedSlot(b *ir.Buffer, idx ir.Expr) (string, bool) {
	vars, ok := r.promoted[b.Data]
	if !ok {
		return "", false
	}
	base, isConst := ir.IsConstInt(idx)
	if ramp, isRamp := idx.(*ir.Ramp); isRamp {
		base, isConst = ir.IsConstInt(ramp.Base)
	}
	v, found := vars[base]
	if !isConst || !found {
		r.fail("access to %q at %s, which is not one of its variables", b.Name, idx)
		return "0", true
	}
	return v.name, true
}

func constCount(b *ir.Buffer) (int64, bool) {
	n := int64(1)
	for _, s := range b.Shape {
		v, ok := ir.IsConstInt(s)
		if !ok || v < 0 || (v > 0 && n > math.MaxInt64/v) {
			return 0, false
		}
		n *= v
	}
	return n, true
}

func (r *Renderer) letStmt(s *ir.LetStmt) {
	name := r.VarName(s.Var)
	val := r.Expr(s.Value)
	if ir.IsHandle(s.Var.Type) {
		if t, ok := r.ptrType[s.Var]; ok {
			elem := r.Type(t)
			restrict := ""
			if r.noalias && r.d.Restrict != "" {
				restrict = " " + r.d.Restrict
			}
			r.line(fmt.Sprintf("%s*%s %s = (%s*)%s;", elem, restrict, name, elem, val))
			r.stmt(s.Body)
			return
		}
	}
	r.line(fmt.Sprintf("%s %s = %s;", r.Type(s.Var.Type), name, val))
	r.stmt(s.Body)
}

// pointer returns the C expression of buffer b's data as a pointer to its
// element type.
func (r *Renderer) pointer(b *ir.Buffer) string {
	p := r.VarName(b.Data)
	if t, ok := r.ptrType[b.Data]; !ok || t != b.DType {
		return fmt.Sprintf("((%s*)%s)", r.Type(b.DType), p)
	}
	return p
}

func (r *Renderer) store(s *ir.BufferStore) {
	if len(s.Indices) != 1 {
		r.fail("store to %q has %d indices: run transform.FlattenBuffers first", s.Buffer.Name, len(s.Indices))
		return
	}
	if name, ok := r.promotedSlot(s.Buffer, s.Indices[0]); ok {
		r.line(fmt.Sprintf("%s = %s;", name, r.Expr(s.Value)))
		return
	}
	p := r.pointer(s.Buffer)
	idx := s.Indices[0]
	val := r.Expr(s.Value)
	vt := s.Value.DType()
	if idx.DType().Lanes == 1 {
		if vt.Lanes != 1 {
			r.fail("store of vector %s at scalar index into %q", vt, s.Buffer.Name)
			return
		}
		r.line(fmt.Sprintf("%s[%s] = %s;", p, r.Expr(idx), val))
		return
	}
	ramp, ok := idx.(*ir.Ramp)
	if !ok {
		r.fail("store into %q at vector index %s: only ramps are supported", s.Buffer.Name, idx)
		return
	}
	if isOne(ramp.Stride) {
		r.line(fmt.Sprintf("kiln_vstore_%s(&%s[%s], %s);", r.Type(vt), p, r.Expr(ramp.Base), val))
		return
	}
	// Scatter, lane by lane.
	it := r.Type(ramp.Base.DType())
	r.line(fmt.Sprintf("{ %s v_ = %s; %s b_ = %s, s_ = %s;", r.Type(vt), val, it, r.Expr(ramp.Base), r.Expr(ramp.Stride)))
	for i := 0; i < ramp.Lanes; i++ {
		r.line(fmt.Sprintf("  %s[b_ + %d * s_] = v_[%d];", p, i, i))
	}
	r.line("}")
}

// unparen drops one pair of parentheses around all of s.
func unparen(s string) string {
	if len(s) < 2 || s[0] != '(' || s[len(s)-1] != ')' {
		return s
	}
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 && i != len(s)-1 {
				return s
			}
		case '"', '\'':
			return s
		}
	}
	return s[1 : len(s)-1]
}

func isOne(e ir.Expr) bool {
	v, ok := ir.IsConstInt(e)
	return ok && v == 1
}
