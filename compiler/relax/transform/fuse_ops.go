package transform

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// AttrPrimitive marks a graph function that FuseOps grouped, for FuseTIR
// to turn into one PrimFunc (int64 1).
const AttrPrimitive = "Primitive"

// maxFuseDepth bounds the number of bindings in one group (TVM's
// relax.FuseOps.max_depth default).
const maxFuseDepth = 256

// FuseOps groups the bindings of each dataflow block of the graph
// functions (those not marked Primitive) by TVM's fusion algorithm: the
// bindings form a dataflow graph whose nodes carry the op_pattern of the
// PrimFunc they call_tir (AnnotateTIROpPattern; other calls are opaque);
// over its post-dominator tree, an out-elementwise-fusable node (matmul,
// conv2d) absorbs the elementwise and broadcast nodes after it, an
// elementwise or broadcast node joins an injective or reduction
// successor, and injective chains and tuples merge in a later phase.
//
// Every group of two or more bindings becomes a private graph function
// named "fused_" followed by the callees' names joined with "_"
// ("fused_matmul_add_relu"), marked Primitive, taking the group's inputs
// (constants included) and returning its outputs; the group's bindings
// are replaced by one call of it. Structurally equal groups share one
// function. FuseTIR turns these functions into PrimFuncs.
func FuseOps(mod *ir.IRModule) (*ir.IRModule, error) {
	fz := &fusor{mod: mod, known: map[uint64][]string{}}
	changed := false
	for name, f := range mod.Funcs() {
		fn, ok := f.(*ir.Function)
		if !ok || isPrimitive(fn) {
			continue
		}
		var err error
		fz.names = map[string]int{}
		m := &ir.RMutator{}
		m.Block = func(b *ir.BindingBlock) *ir.BindingBlock {
			if !b.Dataflow || err != nil {
				return b
			}
			var nb *ir.BindingBlock
			nb, err = fz.block(b, m)
			return nb
		}
		g := m.RewriteFunc(fn)
		if err != nil {
			return nil, funcError(name, err)
		}
		if g != fn {
			fz.mod = fz.mod.With(name, g)
			changed = true
		}
	}
	if !changed {
		return mod, nil
	}
	return SortFunctions(fz.mod), nil
}

func isPrimitive(f *ir.Function) bool {
	switch v := f.Attrs[AttrPrimitive].(type) {
	case int64:
		return v != 0
	case bool:
		return v
	}
	return false
}

// A fnode is a node of the dataflow graph of a block: a binding, or a
// value used by one (a variable bound outside the block, a constant).
type fnode struct {
	index   int
	ref     any // *ir.RVar or *ir.Constant
	pattern OpPattern
	outputs []fedge
	extern  bool // used outside the block: a block output
	binding ir.Binding
}

type fedge struct {
	node    *fnode
	pattern OpPattern
}

// fgroup is a union-find set of nodes.
type fgroup struct {
	parent   *fgroup
	pattern  OpPattern
	numNodes int
	anchor   bool
}

func (g *fgroup) root() *fgroup {
	r := g
	for r.parent != nil {
		r = r.parent
	}
	for g != r { // path compression
		next := g.parent
		g.parent = r
		g = next
	}
	return r
}

// domNode is a node of the post-dominator tree.
type domNode struct {
	node    *fnode
	parent  *domNode
	depth   int
	pattern OpPattern
}

type fgraph struct {
	nodes  []*fnode // post-DFS order
	byRef  map[any]*fnode
	groups []*fgroup
	dom    []*domNode
}

func (g *fgraph) node(ref any) *fnode {
	if n, ok := g.byRef[ref]; ok {
		return n
	}
	n := &fnode{ref: ref, pattern: PatternOpaque}
	g.add(n)
	return n
}

func (g *fgraph) add(n *fnode) {
	n.index = len(g.nodes)
	g.nodes = append(g.nodes, n)
	if n.ref != nil {
		g.byRef[n.ref] = n
	}
}

func (g *fgraph) edge(from ir.RExpr, to *fnode, p OpPattern) {
	switch e := from.(type) {
	case *ir.RTuple:
		for _, f := range e.Fields {
			g.edge(f, to, p)
		}
	case *ir.RVar:
		n := g.node(e)
		n.outputs = append(n.outputs, fedge{to, p})
	case *ir.Constant:
		n := &fnode{ref: nil, pattern: PatternOpaque}
		g.add(n)
		n.outputs = append(n.outputs, fedge{to, p})
	}
}

// build makes the graph of a dataflow block.
func buildGraph(mod *ir.IRModule, b *ir.BindingBlock) *fgraph {
	g := &fgraph{byRef: map[any]*fnode{}}
	for _, bd := range b.Bindings {
		x := bd.BoundVar()
		n := &fnode{ref: x, binding: bd, extern: !x.Dataflow, pattern: PatternOpaque}
		vb, isVB := bd.(*ir.VarBinding)
		switch v := bd.BoundValue().(type) {
		case *ir.RCall:
			if o, ok := v.Op.(*ir.Op); ok && o.Name == ir.OpCallTIR && isVB && len(v.Args) >= 2 {
				if gv, ok := v.Args[0].(*ir.GlobalVar); ok {
					if f := mod.PrimFunc(gv.Name); f != nil {
						if p, ok := f.Attrs[ir.AttrOpPattern].(int64); ok {
							n.pattern = OpPattern(p)
						}
					}
				}
				g.edge(v.Args[1], n, n.pattern)
				break
			}
			for _, a := range v.Args {
				g.edge(a, n, PatternOpaque)
			}
		case *ir.TupleGetItem:
			if isVB {
				n.pattern = PatternInjective
			}
			g.edge(v.Tuple, n, n.pattern)
		case *ir.RTuple:
			if isVB {
				n.pattern = PatternTuple
			}
			g.edge(v, n, PatternInjective)
		default:
			ir.RPostOrderVisit(v, func(e ir.RExpr) {
				switch e.(type) {
				case *ir.RVar, *ir.Constant:
					g.edge(e, n, PatternOpaque)
				}
			})
		}
		_ = vb
		g.add(n)
	}
	return g
}

// postDom computes the post-dominator tree.
func (g *fgraph) postDom() {
	g.dom = make([]*domNode, len(g.nodes))
	for i := len(g.nodes) - 1; i >= 0; i-- {
		n := g.nodes[i]
		d := &domNode{node: n}
		if n.extern {
			d.depth, d.pattern = 1, PatternOpaque
		} else {
			pattern := PatternElemWise
			parent := g.lcaOf(n.outputs, &pattern)
			d.parent, d.pattern = parent, pattern
			d.depth = 1
			if parent != nil {
				d.depth = parent.depth + 1
			}
		}
		g.dom[i] = d
	}
}

func (g *fgraph) lcaOf(edges []fedge, pattern *OpPattern) *domNode {
	if len(edges) == 0 {
		return nil
	}
	parent := g.dom[edges[0].node.index]
	*pattern = max(*pattern, edges[0].pattern)
	for _, e := range edges[1:] {
		parent = lca(parent, g.dom[e.node.index], pattern)
		*pattern = max(*pattern, e.pattern)
	}
	return parent
}

func lca(l, r *domNode, pattern *OpPattern) *domNode {
	for l != r {
		if l == nil || r == nil {
			return nil
		}
		switch {
		case l.depth < r.depth:
			*pattern = max(*pattern, r.pattern)
			r = r.parent
		case r.depth < l.depth:
			*pattern = max(*pattern, l.pattern)
			l = l.parent
		default:
			*pattern = max(*pattern, l.pattern, r.pattern)
			l, r = l.parent, r.parent
		}
	}
	return l
}

// partition runs the fusion algorithm.
func (g *fgraph) partition() {
	g.groups = make([]*fgroup, len(g.nodes))
	for i, n := range g.nodes {
		g.groups[i] = &fgroup{pattern: n.pattern, numNodes: 1, anchor: n.pattern == PatternOutEWiseFusable}
	}
	g.postDom()
	for phase := 0; phase < 3; phase++ {
		g.runFuse(phase)
	}
}

func (g *fgraph) runFuse(phase int) {
	for nid, n := range g.nodes {
		dn := g.dom[nid]
		gn := g.groups[nid]
		if gn.pattern == PatternOpaque || dn.parent == nil {
			continue
		}
		parent := dn.parent.node
		pidx := parent.index
		if g.countFused(n, parent) > maxFuseDepth {
			continue
		}
		if phase == 2 {
			if gn.pattern > PatternInjective {
				continue
			}
			pg := g.groups[pidx]
			proot := pg.root()
			if proot.pattern == PatternTuple {
				continue
			}
			if pg.pattern == PatternTuple && proot.pattern <= PatternInjective {
				if g.checkPath(n, parent, func(k OpPattern, sink bool) bool { return k <= PatternInjective }) {
					g.commitFuse(n, parent)
				}
			}
			continue
		}
		if gn.root() == g.groups[pidx].root() {
			continue
		}
		if g.groups[pidx].pattern == PatternTuple {
			continue
		}
		switch {
		case gn.pattern == PatternOutEWiseFusable:
			if phase != 0 {
				continue
			}
			if dn.pattern == PatternElemWise {
				if g.checkPath(n, parent, func(k OpPattern, sink bool) bool { return k <= PatternBroadcast }) {
					g.commitFuse(n, parent)
				}
			}
		case gn.pattern <= PatternBroadcast:
			if dn.pattern <= PatternInjective || dn.pattern == PatternCommReduce {
				if g.checkPath(n, parent, func(k OpPattern, sink bool) bool {
					if !sink {
						return k <= PatternInjective
					}
					return k <= PatternBroadcast || k == PatternCommReduce || k == PatternInjective ||
						k == PatternOutEWiseFusable
				}) {
					g.commitFuse(n, parent)
				}
			}
		case gn.pattern == PatternInjective || gn.pattern == PatternTuple:
			if phase != 1 {
				continue
			}
			if g.checkPath(n, parent, func(k OpPattern, sink bool) bool { return k <= PatternInjective }) {
				g.commitFuse(n, parent)
			}
		}
	}
}

func (g *fgraph) checkPath(src, sink *fnode, cond func(OpPattern, bool) bool) bool {
	visited := map[*fnode]bool{}
	var walk func(n *fnode) bool
	walk = func(n *fnode) bool {
		if visited[n] {
			return true
		}
		visited[n] = true
		if !cond(g.groups[n.index].root().pattern, n == sink) {
			return false
		}
		if n == sink {
			return true
		}
		for _, e := range n.outputs {
			if !walk(e.node) {
				return false
			}
		}
		return true
	}
	for _, e := range src.outputs {
		if !walk(e.node) {
			return false
		}
	}
	return true
}

func (g *fgraph) commitFuse(src, sink *fnode) {
	target := g.groups[sink.index]
	visited := map[*fnode]bool{}
	var walk func(n *fnode)
	walk = func(n *fnode) {
		if n == sink || visited[n] {
			return
		}
		visited[n] = true
		merge(g.groups[n.index], target)
		for _, e := range n.outputs {
			walk(e.node)
		}
	}
	walk(src)
}

func merge(child, parent *fgroup) {
	child, parent = child.root(), parent.root()
	if child == parent {
		return
	}
	parent.numNodes += child.numNodes
	child.parent = parent
	if child.anchor {
		parent.anchor = true
		parent.pattern = max(child.pattern, parent.pattern)
	}
}

func (g *fgraph) countFused(child, domParent *fnode) int {
	visited := map[*fnode]bool{}
	var count func(n *fnode) int
	count = func(n *fnode) int {
		if n == domParent || visited[n] {
			return 0
		}
		visited[n] = true
		sum := g.groups[n.index].numNodes
		for _, e := range n.outputs {
			sum += count(e.node)
		}
		return sum
	}
	return g.groups[domParent.index].root().numNodes + count(child)
}

// fusor rewrites blocks by the partition, adding grouped functions.
type fusor struct {
	mod   *ir.IRModule
	known map[uint64][]string
	names map[string]int // variable names given in the current function
}

// varName returns prefix, then prefix1, prefix2… (TVM's block builder
// names emitted variables so; the printer still separates clashes with
// names of the function, lv_1).
func (fz *fusor) varName(prefix string) string {
	n := fz.names[prefix]
	fz.names[prefix]++
	if n == 0 {
		return prefix
	}
	return prefix + strconv.Itoa(n)
}

// block fuses the groups of a dataflow block; m is the mutator running,
// whose Subst takes the replacements of grouped outputs.
func (fz *fusor) block(b *ir.BindingBlock, m *ir.RMutator) (*ir.BindingBlock, error) {
	g := buildGraph(fz.mod, b)
	g.partition()
	groupOf := map[*ir.RVar]*fgroup{}
	members := map[*fgroup][]ir.Binding{}
	var order []*fgroup
	for _, bd := range b.Bindings {
		x := bd.BoundVar()
		gr := g.groups[g.byRef[x].index].root()
		groupOf[x] = gr
		if _, seen := members[gr]; !seen {
			order = append(order, gr)
		}
		members[gr] = append(members[gr], bd)
	}
	fused := func(gr *fgroup) bool { return len(members[gr]) > 1 }
	// Group dependencies, for a topological order of emission.
	deps := map[*fgroup][]*fgroup{}
	for _, bd := range b.Bindings {
		cur := groupOf[bd.BoundVar()]
		for _, v := range ir.FreeRVars(bd.BoundValue()) {
			if pg, ok := groupOf[v]; ok && pg != cur {
				deps[cur] = append(deps[cur], pg)
			}
		}
	}
	visited := map[*fgroup]bool{}
	var sorted []*fgroup
	var visit func(gr *fgroup)
	visit = func(gr *fgroup) {
		if visited[gr] {
			return
		}
		visited[gr] = true
		for _, d := range deps[gr] {
			visit(d)
		}
		sorted = append(sorted, gr)
	}
	for _, gr := range order {
		visit(gr)
	}
	// Variables used outside their group (or outside the block).
	usedOutside := map[*ir.RVar]bool{}
	for _, bd := range b.Bindings {
		cur := groupOf[bd.BoundVar()]
		for _, v := range ir.FreeRVars(bd.BoundValue()) {
			if pg, ok := groupOf[v]; ok && pg != cur {
				usedOutside[v] = true
			}
		}
		if !bd.BoundVar().Dataflow {
			usedOutside[bd.BoundVar()] = true
		}
	}
	var out []ir.Binding
	for _, gr := range sorted {
		bds := members[gr]
		if !fused(gr) {
			for _, bd := range bds {
				out = append(out, rewriteBinding(bd, m)...)
			}
			continue
		}
		nbs, err := fz.emitGroup(bds, usedOutside, m)
		if err != nil {
			return nil, err
		}
		out = append(out, nbs...)
	}
	return &ir.BindingBlock{Dataflow: true, Bindings: out}, nil
}

// rewriteBinding applies m's substitutions to a binding's value.
func rewriteBinding(bd ir.Binding, m *ir.RMutator) []ir.Binding {
	v := (&ir.RMutator{Subst: m.Subst}).RewriteExpr(bd.BoundValue())
	if v == bd.BoundValue() {
		return []ir.Binding{bd}
	}
	switch b := bd.(type) {
	case *ir.MatchCast:
		return []ir.Binding{&ir.MatchCast{Var: b.Var, Value: v, Info: b.Info}}
	}
	return []ir.Binding{&ir.VarBinding{Var: bd.BoundVar(), Value: v}}
}

// emitGroup makes the grouped function of bds and returns the bindings
// that call it.
func (fz *fusor) emitGroup(bds []ir.Binding, usedOutside map[*ir.RVar]bool, m *ir.RMutator) ([]ir.Binding, error) {
	defined := map[*ir.RVar]bool{}
	var inputs []ir.RExpr // outer values: variables and constants
	var params []*ir.RVar
	paramOf := map[any]*ir.RVar{}
	subst := map[*ir.RVar]ir.RExpr{}
	nameParts := []string{"fused"}
	var inner []ir.Binding
	var outputs []*ir.RVar
	var sources []ir.Source
	for _, bd := range bds {
		if _, ok := bd.(*ir.VarBinding); !ok {
			return nil, fmt.Errorf("binding %q: cannot fuse a match_cast", bd.BoundVar().Name)
		}
		lift := &ir.RMutator{Expr: func(e ir.RExpr) ir.RExpr {
			switch e := e.(type) {
			case *ir.RVar:
				if defined[e] {
					return subst[e]
				}
				if p, ok := paramOf[e]; ok {
					return p
				}
				p := ir.NewRVar(e.Name, e.Info)
				paramOf[e] = p
				params = append(params, p)
				inputs = append(inputs, e)
				return p
			case *ir.Constant:
				if p, ok := paramOf[e]; ok {
					return p
				}
				p := ir.NewRVar(fmt.Sprintf("param_%d", len(params)), e.Info())
				paramOf[e] = p
				params = append(params, p)
				inputs = append(inputs, e)
				return p
			}
			return e
		}}
		val := bd.BoundValue()
		if c, ok := val.(*ir.RCall); ok {
			nameParts = append(nameParts, calleeHint(c))
			sources = ir.AddSources(sources, c.Sources...)
			// Only the arguments are lifted: the callee stays.
			args := make([]ir.RExpr, len(c.Args))
			for i, a := range c.Args {
				if _, isGV := a.(*ir.GlobalVar); isGV {
					args[i] = a
					continue
				}
				args[i] = lift.RewriteExpr(a)
			}
			nc := *c
			nc.Args = args
			val = &nc
		} else {
			val = lift.RewriteExpr(val)
		}
		x := bd.BoundVar()
		nx := &ir.RVar{Name: x.Name, Info: x.Info, Dataflow: !usedOutside[x]}
		if usedOutside[x] {
			outputs = append(outputs, x)
		}
		defined[x] = true
		subst[x] = nx
		inner = append(inner, &ir.VarBinding{Var: nx, Value: val})
	}
	if len(outputs) == 0 {
		return nil, nil // nothing of the group is used: drop it
	}
	var body ir.RExpr
	if len(outputs) == 1 {
		body = subst[outputs[0]]
	} else {
		fs := make([]ir.RExpr, len(outputs))
		for i, o := range outputs {
			fs[i] = subst[o]
		}
		body = &ir.RTuple{Fields: fs}
	}
	fn := ir.NewFunction(params, &ir.SeqExpr{Blocks: []*ir.BindingBlock{{Dataflow: true, Bindings: inner}}, Body: body},
		map[string]any{AttrPrimitive: int64(1)})
	name := fz.add(strings.Join(nameParts, "_"), fn)
	args := make([]ir.RExpr, len(inputs))
	for i, in := range inputs {
		if v, ok := in.(*ir.RVar); ok {
			args[i] = rewriteVar(v, m)
		} else {
			args[i] = in
		}
	}
	call := &ir.RCall{Op: fz.mod.GlobalVar(name), Args: args, Info: fn.Ret, Sources: sources}
	if m.Subst == nil {
		m.Subst = map[*ir.RVar]ir.RExpr{}
	}
	if len(outputs) == 1 {
		o := outputs[0]
		var nv *ir.RVar
		if o.Dataflow {
			nv = ir.NewDataflowVar(fz.varName("lv"), fn.Ret)
		} else {
			nv = ir.NewRVar(fz.varName("gv"), fn.Ret)
		}
		m.Subst[o] = nv
		return []ir.Binding{&ir.VarBinding{Var: nv, Value: call}}, nil
	}
	tv := ir.NewDataflowVar(fz.varName("lv"), fn.Ret)
	out := []ir.Binding{&ir.VarBinding{Var: tv, Value: call}}
	for i, o := range outputs {
		nv := &ir.RVar{Name: fz.varName("lv"), Info: o.Info, Dataflow: o.Dataflow}
		if !o.Dataflow {
			nv.Name = fz.varName("gv")
		}
		m.Subst[o] = nv
		out = append(out, &ir.VarBinding{Var: nv, Value: &ir.TupleGetItem{Tuple: tv, Index: i}})
	}
	return out, nil
}

func rewriteVar(v *ir.RVar, m *ir.RMutator) ir.RExpr {
	if r, ok := m.Subst[v]; ok {
		return r
	}
	return v
}

// calleeHint names a call for the grouped function's name.
func calleeHint(c *ir.RCall) string {
	switch o := c.Op.(type) {
	case *ir.Op:
		if o.Name == ir.OpCallTIR && len(c.Args) > 0 {
			if gv, ok := c.Args[0].(*ir.GlobalVar); ok {
				return gv.Name
			}
		}
		return strings.ReplaceAll(strings.TrimPrefix(o.Name, "relax."), ".", "_")
	case *ir.GlobalVar:
		return o.Name
	case *ir.RVar:
		return o.Name
	case *ir.ExternFunc:
		return o.Name
	}
	return "call"
}

// add puts the grouped function in the module, sharing an equal one.
func (fz *fusor) add(hint string, fn *ir.Function) string {
	h := ir.StructuralHash(fn)
	for _, n := range fz.known[h] {
		if g, ok := fz.mod.Lookup(n); ok && ir.StructuralEqual(fn, g.(ir.Node)) {
			return n
		}
	}
	name := FreshName(fz.mod, hint)
	fz.mod = fz.mod.With(name, fn)
	fz.known[h] = append(fz.known[h], name)
	return name
}
