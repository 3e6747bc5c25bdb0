package c

import (
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/transform"
)

// parallelPrelude is the part of the C prelude that runs outlined parallel
// loops: the launch variable the loader sets to its thread pool (see
// kiln_abi.h), the status a loop's chunks report a failure in, and the
// launch itself, serial where no pool was given.
const parallelPrelude = `
/* Set by the loader to its thread pool; NULL runs parallel loops serially. */
KILN_EXPORT KilnParallelLaunch kiln_parallel_launch = NULL;

/* kiln_parallel_status opens every parallel loop's closure: the message of
 * the first chunk that failed, copied from the thread that ran it. */
typedef struct {
  int32_t failed;
  char msg[sizeof kiln_error_buf_];
} kiln_parallel_status;

static inline void kiln_parallel_failed(void* closure) {
  kiln_parallel_status* st = (kiln_parallel_status*)closure;
  if (__atomic_exchange_n(&st->failed, 1, __ATOMIC_ACQ_REL) == 0) memcpy(st->msg, kiln_error_buf_, sizeof st->msg);
}

static inline int32_t kiln_parallel_run(KilnParallelFunc fn, void* closure, int64_t n) {
  if (n <= 0) return 0;
  KilnParallelLaunch launch = __atomic_load_n(&kiln_parallel_launch, __ATOMIC_ACQUIRE);
  return launch != NULL ? launch(fn, closure, n) : fn(0, n, closure);
}
`

// parallelFor prints parallel loop f outlined: its body becomes a static
// function over a range of iterations, which reads the variables the body
// uses from a closure, and the loop becomes a launch on the loader's pool.
// A parallel loop inside another runs serially in the outer one's chunk.
func (r *Renderer) parallelFor(f *ir.For) {
	if r.inParallel > 0 {
		r.line(r.ForHeader(f))
		r.loopBody(f)
		return
	}
	name := fmt.Sprintf("kiln_parallel_%s_%d", r.fn, r.nParallel)
	r.nParallel++
	free := freeVars(f)
	hasMin := !isZero(f.Min)

	// The closure and the loop's body, printed on their own.
	outer, outerIndent := r.b, r.indent
	r.b, r.indent = &strings.Builder{}, 0
	r.line(fmt.Sprintf("struct %s {", name))
	r.line("  kiln_parallel_status kiln_status;")
	if hasMin {
		r.line("  int64_t kiln_min;")
	}
	fields := make([]string, len(free))
	for i, v := range free {
		fields[i] = r.VarName(v)
		r.line(fmt.Sprintf("  %s %s;", r.closureType(v, false), fields[i]))
	}
	r.line("};")
	r.line(fmt.Sprintf("static int32_t %s_body(int64_t kiln_begin, int64_t kiln_end, struct %s* kiln_cl) {", name, name))
	r.indent++
	for i, v := range free {
		r.line(fmt.Sprintf("%s %s = kiln_cl->%s;", r.closureType(v, true), fields[i], fields[i]))
	}
	v, t := r.VarName(f.Var), r.Type(f.Var.Type)
	begin, end := "kiln_begin", "kiln_end"
	if hasMin {
		begin, end = "kiln_cl->kiln_min + kiln_begin", "kiln_cl->kiln_min + kiln_end"
	}
	if t != "int64_t" {
		begin, end = fmt.Sprintf("(%s)(%s)", t, begin), fmt.Sprintf("(%s)(%s)", t, end)
	}
	r.line(fmt.Sprintf("for (%s %s = %s; %s < %s; ++%s) {", t, v, begin, v, end, v))
	r.loopBody(f)
	r.line("return 0;")
	r.indent--
	r.line("}")
	r.line(fmt.Sprintf("static int32_t %s(int64_t kiln_begin, int64_t kiln_end, void* kiln_closure) {", name))
	r.line(fmt.Sprintf("  int32_t rc = %s_body(kiln_begin, kiln_end, (struct %s*)kiln_closure);", name, name))
	r.line("  if (rc != 0) kiln_parallel_failed(kiln_closure);")
	r.line("  return rc;")
	r.line("}")
	r.line("")
	r.outlined = append(r.outlined, r.b.String())
	r.b, r.indent = outer, outerIndent

	// The launch.
	r.line("{")
	r.indent++
	r.line(fmt.Sprintf("struct %s kiln_cl;", name))
	r.line("kiln_cl.kiln_status.failed = 0;")
	if hasMin {
		r.line(fmt.Sprintf("kiln_cl.kiln_min = %s;", r.Expr(f.Min)))
	}
	for _, fld := range fields {
		r.line(fmt.Sprintf("kiln_cl.%s = %s;", fld, fld))
	}
	r.line(fmt.Sprintf("if (kiln_parallel_run(%s, &kiln_cl, %s) != 0) { kiln_set_last_error(kiln_cl.kiln_status.msg); %s }",
		name, unparen(r.Expr(f.Extent)), r.d.Fail(transform.KeepLastError, false)))
	r.indent--
	r.line("}")
}

// closureType is the C type of free variable v in a closure (local: the
// variable the outlined body declares, restrict where the function's
// pointers are).
func (r *Renderer) closureType(v *ir.Var, local bool) string {
	if ir.IsHandle(v.Type) {
		if t, ok := r.ptrType[v]; ok {
			if local && r.noalias && r.d.Restrict != "" {
				return r.Type(t) + "* " + r.d.Restrict
			}
			return r.Type(t) + "*"
		}
	}
	return r.Type(v.Type)
}

// freeVars returns the variables loop f's body reads that the body does not
// define (f's own variable excluded), in order of first use: what its
// outlined function takes from the closure. Buffers are read through their
// data variables; an AttrStmt's node and value are not printed, so they
// need nothing.
func freeVars(f *ir.For) []*ir.Var {
	defined := map[*ir.Var]bool{f.Var: true}
	seen := map[*ir.Var]bool{}
	var used []*ir.Var
	use := func(v *ir.Var) {
		if !seen[v] {
			seen[v] = true
			used = append(used, v)
		}
	}
	var visit func(ir.Node) bool
	visit = func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.Var:
			use(n)
		case *ir.BufferLoad:
			use(n.Buffer.Data)
		case *ir.BufferStore:
			use(n.Buffer.Data)
		case *ir.For:
			defined[n.Var] = true
		case *ir.LetStmt:
			defined[n.Var] = true
		case *ir.Let:
			defined[n.Var] = true
		case *ir.Allocate:
			defined[n.Buffer.Data] = true
		case *ir.AttrStmt:
			ir.Visit(n.Body, visit)
			return false
		}
		return true
	}
	ir.Visit(f.Body, visit)
	free := used[:0]
	for _, v := range used {
		if !defined[v] {
			free = append(free, v)
		}
	}
	return free
}
