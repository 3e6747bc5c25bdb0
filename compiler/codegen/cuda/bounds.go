package cuda

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/arith"
	"github.com/kiln-ml/kiln/compiler/ir"
)

// checkBounds refuses a kernel that provably reads or writes outside a
// buffer of constant size: an access no condition guards, whose index is
// an affine function (sums of loop variables times constants) of loops
// with constant ranges, and whose range over those loops, which it
// reaches exactly, leaves the buffer. Everything else (guarded accesses,
// symbolic sizes, indices through division, modulo or loads) is left to
// the schedule.
func checkBounds(kernel string, f *ir.PrimFunc) error {
	bc := &boundsChecker{kernel: kernel, an: arith.NewAnalyzer(), ranged: map[*ir.Var]bool{}}
	bc.stmt(f.Body, false)
	return bc.err
}

type boundsChecker struct {
	kernel string
	an     *arith.Analyzer
	ranged map[*ir.Var]bool // loop variables with constant ranges
	err    error
}

func (bc *boundsChecker) stmt(s ir.Stmt, guarded bool) {
	if bc.err != nil || s == nil {
		return
	}
	switch n := s.(type) {
	case *ir.For:
		bc.expr(n.Min, guarded)
		bc.expr(n.Extent, guarded)
		_, minOK := ir.IsConstInt(n.Min)
		ext, extOK := ir.IsConstInt(n.Extent)
		if minOK && extOK && ext > 0 {
			bc.an.Bind(n.Var, ir.Range{Min: n.Min, Extent: n.Extent})
			bc.ranged[n.Var] = true
		}
		bc.stmt(n.Body, guarded)
	case *ir.SeqStmt:
		for _, c := range n.Seq {
			bc.stmt(c, guarded)
		}
	case *ir.IfThenElse:
		bc.expr(n.Cond, guarded)
		bc.stmt(n.Then, true)
		bc.stmt(n.Else, true)
	case *ir.LetStmt:
		bc.expr(n.Value, guarded)
		bc.stmt(n.Body, guarded)
	case *ir.Allocate:
		bc.stmt(n.Body, guarded)
	case *ir.DeclBuffer:
		bc.stmt(n.Body, guarded)
	case *ir.AttrStmt:
		bc.stmt(n.Body, guarded)
	case *ir.AssertStmt:
		bc.expr(n.Cond, guarded)
	case *ir.Evaluate:
		bc.expr(n.Value, guarded)
	case *ir.BufferStore:
		bc.access(n.Buffer, n.Indices, true, guarded)
		for _, i := range n.Indices {
			bc.expr(i, guarded)
		}
		bc.expr(n.Value, guarded)
	}
}

// expr checks the loads of e; those under a conditional expression are
// guarded.
func (bc *boundsChecker) expr(e ir.Expr, guarded bool) {
	if e == nil || bc.err != nil {
		return
	}
	ir.Visit(e, func(n ir.Node) bool {
		if bc.err != nil {
			return false
		}
		switch n := n.(type) {
		case *ir.Select:
			bc.expr(n.Cond, guarded)
			bc.expr(n.True, true)
			bc.expr(n.False, true)
			return false
		case *ir.Call:
			if n.Op == ir.OpIfThenElse && len(n.Args) == 3 {
				bc.expr(n.Args[0], guarded)
				bc.expr(n.Args[1], true)
				bc.expr(n.Args[2], true)
				return false
			}
		case *ir.BufferLoad:
			bc.access(n.Buffer, n.Indices, false, guarded)
		}
		return true
	})
}

func (bc *boundsChecker) access(b *ir.Buffer, idx []ir.Expr, write, guarded bool) {
	bc.aligned(b, idx)
	if bc.err != nil || guarded || len(idx) != 1 || len(b.Shape) != 1 || idx[0].DType().Lanes > 1 {
		return
	}
	size, ok := ir.IsConstInt(b.Shape[0])
	if !ok || !bc.affine(idx[0]) {
		return
	}
	lo, hi := bc.an.ConstIntBound(idx[0])
	if lo >= 0 && hi < size {
		return
	}
	what, verb := "reads", "read"
	if write {
		what, verb = "writes", "write"
	}
	bad := hi
	if lo < 0 {
		bad = lo
	}
	bc.err = fmt.Errorf("kernel %q %s %q at %s, which reaches %d: outside its %d elements (a %s out of bounds in every launch; guard it, e.g. with T.where)", bc.kernel, what, b.Name, idx[0], bad, size, verb)
}

// aligned refuses a vector access (a load or store at a ramp of
// consecutive elements, one vector instruction: ld.global.v4.f32 for four
// float32) whose address is not provably a multiple of the vector's size:
// its first index, plus the buffer's elem_offset, must be a multiple of
// the lanes (buffers themselves start 16-byte aligned: CUDA's allocations,
// and the shared and local arrays the generator aligns). A misaligned
// vector access faults on the GPU; the error names the kernel, the buffer
// and the index.
func (bc *boundsChecker) aligned(b *ir.Buffer, idx []ir.Expr) {
	if len(idx) != 1 {
		return
	}
	r, ok := idx[0].(*ir.Ramp)
	if !ok || !isOne(r.Stride) || r.Lanes < 2 {
		return
	}
	lanes := int64(r.Lanes)
	bytes := lanes * int64(b.DType.Bits) / 8
	if !bc.an.CanProveDivisible(r.Base, lanes) {
		bc.err = fmt.Errorf("kernel %q: vector access to %q at %s is not provably aligned to its %d bytes (the first index must be a multiple of %d); align the schedule or do not vectorize the loop", bc.kernel, b.Name, idx[0], bytes, lanes)
		return
	}
	if b.ElemOffset != nil && !bc.an.CanProveDivisible(b.ElemOffset, lanes) {
		bc.err = fmt.Errorf("kernel %q: vector access to %q is not provably aligned to its %d bytes: the buffer's elem_offset %s is not a multiple of %d; align the buffer or do not vectorize the loop", bc.kernel, b.Name, bytes, b.ElemOffset, lanes)
	}
}

// affine reports an index built from constants, loop variables with
// constant ranges, +, - and multiplication by constants: its bounds over
// independent loops are exact.
func (bc *boundsChecker) affine(e ir.Expr) bool {
	switch n := e.(type) {
	case *ir.IntImm:
		return true
	case *ir.Var:
		return bc.ranged[n]
	case *ir.Cast:
		return n.Type.Code == n.Value.DType().Code && n.Type.Bits >= n.Value.DType().Bits && bc.affine(n.Value)
	case *ir.Binary:
		switch n.Op {
		case ir.OpAdd, ir.OpSub:
			return bc.affine(n.A) && bc.affine(n.B)
		case ir.OpMul:
			_, ca := ir.IsConstInt(n.A)
			_, cb := ir.IsConstInt(n.B)
			return (ca && bc.affine(n.B)) || (cb && bc.affine(n.A))
		}
	}
	return false
}
