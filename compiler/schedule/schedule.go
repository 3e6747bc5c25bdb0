package schedule

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Schedule applies schedule primitives to one PrimFunc. It is not safe for
// concurrent use; Copy forks it.
type Schedule struct {
	fn     *ir.PrimFunc
	blocks []blockEntry // indexed by BlockRV.id-1
	trace  []string
	// names and taken are the trace's variables for handles (trace.go).
	names map[rvKey]string
	taken map[string]bool
}

// blockEntry is what a BlockRV refers to: a block's current name, or why
// the block is gone.
type blockEntry struct {
	name string
	gone string
}

// BlockRV names a block of a Schedule. It follows the block when a
// primitive renames it (DecomposeReduction renames C to C_update).
type BlockRV struct {
	id   int
	name string
}

// String is the name the block had when the handle was made.
func (b BlockRV) String() string { return b.name }

// LoopRV names a loop of a Schedule by its loop variable.
type LoopRV struct {
	v *ir.Var
}

// String is the loop variable's name.
func (l LoopRV) String() string {
	if l.v == nil {
		return "<nil loop>"
	}
	return l.v.Name
}

// Var returns the loop's variable.
func (l LoopRV) Var() *ir.Var { return l.v }

// New returns a schedule of f, which must be a well-formed TensorIR
// PrimFunc (its body a root block) whose block names are unique.
func New(f *ir.PrimFunc) (*Schedule, error) {
	if f == nil {
		return nil, errors.New("schedule: nil function")
	}
	if ir.RootBlock(f.Body) == nil {
		return nil, errors.New("schedule: the function's body is not a root block (not TensorIR)")
	}
	if err := ir.Verify(f); err != nil {
		return nil, fmt.Errorf("schedule: %w", err)
	}
	names := map[string]bool{}
	var dup string
	ir.Visit(f.Body, func(n ir.Node) bool {
		if b, ok := n.(*ir.Block); ok {
			if names[b.Name] && dup == "" {
				dup = b.Name
			}
			names[b.Name] = true
		}
		return true
	})
	if dup != "" {
		return nil, fmt.Errorf("schedule: two blocks are named %q", dup)
	}
	return &Schedule{fn: f}, nil
}

// FromModule returns a schedule of the PrimFunc name of m.
func FromModule(m *ir.IRModule, name string) (*Schedule, error) {
	f := m.PrimFunc(name)
	if f == nil {
		return nil, fmt.Errorf("schedule: module has no PrimFunc %q", name)
	}
	return New(f)
}

// Func returns the current PrimFunc.
func (s *Schedule) Func() *ir.PrimFunc { return s.fn }

// Copy returns an independent schedule in the same state; handles of s
// remain valid in the copy.
func (s *Schedule) Copy() *Schedule {
	names, taken := s.cloneNames()
	return &Schedule{fn: s.fn, blocks: slices.Clone(s.blocks), trace: slices.Clone(s.trace), names: names, taken: taken}
}

// Trace returns the primitives applied so far, one per line, in TVM's
// Python syntax (b0 = sch.get_block("C") …).
func (s *Schedule) Trace() []string { return slices.Clone(s.trace) }

func (s *Schedule) record(format string, args ...any) {
	s.trace = append(s.trace, fmt.Sprintf(format, args...))
}

// GetBlock returns the block called name.
func (s *Schedule) GetBlock(name string) (BlockRV, error) {
	if name == ir.RootBlockName || findBlock(s.fn.Body, name) == nil {
		return BlockRV{}, fmt.Errorf("get_block: no block named %q", name)
	}
	b := s.blockRV(name)
	s.record("%s = sch.get_block(%q)", s.bn(b), name)
	return b, nil
}

// blockRV returns the handle of the block currently called name.
func (s *Schedule) blockRV(name string) BlockRV {
	for i, e := range s.blocks {
		if e.gone == "" && e.name == name {
			return BlockRV{id: i + 1, name: name}
		}
	}
	s.blocks = append(s.blocks, blockEntry{name: name})
	return BlockRV{id: len(s.blocks), name: name}
}

// renameBlock makes handles of block old follow it to its new name.
func (s *Schedule) renameBlock(old, new string) {
	for i, e := range s.blocks {
		if e.gone == "" && e.name == old {
			s.blocks[i].name = new
		}
	}
}

// dropBlock marks handles of block name as gone, with the reason.
func (s *Schedule) dropBlock(name, why string) {
	for i, e := range s.blocks {
		if e.gone == "" && e.name == name {
			s.blocks[i].gone = why
		}
	}
}

// site is a statement with its ancestors: path[0] is the function body and
// path[len-1] the statement itself.
type site struct {
	path []ir.Stmt
}

func (st site) stmt() ir.Stmt { return st.path[len(st.path)-1] }

// realize returns the block realize a block site ends with.
func (st site) realize() *ir.BlockRealize { return st.stmt().(*ir.BlockRealize) }

// loop returns the loop a loop site ends with.
func (st site) loop() *ir.For { return st.stmt().(*ir.For) }

// loops returns the loops enclosing the site, outermost first, up to its
// nearest enclosing block.
func (st site) loops() []*ir.For {
	var out []*ir.For
	for i := len(st.path) - 2; i >= 0; i-- {
		switch n := st.path[i].(type) {
		case *ir.For:
			out = append(out, n)
		case *ir.BlockRealize:
			slices.Reverse(out)
			return out
		}
	}
	slices.Reverse(out)
	return out
}

// scope returns the block realize enclosing the site (the root block for
// most).
func (st site) scope() *ir.BlockRealize {
	for i := len(st.path) - 2; i >= 0; i-- {
		if br, ok := st.path[i].(*ir.BlockRealize); ok {
			return br
		}
	}
	return nil
}

// under reports whether the site lies inside statement anc.
func (st site) under(anc ir.Stmt) bool {
	for _, p := range st.path[:len(st.path)-1] {
		if p == anc {
			return true
		}
	}
	return false
}

// findPath returns the path to the first statement (pre-order) matching
// pred, or nil.
func findPath(body ir.Stmt, pred func(ir.Stmt) bool) []ir.Stmt {
	var path []ir.Stmt
	var walk func(s ir.Stmt) bool
	walk = func(s ir.Stmt) bool {
		if s == nil {
			return false
		}
		path = append(path, s)
		if pred(s) {
			return true
		}
		for _, c := range children(s) {
			if walk(c) {
				return true
			}
		}
		path = path[:len(path)-1]
		return false
	}
	if walk(body) {
		return path
	}
	return nil
}

// children returns the sub-statements of s. A block's init is searched
// before its body when it holds blocks (Blockize puts the init of a
// reduction's inner block there, as a loop nest).
func children(s ir.Stmt) []ir.Stmt {
	switch s := s.(type) {
	case *ir.For:
		return []ir.Stmt{s.Body}
	case *ir.BlockRealize:
		if s.Block.Init != nil && len(childRealizes(s.Block.Init)) > 0 {
			return []ir.Stmt{s.Block.Init, s.Block.Body}
		}
		return []ir.Stmt{s.Block.Body}
	case *ir.SeqStmt:
		return s.Seq
	case *ir.IfThenElse:
		if s.Else != nil {
			return []ir.Stmt{s.Then, s.Else}
		}
		return []ir.Stmt{s.Then}
	case *ir.LetStmt:
		return []ir.Stmt{s.Body}
	case *ir.Allocate:
		return []ir.Stmt{s.Body}
	case *ir.DeclBuffer:
		return []ir.Stmt{s.Body}
	case *ir.AttrStmt:
		return []ir.Stmt{s.Body}
	}
	return nil
}

// findBlock returns the path to the realize of block name, or nil.
func findBlock(body ir.Stmt, name string) []ir.Stmt {
	return findPath(body, func(s ir.Stmt) bool {
		br, ok := s.(*ir.BlockRealize)
		return ok && br.Block.Name == name
	})
}

// block resolves a block handle; errors start with "prim: " unless prim
// is empty.
func (s *Schedule) block(prim string, b BlockRV) (site, error) {
	if b.id < 1 || b.id > len(s.blocks) {
		return site{}, prefixed(prim, fmt.Errorf("block handle %q does not belong to this schedule", b.name))
	}
	e := s.blocks[b.id-1]
	if e.gone != "" {
		return site{}, prefixed(prim, fmt.Errorf("block %q no longer exists (%s)", b.name, e.gone))
	}
	p := findBlock(s.fn.Body, e.name)
	if p == nil {
		return site{}, prefixed(prim, fmt.Errorf("block %q no longer exists", e.name))
	}
	return site{path: p}, nil
}

// loop resolves a loop handle; errors start with "prim: " unless prim is
// empty.
func (s *Schedule) loop(prim string, l LoopRV) (site, error) {
	if l.v == nil {
		return site{}, prefixed(prim, errors.New("nil loop handle"))
	}
	p := findPath(s.fn.Body, func(st ir.Stmt) bool {
		f, ok := st.(*ir.For)
		return ok && f.Var == l.v
	})
	if p == nil {
		return site{}, prefixed(prim, fmt.Errorf("loop %q no longer exists", l.v.Name))
	}
	return site{path: p}, nil
}

func prefixed(prim string, err error) error {
	if prim == "" {
		return err
	}
	return fmt.Errorf("%s: %w", prim, err)
}

// GetLoops returns the loops around block b, outermost first, up to the
// block enclosing it.
func (s *Schedule) GetLoops(b BlockRV) ([]LoopRV, error) {
	st, err := s.block("get_loops", b)
	if err != nil {
		return nil, err
	}
	var out []LoopRV
	for _, f := range st.loops() {
		out = append(out, LoopRV{v: f.Var})
	}
	s.record("%ssch.get_loops(%s)", s.assignLoops(out), s.bn(b))
	return out, nil
}

// GetChildBlocks returns the blocks directly inside loop l (not inside
// another block), in program order.
func (s *Schedule) GetChildBlocks(l LoopRV) ([]BlockRV, error) {
	st, err := s.loop("get_child_blocks", l)
	if err != nil {
		return nil, err
	}
	var out []BlockRV
	names := make([]string, 0, 1)
	for _, br := range childRealizes(st.loop().Body) {
		b := s.blockRV(br.Block.Name)
		out = append(out, b)
		names = append(names, s.bn(b))
	}
	lhs := strings.Join(names, ", ") + " = "
	switch len(names) {
	case 0:
		lhs = ""
	case 1:
		lhs = names[0] + ", = "
	}
	s.record("%ssch.get_child_blocks(%s)", lhs, s.ln(l))
	return out, nil
}

// childRealizes returns the block realizes in s that are not inside
// another block, in program order.
func childRealizes(s ir.Stmt) []*ir.BlockRealize {
	var out []*ir.BlockRealize
	var walk func(ir.Stmt)
	walk = func(s ir.Stmt) {
		if br, ok := s.(*ir.BlockRealize); ok {
			out = append(out, br)
			return
		}
		for _, c := range children(s) {
			walk(c)
		}
	}
	walk(s)
	return out
}

// empty is the statement that stands for a removed one while rewriting.
func empty() ir.Stmt { return &ir.SeqStmt{} }

func isEmpty(s ir.Stmt) bool {
	q, ok := s.(*ir.SeqStmt)
	return s == nil || ok && len(q.Seq) == 0
}

// replace returns body with the statements in repl (by identity) replaced;
// a nil replacement removes the statement, and loops left empty go too.
func replace(body ir.Stmt, repl map[ir.Stmt]ir.Stmt) ir.Stmt {
	r := &ir.Rewriter{
		PreStmt: func(s ir.Stmt) (ir.Stmt, bool) {
			n, ok := repl[s]
			if !ok {
				return nil, false
			}
			if n == nil {
				return empty(), true
			}
			return n, true
		},
		Stmt: func(s ir.Stmt) ir.Stmt {
			switch n := s.(type) {
			case *ir.SeqStmt:
				for _, c := range n.Seq {
					if _, nested := c.(*ir.SeqStmt); nested || c == nil {
						return ir.Seq(n.Seq...)
					}
				}
			case *ir.For:
				if isEmpty(n.Body) {
					return empty()
				}
			case *ir.BlockRealize:
				if n.Block.Name != ir.RootBlockName && isEmpty(n.Block.Body) {
					return empty()
				}
			}
			return s
		},
	}
	return rewrite(r, body)
}

// commit installs a new body after checking it, so that a primitive that
// would produce ill-formed IR fails instead (a bug, reported as one).
func (s *Schedule) commit(prim string, body ir.Stmt) error {
	f := s.fn.WithBody(body)
	if err := ir.Verify(f); err != nil {
		return fmt.Errorf("%s: internal error: the result is ill-formed: %w", prim, err)
	}
	s.fn = f
	return nil
}

// uniqueName returns base, or base_1, base_2 … when a block or buffer of
// the function already has the name.
func (s *Schedule) uniqueName(base string) string {
	used := map[string]bool{}
	for _, b := range s.fn.BufferMap {
		used[b.Name] = true
	}
	ir.Visit(s.fn.Body, func(n ir.Node) bool {
		if b, ok := n.(*ir.Block); ok {
			used[b.Name] = true
			for _, a := range b.AllocBuffers {
				used[a.Name] = true
			}
		}
		return true
	})
	name := base
	for i := 1; used[name]; i++ {
		name = fmt.Sprintf("%s_%d", base, i)
	}
	return name
}

// usesVar reports whether e mentions any of the variables.
func usesVar(e ir.Node, vars map[*ir.Var]bool) bool {
	found := false
	ir.Visit(e, func(n ir.Node) bool {
		if v, ok := n.(*ir.Var); ok && vars[v] {
			found = true
		}
		return !found
	})
	return found
}

// rewrite runs r over s, rewriting sequences child by child itself: the
// ir.Rewriter of this tree drops a change to the first statement of a
// SeqStmt (reported upstream), and every primitive depends on sequences.
func rewrite(r *ir.Rewriter, s ir.Stmt) ir.Stmt {
	w := *r
	pre := r.PreStmt
	w.PreStmt = func(st ir.Stmt) (ir.Stmt, bool) {
		if pre != nil {
			if ns, ok := pre(st); ok {
				return ns, true
			}
		}
		q, ok := st.(*ir.SeqStmt)
		if !ok {
			return nil, false
		}
		seq := make([]ir.Stmt, len(q.Seq))
		changed := false
		for i, c := range q.Seq {
			seq[i] = w.RewriteStmt(c)
			changed = changed || seq[i] != c
		}
		var out ir.Stmt = q
		if changed {
			out = &ir.SeqStmt{Seq: seq}
		}
		if w.Stmt != nil {
			out = w.Stmt(out)
		}
		return out, true
	}
	return w.RewriteStmt(s)
}

// substitute replaces uses of the variables in vmap in s (loop variables:
// they never occur in buffer shapes).
func substitute(s ir.Stmt, vmap map[*ir.Var]ir.Expr) ir.Stmt {
	return rewrite(&ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
		if v, ok := e.(*ir.Var); ok {
			if x, ok := vmap[v]; ok {
				return x
			}
		}
		return e
	}}, s)
}

// BlockRealize returns the realize of the block b names now (after the
// renames that primitives make), for code that inspects a block's
// iteration variables, bindings and regions. The node is part of the
// immutable IR: it must not be modified.
func (s *Schedule) BlockRealize(b BlockRV) (*ir.BlockRealize, error) {
	st, err := s.block("", b)
	if err != nil {
		return nil, err
	}
	return st.realize(), nil
}

// LoopFor returns the loop l names now. The node is part of the
// immutable IR: it must not be modified.
func (s *Schedule) LoopFor(l LoopRV) (*ir.For, error) {
	st, err := s.loop("", l)
	if err != nil {
		return nil, err
	}
	return st.loop(), nil
}
