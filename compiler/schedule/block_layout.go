package schedule

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// TransformBlockLayout remaps the iteration space of block b through m
// (TVM's sch.transform_block_layout): the block's iteration variables
// become the indices m gives, over the image of the old domain, and new
// loops, one per new variable, replace the block's loops. m must fuse
// and permute the variables: each new index a sum of old variables times
// constants that reads as a mixed-radix number over their extents
// (lambda n, c, h, w: (n, c, h * 7 + w) over h and w of 7), every old
// variable in one index, and the variables of one index all spatial or
// all reductions. The block's loops must bind its iteration variables
// one each (in any order), hold nothing but the block and have its
// predicate true. Loads and stores at the fused variables read and write
// at the new ones: B[h, w] becomes B[v // 7, v % 7], and an access
// written in the fused form (B_flat[h * 7 + w]) at v itself.
func (s *Schedule) TransformBlockLayout(b BlockRV, m *IndexMap) error {
	if err := s.transformBlockLayout(b, m); err != nil {
		return fmt.Errorf("transform_block_layout: %w", err)
	}
	s.record("sch.transform_block_layout(%s, %s)", s.bn(b), m)
	return nil
}

// fusedIndex is one new iteration variable: the old ones it fuses,
// outermost first, with their coefficients.
type fusedIndex struct {
	vars  []int // positions among the block's iteration variables
	coefs []int64
	ext   int64
}

func (s *Schedule) transformBlockLayout(b BlockRV, m *IndexMap) error {
	bs, err := s.block("", b)
	if err != nil {
		return err
	}
	br := bs.realize()
	blk := br.Block
	if m == nil {
		return fmt.Errorf("nil index map")
	}
	if len(m.Vars) != len(blk.IterVars) {
		return fmt.Errorf("index map %s takes %d indices, block %q has %d iteration variables", m, len(m.Vars), blk.Name, len(blk.IterVars))
	}
	if c, ok := ir.IsConstInt(br.Predicate); br.Predicate != nil && (!ok || c == 0) {
		return fmt.Errorf("block %q runs under a predicate", blk.Name)
	}
	nest, _, ok := ownLoops(bs)
	if !ok {
		return fmt.Errorf("the loops of block %q do not bind its iteration variables one each with nothing else in them", blk.Name)
	}
	exts := make([]int64, len(blk.IterVars))
	for i, iv := range blk.IterVars {
		e, ok := ir.IsConstInt(iv.Dom.Extent)
		mn, ok2 := ir.IsConstInt(iv.Dom.Min)
		if !ok || !ok2 || mn != 0 {
			return fmt.Errorf("iteration variable %q of block %q has the domain [%s, %s + %s), want a constant one from 0", iv.Var.Name, blk.Name, iv.Dom.Min, iv.Dom.Min, iv.Dom.Extent)
		}
		exts[i] = e
	}
	idx, err := fusedIndices(m, exts)
	if err != nil {
		return fmt.Errorf("index map %s over block %q: %w", m, blk.Name, err)
	}
	// The new variables and, for each old one, its value in them.
	nblk := *blk
	nblk.IterVars = nil
	old := map[*ir.Var]ir.Expr{}
	var loopVars []*ir.Var
	var loopExts []ir.Expr
	bnd := bounds{}
	for k, fi := range idx {
		kind := blk.IterVars[fi.vars[0]].Kind
		t := blk.IterVars[fi.vars[0]].Var.Type
		names := make([]string, len(fi.vars))
		for j, i := range fi.vars {
			if blk.IterVars[i].Kind != kind {
				return fmt.Errorf("index %d of %s fuses %s and %s iteration variables of block %q", k, m, kind, blk.IterVars[i].Kind, blk.Name)
			}
			if blk.IterVars[i].Var.Type != t {
				return fmt.Errorf("index %d of %s fuses iteration variables of block %q of dtypes %s and %s", k, m, blk.Name, t, blk.IterVars[i].Var.Type)
			}
			names[j] = strings.TrimPrefix(blk.IterVars[i].Var.Name, "v_")
		}
		name := strings.Join(names, "_")
		nv := ir.NewVar("v_"+name, t)
		nblk.IterVars = append(nblk.IterVars, ir.IterVar{Var: nv, Dom: ir.RangeFromExtent(ir.NewIntImm(t, fi.ext)), Kind: kind})
		bnd[nv] = [2]int64{0, fi.ext - 1}
		for j, i := range fi.vars {
			var e ir.Expr = nv
			if c := fi.coefs[j]; c != 1 {
				e = ir.NewBinary(ir.OpFloorDiv, e, ir.NewIntImm(t, c))
			}
			if j > 0 {
				e = ir.NewBinary(ir.OpFloorMod, e, ir.NewIntImm(t, exts[i]))
			}
			old[blk.IterVars[i].Var] = e
		}
		lv := ir.NewVar(name, t)
		loopVars = append(loopVars, lv)
		loopExts = append(loopExts, ir.NewIntImm(t, fi.ext))
	}
	// Substitute, then fold floordiv(v, c)·c + floormod(v, c) back into v
	// (an access written in the fused form reads at the new variable).
	simp := &ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
		if !ir.IsIndexType(e.DType()) {
			return e
		}
		if n, ok := e.(*ir.Binary); ok && (n.Op == ir.OpAdd || n.Op == ir.OpSub || n.Op == ir.OpMul) {
			return recombineDivMod(toAffine(e)).expr()
		}
		return bnd.simplifyNode(e)
	}}
	sub := func(e ir.Expr) ir.Expr { return simp.RewriteExpr(ir.SubstituteExpr(e, old)) }
	nblk.Body = rewrite(&ir.Rewriter{Expr: func(e ir.Expr) ir.Expr {
		if v, ok := e.(*ir.Var); ok {
			if x, ok := old[v]; ok {
				return x
			}
		}
		return e
	}}, blk.Body)
	nblk.Body = rewrite(simp, nblk.Body)
	if blk.Init != nil {
		nblk.Init = rewrite(simp, substitute(blk.Init, old))
	}
	subRegions := func(rs []ir.BufferRegion) []ir.BufferRegion {
		out := make([]ir.BufferRegion, len(rs))
		for i, r := range rs {
			out[i] = ir.BufferRegion{Buffer: r.Buffer, Region: make([]ir.Range, len(r.Region))}
			for d, rg := range r.Region {
				out[i].Region[d] = ir.Range{Min: sub(rg.Min), Extent: sub(rg.Extent)}
			}
		}
		return out
	}
	nblk.Reads, nblk.Writes = subRegions(blk.Reads), subRegions(blk.Writes)
	vals := make([]ir.Expr, len(loopVars))
	for i, v := range loopVars {
		vals[i] = v
	}
	var inner ir.Stmt = &ir.BlockRealize{IterValues: vals, Predicate: br.Predicate, Block: &nblk}
	for i := len(loopVars) - 1; i >= 0; i-- {
		inner = &ir.For{Var: loopVars[i], Min: ir.NewIntImm(loopVars[i].Type, 0), Extent: loopExts[i], Kind: ir.ForSerial, Body: inner}
	}
	return s.commit("transform_block_layout", replace(s.fn.Body, map[ir.Stmt]ir.Stmt{nest[0]: inner}))
}

// ownLoops returns the innermost loops of the block at st when they bind
// its iteration variables one each (loopOf[i] binds variable i), in any
// order, serial from 0 over the variables' domains, nested with nothing
// else between them.
func ownLoops(st site) (nest, loopOf []*ir.For, ok bool) {
	br := st.realize()
	blk := br.Block
	loops := st.loops()
	k := len(blk.IterVars)
	if len(loops) < k || k == 0 || len(br.IterValues) != k {
		return nil, nil, false
	}
	nest = loops[len(loops)-k:]
	loopOf = make([]*ir.For, k)
	for i, f := range nest {
		var next ir.Stmt = br
		if i+1 < k {
			next = nest[i+1]
		}
		if f.Body != next || f.Kind != ir.ForSerial {
			return nil, nil, false
		}
		if mn, ok := ir.IsConstInt(f.Min); !ok || mn != 0 {
			return nil, nil, false
		}
		j := slices.IndexFunc(br.IterValues, func(e ir.Expr) bool { v, ok := e.(*ir.Var); return ok && v == f.Var })
		if j < 0 || loopOf[j] != nil || !ir.Equal(f.Extent, blk.IterVars[j].Dom.Extent) {
			return nil, nil, false
		}
		loopOf[j] = f
	}
	return nest, loopOf, true
}

// fusedIndices reads each index of m as a fusion of variables of extents
// exts (see TransformBlockLayout).
func fusedIndices(m *IndexMap, exts []int64) ([]fusedIndex, error) {
	pos := map[*ir.Var]int{}
	for i, v := range m.Vars {
		pos[v] = i
	}
	used := make([]bool, len(m.Vars))
	out := make([]fusedIndex, len(m.Indices))
	for k, e := range m.Indices {
		a := toAffine(e)
		if a.c != 0 {
			return nil, fmt.Errorf("index %d (%s) adds a constant", k, pyExpr(e, 0))
		}
		fi := fusedIndex{}
		for _, t := range a.terms {
			v, ok := t.atom.(*ir.Var)
			i, mine := pos[v]
			if !ok || !mine || t.coef <= 0 {
				return nil, fmt.Errorf("index %d (%s) is not a sum of the variables times positive constants", k, pyExpr(e, 0))
			}
			if used[i] {
				return nil, fmt.Errorf("variable %s is in more than one index", v.Name)
			}
			used[i] = true
			fi.vars, fi.coefs = append(fi.vars, i), append(fi.coefs, t.coef)
		}
		if len(fi.vars) == 0 {
			return nil, fmt.Errorf("index %d (%s) uses no variable", k, pyExpr(e, 0))
		}
		// Outermost (largest coefficient) first; each coefficient is the
		// next one's times its extent, the last 1.
		order := make([]int, len(fi.vars))
		for i := range order {
			order[i] = i
		}
		slices.SortFunc(order, func(x, y int) int { return int(fi.coefs[y] - fi.coefs[x]) })
		vars, coefs := make([]int, len(order)), make([]int64, len(order))
		for j, o := range order {
			vars[j], coefs[j] = fi.vars[o], fi.coefs[o]
		}
		fi.vars, fi.coefs = vars, coefs
		for j := range vars {
			want := int64(1)
			if j+1 < len(vars) {
				want = coefs[j+1] * exts[vars[j+1]]
			}
			if coefs[j] != want {
				return nil, fmt.Errorf("index %d (%s) is not one to one over the extents %v: %s takes %d, want %d", k, pyExpr(e, 0), exts, m.Vars[vars[j]].Name, coefs[j], want)
			}
		}
		fi.ext = coefs[0] * exts[vars[0]]
		out[k] = fi
	}
	for i, u := range used {
		if !u {
			return nil, fmt.Errorf("variable %s is in no index", m.Vars[i].Name)
		}
	}
	return out, nil
}

// recombineDivMod folds floordiv(x, c)·c·k + floormod(x, c)·k into x·k in
// a, repeatedly (the fused form of split variables).
func recombineDivMod(a affine) affine {
	for {
		changed := false
		for i, ti := range a.terms {
			d, ok := ti.atom.(*ir.Binary)
			if !ok || d.Op != ir.OpFloorDiv {
				continue
			}
			c, ok := ir.IsConstInt(d.B)
			if !ok || c <= 0 || ti.coef%c != 0 {
				continue
			}
			k := ti.coef / c
			j := slices.IndexFunc(a.terms, func(tj term) bool {
				mo, ok := tj.atom.(*ir.Binary)
				if !ok || mo.Op != ir.OpFloorMod || tj.coef != k || !ir.Equal(mo.A, d.A) {
					return false
				}
				cm, ok := ir.IsConstInt(mo.B)
				return ok && cm == c
			})
			if j < 0 {
				continue
			}
			rest := affine{t: a.t, c: a.c}
			for x, tx := range a.terms {
				if x != i && x != j {
					rest.terms = append(rest.terms, tx)
				}
			}
			a = rest.add(toAffine(d.A).scale(k), 1)
			changed = true
			break
		}
		if !changed {
			return a
		}
	}
}
