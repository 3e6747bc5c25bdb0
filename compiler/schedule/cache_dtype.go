package schedule

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// CacheWriteDType is CacheWrite with a cache of dtype dt, wider than the
// buffer's (float32 for a float16 output): block b computes in dt what it
// stores, each value of the buffer's dtype that its arithmetic combines
// (a load of another buffer, a constant, a cast) cast to dt first, and
// the copy back casts to the buffer's dtype. A reduction into the cache
// so accumulates in dt and is rounded once, when it is copied back. dt
// must be of the buffer's kind (a float for a float buffer, an integer
// for an integer one) and at least as wide.
func (s *Schedule) CacheWriteDType(b BlockRV, writeIndex int, scope string, dt ir.DType) (BlockRV, error) {
	if dt == ir.Void {
		return BlockRV{}, fmt.Errorf("cache_write: no dtype for the cache")
	}
	out, err := s.cacheWrite(b, writeIndex, scope, dt)
	if err != nil {
		return BlockRV{}, fmt.Errorf("cache_write: %w", err)
	}
	s.record("%s = sch.cache_write(%s, %d, %q, dtype=%q)", s.bn(out), s.bn(b), writeIndex, scope, dt.String())
	return out, nil
}

// accumDTypeOK checks that a cache of buf may hold dtype dt.
func accumDTypeOK(buf *ir.Buffer, dt ir.DType) error {
	if dt == buf.DType {
		return nil
	}
	from := buf.DType
	sameKind := from.IsFloat() && dt.IsFloat() && !dt.IsFloat8() || from.IsInt() && dt.IsInt() && from.Code == dt.Code
	if !sameKind || dt.Lanes != from.Lanes || dt.Bits < from.Bits || dt.Bits == from.Bits && dt.Code != from.Code {
		return fmt.Errorf("a cache of %q (%s) cannot hold %s: its dtype must be a wider one of the same kind", buf.Name, from, dt)
	}
	return nil
}

// castCopyNest is copyNest from src to dst, casting to dst's dtype.
func castCopyNest(name string, src, dst *ir.Buffer) ir.Stmt {
	if src.DType == dst.DType {
		return copyNest(name, src, dst)
	}
	return pointNest(name, dst.Shape, func(idx []ir.Expr) (ir.Stmt, []ir.BufferRegion, []ir.Expr) {
		return dst.Store(ir.NewCast(dst.DType, src.Load(idx...)), idx...), []ir.BufferRegion{ir.PointRegion(src, idx...)}, idx
	}, dst)
}

// widenStores rewrites the values block br stores into buf (in its body
// and init) to compute in the dtype of cache, which replaces buf in its
// loads there; the stores and regions still name buf.
func widenStores(br *ir.BlockRealize, buf, cache *ir.Buffer) *ir.BlockRealize {
	if buf.DType == cache.DType {
		return br
	}
	r := &ir.Rewriter{Stmt: func(st ir.Stmt) ir.Stmt {
		if n, ok := st.(*ir.BufferStore); ok && n.Buffer == buf {
			return &ir.BufferStore{Buffer: n.Buffer, Value: widenValue(n.Value, buf, cache), Indices: n.Indices}
		}
		return st
	}}
	blk := *br.Block
	blk.Body = r.RewriteStmt(blk.Body)
	if blk.Init != nil {
		blk.Init = r.RewriteStmt(blk.Init)
	}
	return &ir.BlockRealize{IterValues: br.IterValues, Predicate: br.Predicate, Block: &blk}
}

// widenValue returns e, of buf's dtype, computed in cache's: arithmetic in the
// wider dtype, loads of buf from cache, constants and casts made in it,
// any other value cast to it.
func widenValue(e ir.Expr, buf, cache *ir.Buffer) ir.Expr {
	from, to := buf.DType, cache.DType
	if e.DType() != from {
		return e
	}
	switch n := e.(type) {
	case *ir.BufferLoad:
		if n.Buffer == buf {
			return &ir.BufferLoad{Buffer: cache, Indices: n.Indices}
		}
	case *ir.Binary:
		switch n.Op {
		case ir.OpAdd, ir.OpSub, ir.OpMul, ir.OpDiv, ir.OpMin, ir.OpMax:
			return ir.NewBinary(n.Op, widenValue(n.A, buf, cache), widenValue(n.B, buf, cache))
		}
	case *ir.Select:
		return &ir.Select{Cond: n.Cond, True: widenValue(n.True, buf, cache), False: widenValue(n.False, buf, cache)}
	case *ir.Cast:
		return ir.NewCast(to, n.Value)
	case *ir.FloatImm:
		return ir.NewFloatImm(to, n.Value)
	case *ir.IntImm:
		return ir.NewIntImm(to, n.Value)
	}
	return ir.NewCast(to, e)
}
