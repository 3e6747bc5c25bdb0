package transform

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// FlattenBuffers rewrites every load and store of a multi-dimensional
// buffer into one of a 1-D buffer over the same data variable: the index
// is row-major over the shape, or the sum of index × stride when the
// buffer has strides, plus its element offset. Allocations and declared
// views are flattened the same way. The function's buffer map keeps the
// original buffers (make_packed_api checks arguments against them).
// Blocks must already be lowered.
func FlattenBuffers(f *ir.PrimFunc) (*ir.PrimFunc, error) {
	var err error
	ir.Visit(f.Body, func(n ir.Node) bool {
		if _, ok := n.(*ir.BlockRealize); ok && err == nil {
			err = errors.New("function still has blocks: run lower_blocks first")
		}
		return err == nil
	})
	if err != nil {
		return nil, err
	}
	body, err := lowerMmaFragments(f.Body)
	if err != nil {
		return nil, err
	}
	flat := map[*ir.Buffer]*ir.Buffer{}
	r := &ir.Rewriter{}
	flatOf := func(b *ir.Buffer) *ir.Buffer {
		if nb, ok := flat[b]; ok {
			return nb
		}
		nb := flattenBuffer(b)
		flat[b] = nb
		return nb
	}
	r.Expr = func(e ir.Expr) ir.Expr {
		if l, ok := e.(*ir.BufferLoad); ok && needsFlatten(l.Buffer, l.Indices) {
			return &ir.BufferLoad{Buffer: flatOf(l.Buffer), Indices: []ir.Expr{flatIndex(l.Buffer, l.Indices)}}
		}
		return e
	}
	r.Stmt = func(s ir.Stmt) ir.Stmt {
		switch s := s.(type) {
		case *ir.BufferStore:
			if needsFlatten(s.Buffer, s.Indices) {
				return &ir.BufferStore{Buffer: flatOf(s.Buffer), Value: s.Value, Indices: []ir.Expr{flatIndex(s.Buffer, s.Indices)}}
			}
		case *ir.Allocate:
			if needsFlatten(s.Buffer, nil) {
				return &ir.Allocate{Buffer: flatOf(s.Buffer), Body: s.Body}
			}
		case *ir.DeclBuffer:
			if needsFlatten(s.Buffer, nil) {
				return &ir.DeclBuffer{Buffer: flatOf(s.Buffer), Body: s.Body}
			}
		}
		return s
	}
	return f.WithBody(seqSafe(r).RewriteStmt(body)), nil
}

// lowerMmaFragments rewrites the ptx_mma operands given as vector loads
// of a fragment (ir.PtxMmaFragments) into the fragment's data variable and
// the flat element offset of its first element.
func lowerMmaFragments(s ir.Stmt) (ir.Stmt, error) {
	var err error
	r := &ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
		c, ok := e.(*ir.Call)
		if !ok || c.Op != ir.OpPtxMma || len(c.Args) != 13 {
			return e
		}
		var args []ir.Expr
		for n, i := range []int{6, 8, 10} {
			l, ok := c.Args[i].(*ir.BufferLoad)
			if !ok {
				continue
			}
			first, ok := ir.PtxMmaFragment(l, []int{8, 4, 4}[n])
			if !ok {
				if err == nil {
					err = fmt.Errorf("ptx_mma operand %s is not a load of the %d elements of a fragment", l, []int{8, 4, 4}[n])
				}
				return e
			}
			if args == nil {
				args = slices.Clone(c.Args)
			}
			off := flatIndex(l.Buffer, first)
			if !isZeroConst(c.Args[i+1]) {
				off = foldExpr(ir.Add(off, c.Args[i+1]))
			}
			args[i], args[i+1] = l.Buffer.Data, off
		}
		if args == nil {
			return e
		}
		return &ir.Call{Type: c.Type, Op: c.Op, Args: args}
	}}
	out := r.RewriteStmt(s)
	return out, err
}

// needsFlatten reports a buffer that is not already a plain 1-D buffer.
func needsFlatten(b *ir.Buffer, _ []ir.Expr) bool {
	return len(b.Shape) != 1 || len(b.Strides) != 0 || (b.ElemOffset != nil && !isZeroConst(b.ElemOffset))
}

func isZeroConst(e ir.Expr) bool {
	v, ok := ir.IsConstInt(e)
	return ok && v == 0
}

// flattenBuffer returns the 1-D view of b over the same data.
func flattenBuffer(b *ir.Buffer) *ir.Buffer {
	var size ir.Expr
	if len(b.Strides) == len(b.Shape) && len(b.Strides) > 0 {
		// Elements reachable: 1 + Σ (shape_k - 1) × stride_k.
		size = ir.I64(1)
		for k := range b.Shape {
			size = ir.Add(size, ir.Mul(ir.Sub(b.Shape[k], ir.NewIntImm(b.Shape[k].DType(), 1)), b.Strides[k]))
		}
	} else {
		size = ir.Expr(nil)
		for _, s := range b.Shape {
			if size == nil {
				size = s
			} else {
				size = ir.Mul(size, s)
			}
		}
		if size == nil {
			size = ir.I32(1)
		}
	}
	if b.ElemOffset != nil && !isZeroConst(b.ElemOffset) {
		size = ir.Add(size, b.ElemOffset)
	}
	size = foldExpr(size)
	return &ir.Buffer{Name: b.Name, DType: b.DType, Shape: []ir.Expr{size}, Scope: b.Scope, Data: b.Data}
}

// flatIndex is the 1-D index of b[indices…].
func flatIndex(b *ir.Buffer, indices []ir.Expr) ir.Expr {
	var idx ir.Expr
	if len(b.Strides) == len(indices) && len(b.Strides) > 0 {
		for k, ix := range indices {
			t := ir.Mul(ix, b.Strides[k])
			if idx == nil {
				idx = t
			} else {
				idx = ir.Add(idx, t)
			}
		}
	} else {
		for k, ix := range indices {
			if idx == nil {
				idx = ix
			} else {
				idx = ir.Add(ir.Mul(idx, b.Shape[k]), ix)
			}
		}
	}
	if idx == nil {
		idx = ir.I32(0)
	}
	if b.ElemOffset != nil && !isZeroConst(b.ElemOffset) {
		idx = ir.Add(idx, b.ElemOffset)
	}
	return foldExpr(idx)
}
