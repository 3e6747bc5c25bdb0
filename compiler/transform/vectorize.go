package transform

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// maxVectorBytes bounds the size of one vector value the C code generator
// is asked to handle (GCC splits wide generic vectors into native ones).
const maxVectorBytes = 512

// Vectorize replaces each vectorized loop of constant extent L by its body
// computed on L-lane vectors: the loop variable becomes Ramp(min, 1, L),
// loop-invariant operands are broadcast, and loads and stores indexed by a
// ramp become vector loads and stores. The code generators print such
// expressions with explicit vector types.
//
// Vectors wider than the target's native vectors (AttrVectorBytes, else
// DefaultVectorBytes) are not made: an L-lane loop becomes an unrolled
// loop over L/N pieces, each computed on N-lane native vectors, so that a
// register-blocked tile's accumulators stay in registers.
//
// Calls of the math intrinsics in VectorMath on float32 become calls on
// vectors when the function names its target's vector width
// (AttrVectorBytes, which CPU builds set): the C code generator computes
// them inline on vectors (a polynomial, as TVM's fast_exp) instead of
// calling libm once per lane.
//
// A loop whose body is not a sequence of stores built from arithmetic,
// min/max, casts, those calls and loads, or whose lane count is not a power of two or
// makes vectors wider than 512 bytes, or whose stores would need a
// gather of computed indices, stays a serial loop (the C compiler may
// still vectorize it). A vectorized loop whose extent is not a constant is
// an error naming the loop.
//
// Indices that divide a loop variable (a blocked layout's x/b and x%b,
// as a convolution's kernel in blocks of output channels has them) are
// first simplified with the enclosing loops' ranges, so that inside a
// block they become sums the loop variable enters with a stride of 1.
//
// A loop it cannot vectorize for a condition on its lanes (a guard that
// PartitionLoops and Simplify may prove for whole vectors, as in TVM,
// whose LoopPartition runs before VectorizeLoop) stays a vectorized loop
// for VectorizePartitioned.
func Vectorize(f *ir.PrimFunc) (*ir.PrimFunc, error) { return vectorize(f, false) }

// VectorizePartitioned vectorizes the loops Vectorize left for after
// loop partitioning; those it still cannot vectorize become serial loops,
// unrolled and simplified as the passes before would have made them.
func VectorizePartitioned(f *ir.PrimFunc) (*ir.PrimFunc, error) { return vectorize(f, true) }

// laneGuarded reports an if statement in fr's body whose condition
// depends on fr's variable.
func laneGuarded(fr *ir.For) bool {
	found := false
	ir.Visit(fr.Body, func(n ir.Node) bool {
		if c, ok := n.(*ir.IfThenElse); ok && usesLoopVar(c.Cond, fr.Var) {
			found = true
		}
		return !found
	})
	return found
}

func usesLoopVar(e ir.Expr, v *ir.Var) bool {
	found := false
	ir.Visit(e, func(n ir.Node) bool {
		found = found || n == ir.Node(v)
		return !found
	})
	return found
}

func vectorize(f *ir.PrimFunc, last bool) (*ir.PrimFunc, error) {
	if divisionInVectorLoop(f.Body) {
		f = f.WithBody(simplifyStmt(f.Body))
	}
	var err error
	r := &ir.Rewriter{Stmt: func(s ir.Stmt) ir.Stmt {
		fr, ok := s.(*ir.For)
		if !ok || fr.Kind != ir.ForVectorized {
			return s
		}
		ext, ok := ir.IsConstInt(foldExpr(fr.Extent))
		if !ok {
			if err == nil {
				err = fmt.Errorf("vectorized loop %q has extent %s, which is not a constant", fr.Var.Name, fr.Extent)
			}
			return s
		}
		switch {
		case ext <= 0:
			return &ir.SeqStmt{}
		case ext == 1:
			return substitute(fr.Body, map[*ir.Var]ir.Expr{fr.Var: fr.Min})
		}
		if width := vectorBytes(f); width > 0 {
			_, math := f.Attrs[AttrVectorBytes]
			if out, ok := vectorizeSplit(fr, int(ext), width, math); ok {
				return out
			}
		}
		if !last && laneGuarded(fr) {
			return fr
		}
		c := *fr
		c.Kind = ir.ForSerial
		if last {
			// As the unroll and simplify passes would have made it.
			g, _ := Unroll(f.WithBody(&c))
			return simplifyStmt(g.Body)
		}
		return &c
	}}
	g := f.WithBody(seqSafe(r).RewriteStmt(f.Body))
	if err != nil {
		return nil, err
	}
	return g, nil
}

// divisionInVectorLoop reports a vectorized loop whose body divides an
// integer (floordiv or floormod).
func divisionInVectorLoop(s ir.Stmt) bool {
	found := false
	ir.Visit(s, func(n ir.Node) bool {
		fr, ok := n.(*ir.For)
		if !ok || fr.Kind != ir.ForVectorized {
			return !found
		}
		ir.Visit(fr.Body, func(m ir.Node) bool {
			if b, ok := m.(*ir.Binary); ok && (b.Op == ir.OpFloorDiv || b.Op == ir.OpFloorMod) && b.A.DType().IsInt() {
				found = true
			}
			return !found
		})
		return false
	})
	return found
}

// AttrVectorBytes is the function attribute (int64) giving the width in
// bytes of the target's native vectors; without it Vectorize assumes
// DefaultVectorBytes. 0 says the target has no vector registers: vectorized
// loops stay serial loops and the generated C has no vector types.
const AttrVectorBytes = "kiln.vector_bytes"

// DefaultVectorBytes is the native vector width Vectorize assumes: 64
// bytes, AVX-512's zmm registers (on narrower targets GCC splits each
// vector in two).
const DefaultVectorBytes = 64

func vectorBytes(f *ir.PrimFunc) int {
	if v, ok := f.Attrs[AttrVectorBytes].(int64); ok && v >= 0 && v <= maxVectorBytes {
		return int(v)
	}
	return DefaultVectorBytes
}

// vectorizeSplit vectorizes loop fr of lanes iterations. When the vectors
// would be wider than native vectors of width bytes, it computes the body
// on native vectors instead, once per piece, in an unrolled loop over the
// pieces (which the unroll pass expands): GCC keeps a native vector in a
// register, but a wider one (a generic vector it must split) in memory.
func vectorizeSplit(fr *ir.For, lanes, width int, math bool) (ir.Stmt, bool) {
	bits := 0
	ir.Visit(fr.Body, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.BufferStore:
			bits = max(bits, int(n.Buffer.DType.Bits))
		case *ir.BufferLoad:
			bits = max(bits, int(n.Buffer.DType.Bits))
		}
		return true
	})
	native := lanes
	if bits > 0 {
		native = max(1, width*8/bits)
	}
	if lanes <= native || native&(native-1) != 0 || lanes%native != 0 {
		return vectorizeLoop(fr, lanes, math)
	}
	piece := ir.NewVar(fr.Var.Name+"_piece", fr.Var.Type)
	c := *fr
	c.Min = foldExpr(ir.Add(fr.Min, ir.Mul(piece, ir.NewIntImm(fr.Var.Type, int64(native)))))
	c.Extent = ir.NewIntImm(fr.Extent.DType(), int64(native))
	body, ok := vectorizeLoop(&c, native, math)
	if !ok {
		return nil, false
	}
	return ir.NewFor(piece, ir.NewIntImm(fr.Var.Type, 0), ir.NewIntImm(fr.Extent.DType(), int64(lanes/native)), ir.ForUnrolled, body), true
}

type vectorizer struct {
	v     *ir.Var
	ramp  *ir.Ramp
	lanes int
	math  bool // calls in VectorMath may become vector calls
}

// VectorMath lists the math intrinsics whose float32 calls Vectorize
// makes on vectors for CPU targets; the C code generator prints them as
// inline vector functions (kiln_vexp_float32x16, …).
var VectorMath = map[string]bool{"exp": true, "erf": true, "sigmoid": true}

func vectorizeLoop(fr *ir.For, lanes int, math bool) (ir.Stmt, bool) {
	if lanes&(lanes-1) != 0 {
		return nil, false
	}
	vz := &vectorizer{v: fr.Var, lanes: lanes, math: math,
		ramp: &ir.Ramp{Base: fr.Min, Stride: ir.NewIntImm(fr.Var.Type, 1), Lanes: lanes}}
	out, ok := vz.stmt(fr.Body)
	if !ok {
		return nil, false
	}
	fits := true
	ir.Visit(out, func(n ir.Node) bool {
		if e, ok := n.(ir.Expr); ok {
			t := e.DType()
			if t.Lanes > 1 && int(t.Lanes)*int(t.Bits)/8 > maxVectorBytes {
				fits = false
			}
		}
		return fits
	})
	return out, fits
}

func (vz *vectorizer) stmt(s ir.Stmt) (ir.Stmt, bool) {
	switch s := s.(type) {
	case *ir.SeqStmt:
		out := make([]ir.Stmt, len(s.Seq))
		for i, c := range s.Seq {
			var ok bool
			if out[i], ok = vz.stmt(c); !ok {
				return nil, false
			}
		}
		return &ir.SeqStmt{Seq: out}, true
	case *ir.IfThenElse:
		// A condition that does not depend on the loop variable stays a
		// scalar if around vectorized branches.
		if c, ok := vz.expr(s.Cond); !ok || c.DType().Lanes != 1 {
			return nil, false
		}
		then, ok := vz.stmt(s.Then)
		if !ok {
			return nil, false
		}
		var els ir.Stmt
		if s.Else != nil {
			if els, ok = vz.stmt(s.Else); !ok {
				return nil, false
			}
		}
		return &ir.IfThenElse{Cond: s.Cond, Then: then, Else: els}, true
	case *ir.BufferStore:
		if len(s.Indices) != 1 {
			return nil, false
		}
		idx, ok := vz.expr(s.Indices[0])
		if !ok {
			return nil, false
		}
		val, ok := vz.expr(s.Value)
		if !ok {
			return nil, false
		}
		il, vl := idx.DType().Lanes, val.DType().Lanes
		switch {
		case il == 1 && vl == 1:
			return s, true // loop invariant
		case il == 1:
			return nil, false // every lane stores to one place: a reduction
		}
		if _, ok := idx.(*ir.Ramp); !ok {
			return nil, false
		}
		if vl == 1 {
			val = &ir.Broadcast{Value: val, Lanes: vz.lanes}
		}
		if val.DType().Lanes != idx.DType().Lanes {
			return nil, false
		}
		return &ir.BufferStore{Buffer: s.Buffer, Value: val, Indices: []ir.Expr{idx}}, true
	}
	return nil, false
}

// expr returns e computed on vectors (or e itself when it does not depend
// on the loop variable), or false when it cannot be vectorized.
func (vz *vectorizer) expr(e ir.Expr) (ir.Expr, bool) {
	switch e := e.(type) {
	case *ir.Var:
		if e == vz.v {
			return vz.ramp, true
		}
		return e, true
	case *ir.IntImm, *ir.FloatImm, *ir.StringImm:
		return e, true
	case *ir.Binary:
		a, ok := vz.expr(e.A)
		if !ok {
			return nil, false
		}
		b, ok := vz.expr(e.B)
		if !ok {
			return nil, false
		}
		if a == e.A && b == e.B {
			return e, true
		}
		if out, ok := rampDivMod(e.Op, a, b); ok {
			return out, true
		}
		out := binary(e.Op, a, b)
		if out.DType().Lanes > 1 {
			if bin, ok := out.(*ir.Binary); ok && !vectorOpOK(bin.Op, bin.A.DType()) {
				return nil, false
			}
		}
		return out, true
	case *ir.Cast:
		v, ok := vz.expr(e.Value)
		if !ok {
			return nil, false
		}
		if v == e.Value {
			return e, true
		}
		if b, ok := v.(*ir.Broadcast); ok {
			return &ir.Broadcast{Value: foldNode(&ir.Cast{Type: e.Type, Value: b.Value}), Lanes: b.Lanes}, true
		}
		if ir.IsBool(e.Type) || ir.IsBool(v.DType()) {
			return nil, false // the code generators have no vector casts of booleans
		}
		return &ir.Cast{Type: e.Type.WithLanes(int(v.DType().Lanes)), Value: v}, true
	case *ir.Call:
		if vz.math && VectorMath[e.Op] && e.Type == ir.Float32 {
			args := make([]ir.Expr, len(e.Args))
			changed := false
			for i, a := range e.Args {
				v, ok := vz.expr(a)
				if !ok {
					return nil, false
				}
				args[i], changed = v, changed || v != a
			}
			if !changed {
				return e, true
			}
			for i, a := range args {
				if a.DType().Lanes == 1 {
					args[i] = &ir.Broadcast{Value: a, Lanes: vz.lanes}
				}
			}
			return &ir.Call{Op: e.Op, Type: e.Type.WithLanes(vz.lanes), Args: args}, true
		}
	case *ir.BufferLoad:
		if len(e.Indices) != 1 {
			return nil, false
		}
		idx, ok := vz.expr(e.Indices[0])
		if !ok {
			return nil, false
		}
		if idx == e.Indices[0] {
			return e, true
		}
		if idx.DType().Lanes > 1 {
			if _, ok := idx.(*ir.Ramp); !ok {
				return nil, false
			}
		}
		return &ir.BufferLoad{Buffer: e.Buffer, Indices: []ir.Expr{idx}}, true
	}
	// Anything else vectorizes only when it does not use the loop variable.
	uses := false
	ir.Visit(e, func(n ir.Node) bool {
		if v, ok := n.(*ir.Var); ok && v == vz.v {
			uses = true
		}
		return !uses
	})
	return e, !uses
}

// vectorOpOK reports the operations the code generators support on vectors
// of type t.
func vectorOpOK(op ir.BinaryOp, t ir.DType) bool {
	switch op {
	case ir.OpAdd, ir.OpSub, ir.OpMul, ir.OpMin, ir.OpMax:
		return t.IsInt() || t.IsFloat()
	case ir.OpDiv:
		return t.IsFloat()
	}
	return false
}

// rampDivMod divides a ramp of stride 1 by a constant c that its lanes L
// divide, its base a multiple of L (a packed weight's panel index and
// offset, j / P and j % P over a vector of j): the ramp stays within one
// multiple of c, so the quotient is the base's, broadcast, and the
// remainder a ramp from the base's.
func rampDivMod(op ir.BinaryOp, a, b ir.Expr) (ir.Expr, bool) {
	r, ok := a.(*ir.Ramp)
	c, isConst := ir.IsConstInt(b)
	if !ok || !isConst || (op != ir.OpFloorDiv && op != ir.OpFloorMod) || c <= 0 || c%int64(r.Lanes) != 0 {
		return nil, false
	}
	if s, ok := ir.IsConstInt(r.Stride); !ok || s != 1 || !multipleOf(r.Base, int64(r.Lanes)) {
		return nil, false
	}
	q := foldNode(ir.NewBinary(op, r.Base, b))
	if op == ir.OpFloorDiv {
		return &ir.Broadcast{Value: q, Lanes: r.Lanes}, true
	}
	return &ir.Ramp{Base: q, Stride: r.Stride, Lanes: r.Lanes}, true
}

// multipleOf reports an integer expression that is a multiple of n for
// any values of its variables: constants that are, and sums and products
// of such terms.
func multipleOf(e ir.Expr, n int64) bool {
	switch e := e.(type) {
	case *ir.IntImm:
		return e.Value%n == 0
	case *ir.Binary:
		switch e.Op {
		case ir.OpAdd, ir.OpSub:
			return multipleOf(e.A, n) && multipleOf(e.B, n)
		case ir.OpMul:
			return multipleOf(e.A, n) || multipleOf(e.B, n)
		}
	}
	return false
}
