package schedule

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// TensorIntrin is a tensor intrinsic for Tensorize (TVM's TensorIntrin):
// Desc describes the computation it performs and Impl gives the
// statement that performs it. Desc's body is, inside its root block, a
// nest of constant loops around one block whose bindings are those loops'
// variables and whose body is one store; it accesses each parameter
// buffer at the block's variables plus constants. Impl receives, in the
// order of Desc's parameters, the region of the real buffer each one
// matched (its last dimensions span the parameter's shape, the others one
// element), and returns the statement computing the block over them.
type TensorIntrin struct {
	Name string
	Desc *ir.PrimFunc
	Impl func(regions []ir.BufferRegion) (ir.Stmt, error)
}

var intrins = struct {
	sync.Mutex
	m map[string]*TensorIntrin
}{m: map[string]*TensorIntrin{}}

// RegisterTensorIntrin makes in known to Tensorize by its name, which
// must be new; its description must have the form TensorIntrin says.
func RegisterTensorIntrin(in *TensorIntrin) error {
	if in == nil || in.Name == "" || in.Desc == nil || in.Impl == nil {
		return errors.New("register_tensor_intrin: an intrinsic needs a name, a description and an implementation")
	}
	if _, _, err := descParts(in.Desc); err != nil {
		return fmt.Errorf("register_tensor_intrin: %q: %w", in.Name, err)
	}
	intrins.Lock()
	defer intrins.Unlock()
	if intrins.m[in.Name] != nil {
		return fmt.Errorf("register_tensor_intrin: %q is registered already", in.Name)
	}
	intrins.m[in.Name] = in
	return nil
}

// TensorIntrins lists the registered intrinsics' names, sorted.
func TensorIntrins() []string {
	intrins.Lock()
	defer intrins.Unlock()
	var out []string
	for n := range intrins.m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func lookupIntrin(name string) (*TensorIntrin, error) {
	intrins.Lock()
	defer intrins.Unlock()
	if in := intrins.m[name]; in != nil {
		return in, nil
	}
	var names []string
	for n := range intrins.m {
		names = append(names, n)
	}
	sort.Strings(names)
	return nil, fmt.Errorf("no tensor intrinsic %q (registered: %v)", name, names)
}

// descParts returns the loops and the block of a description.
func descParts(f *ir.PrimFunc) ([]*ir.For, *ir.BlockRealize, error) {
	root := ir.RootBlock(f.Body)
	if root == nil {
		return nil, nil, errors.New("the description's body is not a root block")
	}
	var loops []*ir.For
	st := root.Body
	for {
		if f, ok := st.(*ir.For); ok {
			if _, ok := ir.IsConstInt(f.Extent); !ok {
				return nil, nil, fmt.Errorf("loop %q of the description has a symbolic extent", f.Var.Name)
			}
			if c, ok := ir.IsConstInt(f.Min); !ok || c != 0 {
				return nil, nil, fmt.Errorf("loop %q of the description does not start at 0", f.Var.Name)
			}
			loops = append(loops, f)
			st = f.Body
			continue
		}
		break
	}
	br, ok := st.(*ir.BlockRealize)
	if !ok {
		return nil, nil, errors.New("the description is not a loop nest around one block")
	}
	if _, ok := br.Block.Body.(*ir.BufferStore); !ok || br.Block.Init != nil {
		return nil, nil, errors.New("the description's block is not one store without init")
	}
	for i, v := range br.IterValues {
		lv, ok := v.(*ir.Var)
		if !ok || !slices.ContainsFunc(loops, func(f *ir.For) bool { return f.Var == lv }) {
			return nil, nil, fmt.Errorf("the description binds %q to %s, not to one of its loops", br.Block.IterVars[i].Var.Name, v)
		}
	}
	return loops, br, nil
}

// Tensorize replaces the loop nest under loop l by tensor intrinsic name
// (TVM's sch.tensorize): it blockizes l (see Blockize), matches the block
// under it against the intrinsic's description (the same loop extents in
// the same order, the same computation, each buffer of the description
// at one place of a real buffer) and makes the intrinsic's implementation
// for the matched regions the body of the new block, name_o. A
// reduction's init stays in name_o, as Blockize moved it (a loop nest).
func (s *Schedule) Tensorize(l LoopRV, name string) error {
	if err := s.tensorize(l, name); err != nil {
		return fmt.Errorf("tensorize: %w", err)
	}
	s.record("sch.tensorize(%s, %q)", s.ln(l), name)
	return nil
}

func (s *Schedule) tensorize(l LoopRV, name string) error {
	in, err := lookupIntrin(name)
	if err != nil {
		return err
	}
	oname, body, err := s.blockized(l)
	if err != nil {
		return err
	}
	path := findBlock(body, oname)
	obr := path[len(path)-1].(*ir.BlockRealize)
	dloops, dbr, _ := descParts(in.Desc)
	var aloops []*ir.For
	st := obr.Block.Body
	for {
		f, ok := st.(*ir.For)
		if !ok {
			break
		}
		aloops = append(aloops, f)
		st = f.Body
	}
	abr := st.(*ir.BlockRealize)
	ablk := abr.Block
	if len(aloops) != len(dloops) {
		return fmt.Errorf("%q has %d loops, the nest under loop %q %d", name, len(dloops), aloops[0].Var.Name, len(aloops))
	}
	loopMap := map[*ir.Var]ir.Expr{}
	for k, df := range dloops {
		de, _ := ir.IsConstInt(df.Extent)
		ae, ok := ir.IsConstInt(aloops[k].Extent)
		if mn, ok2 := ir.IsConstInt(aloops[k].Min); !ok || !ok2 || ae != de || mn != 0 {
			return fmt.Errorf("loop %q runs over %s from %s, loop %d of %q over %d from 0", aloops[k].Var.Name, aloops[k].Extent, aloops[k].Min, k, name, de)
		}
		loopMap[df.Var] = aloops[k].Var
	}
	m := &matcher{
		intrin: name, block: ablk.Name, bufs: map[*ir.Buffer]*ir.Buffer{}, at: map[*ir.Buffer][]ir.Expr{},
		dvals: map[*ir.Var]ir.Expr{}, avals: map[*ir.Var]ir.Expr{}, inner: map[*ir.Var]bool{},
		innerBounds: loopBounds(aloops),
	}
	for i, iv := range dbr.Block.IterVars {
		m.dvals[iv.Var] = ir.SubstituteExpr(dbr.IterValues[i], loopMap)
	}
	for i, iv := range ablk.IterVars {
		m.avals[iv.Var] = abr.IterValues[i]
	}
	for _, f := range aloops {
		m.inner[f.Var] = true
	}
	if err := m.stmt(dbr.Block.Body, ablk.Body); err != nil {
		return err
	}
	regions := make([]ir.BufferRegion, len(in.Desc.Params))
	for i, p := range in.Desc.Params {
		db := in.Desc.BufferMap[p]
		ab := m.bufs[db]
		if ab == nil {
			return fmt.Errorf("%q does not access its buffer %q", name, db.Name)
		}
		off := m.at[db]
		lead := len(ab.Shape) - len(db.Shape)
		rg := make([]ir.Range, len(ab.Shape))
		for d := range ab.Shape {
			ext := ir.NewIntImm(off[d].DType(), 1)
			if d >= lead {
				c, _ := ir.IsConstInt(db.Shape[d-lead])
				ext = ir.NewIntImm(off[d].DType(), c)
			}
			rg[d] = ir.Range{Min: off[d], Extent: ext}
		}
		regions[i] = ir.BufferRegion{Buffer: ab, Region: rg}
	}
	impl, err := in.Impl(regions)
	if err != nil {
		return fmt.Errorf("%q: %w", name, err)
	}
	nblk := *obr.Block
	nblk.Body = impl
	if abr.Predicate != nil {
		if c, ok := ir.IsConstInt(abr.Predicate); !ok || c == 0 {
			return fmt.Errorf("block %q runs under the predicate %s: the intrinsic would compute the padding too (pad_einsum first)", ablk.Name, abr.Predicate)
		}
	}
	return s.commit("tensorize", replace(body, map[ir.Stmt]ir.Stmt{obr: &ir.BlockRealize{IterValues: obr.IterValues, Predicate: obr.Predicate, Block: &nblk}}))
}

// matcher compares a description's block body with a real one.
type matcher struct {
	intrin, block string
	bufs          map[*ir.Buffer]*ir.Buffer // description → real
	at            map[*ir.Buffer][]ir.Expr  // description buffer → offsets in the real one
	dvals, avals  map[*ir.Var]ir.Expr       // iteration variables → bindings over the real inner loops
	inner         map[*ir.Var]bool
	innerBounds   bounds // the ranges of the inner loops
}

func (m *matcher) fail(format string, a ...any) error {
	return fmt.Errorf("block %q does not match %q: %s", m.block, m.intrin, fmt.Sprintf(format, a...))
}

func (m *matcher) stmt(d, a ir.Stmt) error {
	ds, ok1 := d.(*ir.BufferStore)
	as, ok2 := a.(*ir.BufferStore)
	if !ok1 || !ok2 {
		return m.fail("its body is not one store")
	}
	if err := m.access(ds.Buffer, as.Buffer, ds.Indices, as.Indices); err != nil {
		return err
	}
	return m.expr(ds.Value, as.Value)
}

func (m *matcher) expr(d, a ir.Expr) error {
	switch dn := d.(type) {
	case *ir.BufferLoad:
		an, ok := a.(*ir.BufferLoad)
		if !ok {
			return m.fail("%s is not a load like %s", a, d)
		}
		return m.access(dn.Buffer, an.Buffer, dn.Indices, an.Indices)
	case *ir.Binary:
		an, ok := a.(*ir.Binary)
		if !ok || an.Op != dn.Op {
			return m.fail("%s is not %s", a, d)
		}
		if err := m.expr(dn.A, an.A); err != nil {
			return err
		}
		return m.expr(dn.B, an.B)
	case *ir.Cast:
		an, ok := a.(*ir.Cast)
		if !ok || an.Type != dn.Type {
			return m.fail("%s is not %s", a, d)
		}
		return m.expr(dn.Value, an.Value)
	case *ir.Call:
		an, ok := a.(*ir.Call)
		if !ok || an.Op != dn.Op || len(an.Args) != len(dn.Args) {
			return m.fail("%s is not %s", a, d)
		}
		for i := range dn.Args {
			if err := m.expr(dn.Args[i], an.Args[i]); err != nil {
				return err
			}
		}
		return nil
	}
	if !ir.Equal(d, a) {
		return m.fail("%s is not %s", a, d)
	}
	return nil
}

// access matches the description's access db[di] with the real ab[ai]:
// the leading dimensions of ab are fixed offsets, the others the
// description's index plus an offset that the inner loops do not change.
// Indices with floordiv and floormod (a layout's lane and element) are
// compared once simplified over the ranges of the inner loops: the
// terms of a division's dividend that its divisor divides leave it, and
// what is left divides to a constant when its range says so.
func (m *matcher) access(db, ab *ir.Buffer, di, ai []ir.Expr) error {
	if db.DType != ab.DType {
		return m.fail("%q is %s, the intrinsic's %q %s", ab.Name, ab.DType, db.Name, db.DType)
	}
	if prev, ok := m.bufs[db]; ok && prev != ab {
		return m.fail("the intrinsic's %q would be both %q and %q", db.Name, prev.Name, ab.Name)
	}
	for d, x := range m.bufs {
		if x == ab && d != db {
			return m.fail("%q would be both the intrinsic's %q and %q", ab.Name, d.Name, db.Name)
		}
	}
	lead := len(ai) - len(di)
	if lead < 0 {
		return m.fail("%q has fewer dimensions than the intrinsic's %q", ab.Name, db.Name)
	}
	off := make([]ir.Expr, len(ai))
	for d, x := range ai {
		real := ir.SubstituteExpr(x, m.avals)
		var want ir.Expr
		av := toAffine(real)
		if d >= lead {
			want = retypeLike(ir.SubstituteExpr(di[d-lead], m.dvals), x)
			av = av.add(toAffine(want), -1)
		}
		e := av.expr()
		if usesVar(e, m.inner) {
			// Simplify each side first, so that equal floordiv and
			// floormod atoms cancel.
			sa := toAffine(m.innerBounds.simplify(real))
			if want != nil {
				sa = sa.add(toAffine(m.innerBounds.simplify(want)), -1)
			}
			e = m.innerBounds.simplify(sa.expr())
		}
		if usesVar(e, m.inner) {
			if want != nil {
				return m.fail("%q is accessed at %s in dimension %d, not at the intrinsic's %q index %s plus an offset: the two differ by %s", ab.Name, x, d, db.Name, di[d-lead], e)
			}
			return m.fail("%q is accessed at %s in dimension %d, which the loops of the intrinsic change", ab.Name, x, d)
		}
		off[d] = e
	}
	if prev, ok := m.at[db]; ok {
		for d := range off {
			if !ir.Equal(toAffine(prev[d]).add(toAffine(off[d]), -1).expr(), ir.NewIntImm(off[d].DType(), 0)) {
				return m.fail("%q is accessed at two places", ab.Name)
			}
		}
	}
	m.bufs[db] = ab
	m.at[db] = off
	return nil
}

// retypeLike casts the constants of e to the type of like.
func retypeLike(e, like ir.Expr) ir.Expr {
	t := like.DType()
	if e.DType() == t {
		return e
	}
	return (&ir.Rewriter{Expr: func(x ir.Expr) ir.Expr {
		switch n := x.(type) {
		case *ir.IntImm:
			return ir.NewIntImm(t, n.Value)
		case *ir.Var:
			if n.Type != t {
				return ir.NewCast(t, n)
			}
		}
		return x
	}}).RewriteExpr(e)
}
