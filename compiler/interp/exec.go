package interp

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// exec runs one statement.
func (m *machine) exec(s ir.Stmt) error {
	switch s := s.(type) {
	case nil:
		return nil
	case *ir.For:
		if s.Kind == ir.ForThreadBinding {
			return m.boundLoop(s.ThreadTag, s.Var, s.Min, s.Extent, s.Body)
		}
		return m.loop(s.Var, s.Min, s.Extent, s.Body)
	case *ir.BlockRealize:
		if err := m.block(s); err != nil {
			return fmt.Errorf("block %q: %w", s.Block.Name, err)
		}
		return nil
	case *ir.BufferStore:
		return m.bufferStore(s)
	case *ir.Allocate:
		restore, err := m.allocate(s.Buffer)
		if err != nil {
			return err
		}
		defer restore()
		return m.exec(s.Body)
	case *ir.DeclBuffer:
		if m.mem[s.Buffer.Data] == nil {
			return fmt.Errorf("decl_buffer %q: its data %q is not allocated", s.Buffer.Name, s.Buffer.Data.Name)
		}
		delete(m.layouts, s.Buffer) // shapes may depend on variables: evaluate here
		if _, err := m.layoutOf(s.Buffer); err != nil {
			return err
		}
		return m.exec(s.Body)
	case *ir.SeqStmt:
		for _, c := range s.Seq {
			if err := m.exec(c); err != nil {
				return err
			}
		}
		return nil
	case *ir.IfThenElse:
		c, err := m.eval(s.Cond)
		if err != nil {
			return err
		}
		if c.Lanes() != 1 {
			return fmt.Errorf("if %s: condition has %d lanes", s.Cond, c.Lanes())
		}
		if c.AsBool() {
			return m.exec(s.Then)
		}
		return m.exec(s.Else)
	case *ir.LetStmt:
		v, err := m.eval(s.Value)
		if err != nil {
			return err
		}
		restore := m.bind(s.Var, v)
		defer restore()
		return m.exec(s.Body)
	case *ir.Evaluate:
		if rv := ir.RetValue(s); rv != nil {
			v, err := m.eval(rv)
			if err != nil {
				return err
			}
			m.ret = &v
			return errReturned
		}
		_, err := m.eval(s.Value)
		return err
	case *ir.AttrStmt:
		if v, ok := s.Node.(*ir.Var); ok && (s.Key == "thread_extent" || s.Key == "virtual_thread") && v.Type.IsInt() {
			// A thread axis: run the body once per thread, in order.
			return m.boundLoop(v.Name, v, &ir.IntImm{Type: v.Type, Value: 0}, s.Value, s.Body)
		}
		if _, err := m.eval(s.Value); err != nil {
			return fmt.Errorf("attr %q: %w", s.Key, err)
		}
		return m.exec(s.Body)
	case *ir.AssertStmt:
		c, err := m.eval(s.Cond)
		if err != nil {
			return err
		}
		if !c.AsBool() {
			return fmt.Errorf("%w: %s", ErrAssert, s.Message)
		}
		return nil
	}
	return fmt.Errorf("%T: unknown statement", s)
}

// loop runs body with v taking min, min+1, …, min+extent-1.
func (m *machine) loop(v *ir.Var, min, extent ir.Expr, body ir.Stmt) error {
	return m.loopEach(v, min, extent, body, nil)
}

// loopEach is loop calling each (when not nil) with the value of v before
// every iteration.
func (m *machine) loopEach(v *ir.Var, min, extent ir.Expr, body ir.Stmt, each func(int64)) error {
	lo, err := m.evalInt(min, "loop min")
	if err != nil {
		return fmt.Errorf("for %q: %w", v.Name, err)
	}
	n, err := m.evalInt(extent, "loop extent")
	if err != nil {
		return fmt.Errorf("for %q: %w", v.Name, err)
	}
	restore := m.bind(v, Int(v.Type, lo))
	defer restore()
	for i := int64(0); i < n; i++ {
		if err := m.step(); err != nil {
			return fmt.Errorf("for %q: %w", v.Name, err)
		}
		m.vars[v] = Int(v.Type, lo+i)
		if each != nil {
			each(lo + i)
		}
		if err := m.exec(body); err != nil {
			return err
		}
	}
	return nil
}

// block runs a BlockRealize: iteration variables bound to their values,
// the predicate checked, buffers allocated, Init run when every reduction
// variable is at its domain's minimum, then the body.
func (m *machine) block(s *ir.BlockRealize) error {
	if err := m.step(); err != nil {
		return err
	}
	b := s.Block
	if len(s.IterValues) != len(b.IterVars) {
		return fmt.Errorf("%d iteration values for %d iteration variables", len(s.IterValues), len(b.IterVars))
	}
	var valBuf [8]Value
	vals := valBuf[:0]
	for _, e := range s.IterValues {
		v, err := m.eval(e)
		if err != nil {
			return err
		}
		vals = append(vals, v)
	}
	if s.Predicate != nil {
		p, err := m.eval(s.Predicate)
		if err != nil {
			return fmt.Errorf("predicate: %w", err)
		}
		if !p.AsBool() {
			return nil
		}
	}
	// Save what the iteration variables shadow; restore it on the way out.
	type saved struct {
		old Value
		had bool
	}
	var saveBuf [8]saved
	olds := saveBuf[:0]
	for i, iv := range b.IterVars {
		v, err := Cast(iv.Var.Type, vals[i])
		if err != nil {
			return fmt.Errorf("iteration variable %q: %w", iv.Var.Name, err)
		}
		old, had := m.vars[iv.Var]
		olds = append(olds, saved{old, had})
		m.vars[iv.Var] = v
	}
	defer func() {
		for i := len(olds) - 1; i >= 0; i-- {
			if olds[i].had {
				m.vars[b.IterVars[i].Var] = olds[i].old
			} else {
				delete(m.vars, b.IterVars[i].Var)
			}
		}
	}()
	var restores []func()
	defer func() {
		for i := len(restores) - 1; i >= 0; i-- {
			restores[i]()
		}
	}()
	for _, buf := range b.AllocBuffers {
		restore, err := m.allocate(buf)
		if err != nil {
			return err
		}
		restores = append(restores, restore)
	}
	if b.Init != nil {
		first := true
		for _, iv := range b.IterVars {
			if iv.Kind != ir.IterReduce {
				continue
			}
			lo, err := m.evalInt(iv.Dom.Min, "domain min")
			if err != nil {
				return err
			}
			if m.vars[iv.Var].AsInt() != lo {
				first = false
				break
			}
		}
		if first {
			if err := m.exec(b.Init); err != nil {
				return fmt.Errorf("init: %w", err)
			}
		}
	}
	return m.exec(b.Body)
}

// allocate gives buf fresh memory for the scope it is declared in.
func (m *machine) allocate(buf *ir.Buffer) (func(), error) {
	delete(m.layouts, buf)
	l, err := m.layoutOf(buf)
	if err != nil {
		return nil, err
	}
	n := int64(1)
	for d, e := range l.shape {
		if e < 0 {
			return nil, fmt.Errorf("allocate %q: dimension %d is %d", buf.Name, d, e)
		}
		if e != 0 && n > maxAlloc/e {
			return nil, fmt.Errorf("allocate %q: shape %s is too large for the interpreter", buf.Name, fmtIndex(l.shape))
		}
		n *= e
	}
	// Strided or offset buffers need the memory up to their last element.
	if buf.Strides != nil || l.offset != 0 {
		last := l.offset
		for d, e := range l.shape {
			if e > 0 {
				last += (e - 1) * l.strides[d]
			}
		}
		n = max(n, last+1)
	}
	size := int64(buf.DType.Size())
	if n > maxAlloc/max(size, 1) {
		return nil, fmt.Errorf("allocate %q: %d elements are too many for the interpreter", buf.Name, n)
	}
	data := make([]byte, n*size)
	if m.opts.Poison {
		for i := range data {
			data[i] = 0xff
		}
	}
	scope := buf.StorageScope()
	mem := &memory{name: buf.Name, data: data, shared: scope == "shared" || scope == "shared.dyn"}
	if m.perThread(scope) {
		mem.threads = map[[3]int64]*memory{}
	}
	return m.bindMem(buf.Data, mem), nil
}

func (m *machine) bufferStore(s *ir.BufferStore) error {
	v, err := m.eval(s.Value)
	if err != nil {
		return err
	}
	var idxBuf [6]Value
	var flatBuf [6]int64
	idx := idxBuf[:0]
	for i, e := range s.Indices {
		x, err := m.eval(e)
		if err != nil {
			return err
		}
		if x.IsFloat() {
			return fmt.Errorf("store to %q: index %d is a float (%s)", s.Buffer.Name, i, x.Type)
		}
		idx = append(idx, x)
	}
	n, err := laneCount(idx...)
	if err != nil {
		return fmt.Errorf("store to %q: %w", s.Buffer.Name, err)
	}
	var flat []int64
	if len(idx) <= len(flatBuf) {
		flat = flatBuf[:len(idx)]
	} else {
		flat = make([]int64, len(idx))
	}
	if n == 1 {
		for i, x := range idx {
			flat[i] = x.AsInt()
		}
		return m.store(s.Buffer, flat, v)
	}
	if v.Lanes() != n && v.Lanes() != 1 {
		return fmt.Errorf("store to %q: %d-lane value at %d-lane indices", s.Buffer.Name, v.Lanes(), n)
	}
	for l := range n {
		for i, x := range idx {
			flat[i] = int64(lane(x, l))
		}
		if err := m.store(s.Buffer, flat, Value{Type: v.Type.Scalar(), bits: lane(v, l)}); err != nil {
			return err
		}
	}
	return nil
}
