package schedule

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Split splits loop l into len(factors) nested loops, outermost first,
// whose extents are the factors (TVM's sch.split). At most one factor may
// be -1: it is inferred as ceil(extent / product of the others). When the
// factors do not divide the extent exactly (or the extent is symbolic),
// the blocks under the loop get the predicate that keeps them inside the
// original range. The new loops are named l_0, l_1 … and are serial; l
// must be serial.
func (s *Schedule) Split(l LoopRV, factors ...int64) ([]LoopRV, error) {
	out, err := s.split(l, factors)
	if err != nil {
		return nil, fmt.Errorf("split: %w", err)
	}
	s.record("%ssch.split(loop=%s, factors=%s)", s.assignLoops(out), s.ln(l), pyInts(factors, true))
	return out, nil
}

func (s *Schedule) split(l LoopRV, factors []int64) ([]LoopRV, error) {
	st, err := s.loop("", l)
	if err != nil {
		return nil, err
	}
	f := st.loop()
	if len(factors) < 2 {
		return nil, fmt.Errorf("loop %q needs at least two factors, got %d", f.Var.Name, len(factors))
	}
	if f.Kind != ir.ForSerial {
		return nil, fmt.Errorf("loop %q is %s; split loops before changing their kind", f.Var.Name, f.Kind)
	}
	infer, prod := -1, int64(1)
	for i, x := range factors {
		switch {
		case x == -1 && infer >= 0:
			return nil, fmt.Errorf("factors %v of loop %q: at most one may be -1", factors, f.Var.Name)
		case x == -1:
			infer = i
		case x < 1:
			return nil, fmt.Errorf("factor %d of loop %q is %d, want a positive integer or -1", i, f.Var.Name, x)
		default:
			prod *= x
		}
	}
	t := f.Var.Type
	extents := make([]ir.Expr, len(factors))
	for i, x := range factors {
		extents[i] = ir.NewIntImm(t, x)
	}
	ext, constExt := ir.IsConstInt(f.Extent)
	guard := false
	switch {
	case infer >= 0 && constExt:
		q := (ext + prod - 1) / prod
		extents[infer] = ir.NewIntImm(t, q)
		guard = q*prod != ext
	case infer >= 0:
		if prod == 1 {
			extents[infer] = f.Extent
		} else {
			extents[infer] = ir.NewBinary(ir.OpFloorDiv, ir.NewBinary(ir.OpAdd, f.Extent, ir.NewIntImm(t, prod-1)), ir.NewIntImm(t, prod))
			guard = true
		}
	case constExt:
		if prod < ext {
			return nil, fmt.Errorf("factors %v of loop %q cover %d iterations, the loop has %d", factors, f.Var.Name, prod, ext)
		}
		guard = prod != ext
	default:
		return nil, fmt.Errorf("loop %q has the symbolic extent %s; give one factor as -1", f.Var.Name, f.Extent)
	}
	vars := make([]*ir.Var, len(factors))
	for i := range factors {
		vars[i] = ir.NewVar(fmt.Sprintf("%s_%d", f.Var.Name, i), t)
	}
	// fused = ((v0 * e1 + v1) * e2 + v2) …
	var fused ir.Expr = vars[0]
	for i := 1; i < len(vars); i++ {
		fused = ir.NewBinary(ir.OpAdd, ir.NewBinary(ir.OpMul, fused, extents[i]), vars[i])
	}
	fused = bounds{}.simplify(fused)
	value := fused
	if mn, ok := ir.IsConstInt(f.Min); !ok || mn != 0 {
		value = bounds{}.simplify(ir.NewBinary(ir.OpAdd, f.Min, fused))
	}
	body := substitute(f.Body, map[*ir.Var]ir.Expr{f.Var: value})
	if guard {
		body = addPredicate(body, ir.NewBinary(ir.OpLT, fused, f.Extent))
	}
	var nest ir.Stmt = body
	for i := len(vars) - 1; i >= 0; i-- {
		nest = &ir.For{Var: vars[i], Min: ir.NewIntImm(t, 0), Extent: extents[i], Kind: ir.ForSerial, Body: nest}
	}
	nest = simplifyBindings(nest, st.loops())
	if err := s.commit("split", replace(s.fn.Body, map[ir.Stmt]ir.Stmt{f: nest})); err != nil {
		return nil, err
	}
	out := make([]LoopRV, len(vars))
	for i, v := range vars {
		out[i] = LoopRV{v: v}
	}
	return out, nil
}

// addPredicate conjoins cond to the predicates of the block realizes in s
// (not those nested in other blocks).
func addPredicate(s ir.Stmt, cond ir.Expr) ir.Stmt {
	return rewrite(&ir.Rewriter{PreStmt: func(st ir.Stmt) (ir.Stmt, bool) {
		br, ok := st.(*ir.BlockRealize)
		if !ok {
			return nil, false
		}
		return &ir.BlockRealize{IterValues: br.IterValues, Predicate: conjoin(br.Predicate, cond), Block: br.Block}, true
	}}, s)
}

func conjoin(a, b ir.Expr) ir.Expr {
	if a == nil {
		return b
	}
	if c, ok := ir.IsConstInt(a); ok && c != 0 {
		return b
	}
	return ir.NewBinary(ir.OpAnd, a, b)
}

// Fuse fuses directly nested serial loops, outermost first, into one loop
// named after them (i_j_fused) whose extent is the product of theirs
// (TVM's sch.fuse). Each loop must be the only statement in the one
// before.
func (s *Schedule) Fuse(loops ...LoopRV) (LoopRV, error) {
	out, err := s.fuse(loops)
	if err != nil {
		return LoopRV{}, fmt.Errorf("fuse: %w", err)
	}
	s.record("%s = sch.fuse(%s)", s.ln(out), s.lns(loops))
	return out, nil
}

func (s *Schedule) fuse(loops []LoopRV) (LoopRV, error) {
	if len(loops) < 2 {
		return LoopRV{}, fmt.Errorf("needs at least two loops, got %d", len(loops))
	}
	fors := make([]*ir.For, len(loops))
	var top site
	for i, l := range loops {
		st, err := s.loop("", l)
		if err != nil {
			return LoopRV{}, err
		}
		if i == 0 {
			top = st
		}
		fors[i] = st.loop()
		if fors[i].Kind != ir.ForSerial {
			return LoopRV{}, fmt.Errorf("loop %q is %s; fuse loops before changing their kind", fors[i].Var.Name, fors[i].Kind)
		}
		if i > 0 {
			if fors[i-1].Body != ir.Stmt(fors[i]) {
				return LoopRV{}, fmt.Errorf("loop %q is not directly and alone inside loop %q", fors[i].Var.Name, fors[i-1].Var.Name)
			}
			if fors[i].Var.Type != fors[0].Var.Type {
				return LoopRV{}, fmt.Errorf("loops %q and %q have different dtypes %s and %s", fors[0].Var.Name, fors[i].Var.Name, fors[0].Var.Type, fors[i].Var.Type)
			}
		}
	}
	own := map[*ir.Var]bool{}
	for _, f := range fors {
		own[f.Var] = true
	}
	for _, f := range fors {
		if usesVar(f.Min, own) || usesVar(f.Extent, own) {
			return LoopRV{}, fmt.Errorf("the bounds of loop %q depend on the loops being fused", f.Var.Name)
		}
	}
	t := fors[0].Var.Type
	names := make([]string, len(fors))
	for i, f := range fors {
		names[i] = f.Var.Name
	}
	fv := ir.NewVar(strings.Join(names, "_")+"_fused", t)
	b := bounds{}
	var extent ir.Expr = fors[0].Extent
	for _, f := range fors[1:] {
		extent = b.simplify(ir.NewBinary(ir.OpMul, extent, f.Extent))
	}
	vmap := map[*ir.Var]ir.Expr{}
	var inner ir.Expr = ir.NewIntImm(t, 1) // product of the extents inside loop i
	for i := len(fors) - 1; i >= 0; i-- {
		f := fors[i]
		var v ir.Expr = fv
		if c, ok := ir.IsConstInt(inner); !ok || c != 1 {
			v = ir.NewBinary(ir.OpFloorDiv, v, inner)
		}
		if i > 0 {
			v = ir.NewBinary(ir.OpFloorMod, v, f.Extent)
		}
		if mn, ok := ir.IsConstInt(f.Min); !ok || mn != 0 {
			v = ir.NewBinary(ir.OpAdd, v, f.Min)
		}
		vmap[f.Var] = b.simplify(v)
		inner = b.simplify(ir.NewBinary(ir.OpMul, inner, f.Extent))
	}
	body := substitute(fors[len(fors)-1].Body, vmap)
	var nest ir.Stmt = &ir.For{Var: fv, Min: ir.NewIntImm(t, 0), Extent: extent, Kind: ir.ForSerial, Body: body}
	nest = simplifyBindings(nest, top.loops())
	if err := s.commit("fuse", replace(s.fn.Body, map[ir.Stmt]ir.Stmt{fors[0]: nest})); err != nil {
		return LoopRV{}, err
	}
	return LoopRV{v: fv}, nil
}

// Reorder reorders loops of one nest (TVM's sch.reorder): the given loops
// take the positions the same loops held, in the given order; loops of the
// nest not given stay where they are. From the outermost given loop to the
// innermost one, each loop must be the only statement in the one before,
// and no loop's bounds may depend on another of these loops.
func (s *Schedule) Reorder(loops ...LoopRV) error {
	if err := s.reorder(loops); err != nil {
		return fmt.Errorf("reorder: %w", err)
	}
	s.record("sch.reorder(%s)", s.lns(loops))
	return nil
}

func (s *Schedule) reorder(loops []LoopRV) error {
	if len(loops) == 0 {
		return errors.New("no loops given")
	}
	sites := make([]site, len(loops))
	given := map[*ir.For]bool{}
	deepest := 0
	for i, l := range loops {
		st, err := s.loop("", l)
		if err != nil {
			return err
		}
		if given[st.loop()] {
			return fmt.Errorf("loop %q is given twice", l)
		}
		given[st.loop()] = true
		sites[i] = st
		if len(st.path) > len(sites[deepest].path) {
			deepest = i
		}
	}
	// The chain is the deepest loop's ancestors from the outermost given
	// loop down.
	path := sites[deepest].path
	start := -1
	for i, p := range path {
		if f, ok := p.(*ir.For); ok && given[f] {
			start = i
			break
		}
	}
	var chain []*ir.For
	for i, p := range path[start:] {
		f, ok := p.(*ir.For)
		if !ok {
			next := sites[deepest].loop()
			for _, q := range path[start+i:] {
				if g, ok := q.(*ir.For); ok {
					next = g
					break
				}
			}
			return fmt.Errorf("loop %q has statements beside loop %q", chain[len(chain)-1].Var.Name, next.Var.Name)
		}
		chain = append(chain, f)
	}
	for _, st := range sites {
		if !slices.Contains(chain, st.loop()) {
			return fmt.Errorf("loop %q is not in the nest of loop %q", st.loop().Var.Name, sites[deepest].loop().Var.Name)
		}
	}
	vars := map[*ir.Var]bool{}
	for i, f := range chain {
		if i < len(chain)-1 && f.Body != ir.Stmt(chain[i+1]) {
			return fmt.Errorf("loop %q has statements beside loop %q", f.Var.Name, chain[i+1].Var.Name)
		}
		vars[f.Var] = true
	}
	for _, f := range chain {
		if usesVar(f.Min, vars) || usesVar(f.Extent, vars) {
			return fmt.Errorf("the bounds of loop %q depend on the loops being reordered", f.Var.Name)
		}
	}
	order := slices.Clone(chain)
	next := 0
	for i, f := range chain {
		if given[f] {
			order[i] = sites[next].loop()
			next++
		}
	}
	body := chain[len(chain)-1].Body
	for i := len(order) - 1; i >= 0; i-- {
		c := *order[i]
		c.Body = body
		body = &c
	}
	return s.commit("reorder", replace(s.fn.Body, map[ir.Stmt]ir.Stmt{chain[0]: body}))
}
