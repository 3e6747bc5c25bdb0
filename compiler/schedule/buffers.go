package schedule

import (
	"fmt"
	"maps"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// StorageScopes are the scopes SetScope accepts.
var StorageScopes = []string{"global", "local", "shared", "shared.dyn"}

// SetScope gives the buffer that block b writes as its writeIndex-th
// write region the storage scope scope (one of StorageScopes), wherever
// the function uses it (TVM's sch.set_scope). The buffer must be one
// that a block allocates, not a parameter of the function.
func (s *Schedule) SetScope(b BlockRV, writeIndex int, scope string) error {
	if err := s.setScope(b, writeIndex, scope); err != nil {
		return fmt.Errorf("set_scope: %w", err)
	}
	s.record("sch.set_scope(%s, %d, %q)", s.bn(b), writeIndex, scope)
	return nil
}

func (s *Schedule) setScope(b BlockRV, writeIndex int, scope string) error {
	if !slices.Contains(StorageScopes, scope) {
		return fmt.Errorf("unknown storage scope %q (want one of %v)", scope, StorageScopes)
	}
	_, buf, err := s.allocatedWrite(b, writeIndex)
	if err != nil {
		return err
	}
	if buf.StorageScope() == scope {
		return nil
	}
	nb := *buf
	nb.Scope = scope
	return s.commit("set_scope", s.swapBuffer(buf, &nb))
}

// allocatedWrite returns block b's writeIndex-th written buffer, which a
// block of the function must allocate.
func (s *Schedule) allocatedWrite(b BlockRV, writeIndex int) (*ir.Block, *ir.Buffer, error) {
	bs, err := s.block("", b)
	if err != nil {
		return nil, nil, err
	}
	blk := bs.realize().Block
	if writeIndex < 0 || writeIndex >= len(blk.Writes) {
		return nil, nil, fmt.Errorf("block %q has %d write regions, no write %d", blk.Name, len(blk.Writes), writeIndex)
	}
	buf := blk.Writes[writeIndex].Buffer
	if isParam(s.fn, buf) {
		return nil, nil, fmt.Errorf("block %q writes %q, a parameter of the function: only a buffer that a block allocates can change", blk.Name, buf.Name)
	}
	var owner *ir.Block
	ir.Visit(s.fn.Body, func(n ir.Node) bool {
		if o, ok := n.(*ir.Block); ok && slices.Contains(o.AllocBuffers, buf) {
			owner = o
		}
		return owner == nil
	})
	if owner == nil {
		return nil, nil, fmt.Errorf("no block allocates %q, which block %q writes", buf.Name, blk.Name)
	}
	return blk, buf, nil
}

// swapBuffer returns the function body with every use of old replaced by
// nb.
func (s *Schedule) swapBuffer(old, nb *ir.Buffer) ir.Stmt {
	return rewrite(&ir.Rewriter{Buffer: func(x *ir.Buffer) *ir.Buffer {
		if x == old {
			return nb
		}
		return x
	}}, s.fn.Body)
}

// StorageAlign pads the buffer that block b writes as its writeIndex-th
// write region so that the stride of dimension axis (negative counts from
// the last) is offset modulo factor, in elements (TVM's
// sch.storage_align; use it against shared-memory bank conflicts). The
// buffer must be allocated by a block and have a constant shape; factor
// must be positive and 0 ≤ offset < factor. The block records the
// alignments in its "buffer_dim_align" annotation, as TVM's does, and the
// buffer gets the strides they give.
func (s *Schedule) StorageAlign(b BlockRV, writeIndex, axis int, factor, offset int64) error {
	if err := s.storageAlign(b, writeIndex, axis, factor, offset); err != nil {
		return fmt.Errorf("storage_align: %w", err)
	}
	s.record("sch.storage_align(%s, %d, %d, %d, %d)", s.bn(b), writeIndex, axis, factor, offset)
	return nil
}

// AnnBufferDimAlign is the block annotation StorageAlign sets: per write
// region, a list of [axis, factor, offset].
const AnnBufferDimAlign = "buffer_dim_align"

func (s *Schedule) storageAlign(b BlockRV, writeIndex, axis int, factor, offset int64) error {
	blk, buf, err := s.allocatedWrite(b, writeIndex)
	if err != nil {
		return err
	}
	n := len(buf.Shape)
	if axis < -n || axis >= n {
		return fmt.Errorf("axis %d is out of range for %q, which has %d dimensions", axis, buf.Name, n)
	}
	if axis < 0 {
		axis += n
	}
	if factor <= 0 {
		return fmt.Errorf("factor %d is not positive", factor)
	}
	if offset < 0 || offset >= factor {
		return fmt.Errorf("offset %d is not in [0, factor %d)", offset, factor)
	}
	shape := make([]int64, n)
	for d, e := range buf.Shape {
		c, ok := ir.IsConstInt(e)
		if !ok {
			return fmt.Errorf("dimension %d of %q has the symbolic extent %s", d, buf.Name, e)
		}
		shape[d] = c
	}
	// The block's alignments, by write region, with this one replacing an
	// earlier one of the same axis.
	var table []any
	if t, ok := blk.Annotations[AnnBufferDimAlign].([]any); ok {
		table = slices.Clone(t)
	}
	for len(table) < len(blk.Writes) {
		table = append(table, []any{})
	}
	var aligns []any
	for _, a := range dimAligns(table[writeIndex]) {
		if a[0] != int64(axis) {
			aligns = append(aligns, []any{a[0], a[1], a[2]})
		}
	}
	aligns = append(aligns, []any{int64(axis), factor, offset})
	table[writeIndex] = aligns
	// Every block writing the buffer contributes its alignments (TVM
	// takes them from all of them).
	align := map[int][2]int64{axis: {factor, offset}}
	ir.Visit(s.fn.Body, func(nd ir.Node) bool {
		o, ok := nd.(*ir.Block)
		if !ok || o == blk {
			return true
		}
		t, _ := o.Annotations[AnnBufferDimAlign].([]any)
		for i, w := range o.Writes {
			if w.Buffer != buf || i >= len(t) {
				continue
			}
			for _, a := range dimAligns(t[i]) {
				if _, set := align[int(a[0])]; !set {
					align[int(a[0])] = [2]int64{a[1], a[2]}
				}
			}
		}
		return true
	})
	for _, a := range dimAligns(aligns) {
		align[int(a[0])] = [2]int64{a[1], a[2]}
	}
	strides := make([]ir.Expr, n)
	stride := int64(1)
	for d := n - 1; d >= 0; d-- {
		if fo, ok := align[d]; ok {
			stride += ((fo[1]-stride)%fo[0] + fo[0]) % fo[0]
		}
		strides[d] = ir.NewIntImm(buf.Shape[d].DType(), stride)
		stride *= shape[d]
	}
	nb := *buf
	nb.Strides = strides
	body := s.swapBuffer(buf, &nb)
	// The annotation goes on the block as the rewrite left it.
	st := site{path: findBlock(body, blk.Name)}
	br := st.realize()
	nblk := *br.Block
	nblk.Annotations = maps.Clone(nblk.Annotations)
	if nblk.Annotations == nil {
		nblk.Annotations = map[string]any{}
	}
	nblk.Annotations[AnnBufferDimAlign] = table
	body = replace(body, map[ir.Stmt]ir.Stmt{br: &ir.BlockRealize{IterValues: br.IterValues, Predicate: br.Predicate, Block: &nblk}})
	return s.commit("storage_align", body)
}

// dimAligns reads one write region's entry of a buffer_dim_align
// annotation, skipping what is not [axis, factor, offset] with a positive
// factor.
func dimAligns(x any) [][3]int64 {
	list, _ := x.([]any)
	var out [][3]int64
	for _, e := range list {
		a, _ := e.([]any)
		if len(a) != 3 {
			continue
		}
		var v [3]int64
		ok := true
		for i, n := range a {
			switch n := n.(type) {
			case int64:
				v[i] = n
			case int:
				v[i] = int64(n)
			default:
				ok = false
			}
		}
		if ok && v[1] > 0 {
			out = append(out, v)
		}
	}
	return out
}
