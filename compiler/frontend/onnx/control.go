package onnx

import (
	"fmt"
	"maps"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Control flow, imported into the one dataflow graph: If computes both
// branches and selects (or only the branch its condition, known at
// import, names); Loop and Scan are unrolled, so their trip counts must
// be known at import (a Loop's condition too, if it can end the loop
// early), up to maxUnroll iterations. Subgraphs see the values of the
// graphs around them, as ONNX defines.

// maxUnroll bounds the iterations of an unrolled Loop or Scan.
const maxUnroll = 1024

func init() {
	reg("If", 1, convertIf)
	reg("Loop", 1, convertLoop)
	reg("Scan", 8, convertScan)
}

// runGraph converts a subgraph whose inputs take the values ins and
// returns its outputs. Names the subgraph defines do not leak out.
func (im *importer) runGraph(n *node, attr string, ins []*value) ([]*value, error) {
	gp := n.attrs[attr].GetG()
	if gp == nil {
		return nil, fmt.Errorf("attribute %s (a graph) is missing", attr)
	}
	if len(ins) != len(gp.GetInput()) {
		return nil, fmt.Errorf("%s takes %d inputs, %d given", attr, len(gp.GetInput()), len(ins))
	}
	saved := maps.Clone(im.vals)
	defer func() { im.vals = saved }()
	for i, in := range gp.GetInput() {
		im.vals[in.GetName()] = ins[i]
	}
	for _, tp := range gp.GetInitializer() {
		t, err := decodeTensor(tp, "")
		if err != nil {
			return nil, fmt.Errorf("%s: initializer %q: %w", attr, tp.GetName(), err)
		}
		im.vals[tp.GetName()] = &value{c: t}
	}
	for i, np := range gp.GetNode() {
		if err := im.runNode(im.newNode(np, i, n.opset)); err != nil {
			return nil, fmt.Errorf("%s: %w", attr, err)
		}
	}
	var outs []*value
	for _, o := range gp.GetOutput() {
		v := im.vals[o.GetName()]
		if v == nil {
			return nil, fmt.Errorf("%s: output %q is not computed", attr, o.GetName())
		}
		outs = append(outs, v)
	}
	return outs, nil
}

func convertIf(im *importer, n *node) ([]*value, error) {
	c, err := n.need(0)
	if err != nil {
		return nil, err
	}
	if c.known() {
		if c.c.NumElements() != 1 {
			return nil, fmt.Errorf("the condition has %d values, want one", c.c.NumElements())
		}
		branch := "else_branch"
		if c.c.elem(0) != 0 {
			branch = "then_branch"
		}
		return im.runGraph(n, branch, nil)
	}
	then, err := im.runGraph(n, "then_branch", nil)
	if err != nil {
		return nil, err
	}
	els, err := im.runGraph(n, "else_branch", nil)
	if err != nil {
		return nil, err
	}
	if len(then) != len(els) {
		return nil, fmt.Errorf("the branches have %d and %d outputs", len(then), len(els))
	}
	g := im.builder()
	cb := g.reshape(g.cast(c, ir.Bool), nil)
	out := make([]*value, len(then))
	for i := range then {
		if then[i].dtype() != els[i].dtype() || !slices.Equal(then[i].shape(), els[i].shape()) {
			return nil, unsupported("If computed at run time whose branches give %s%v and %s%v (kiln's graphs have static shapes)",
				then[i].dtype(), then[i].shape(), els[i].dtype(), els[i].shape())
		}
		out[i] = g.op("where", nil, cb, then[i], els[i])
	}
	return g.result(out...)
}

func convertLoop(im *importer, n *node) ([]*value, error) {
	trips := int64(maxUnroll + 1)
	if n.input(0) != nil {
		t, err := n.knownInput(0, "M, the trip count (the loop is unrolled)")
		if err != nil {
			return nil, err
		}
		trips = t.ielem(0)
	}
	more := true
	if c := n.input(1); c != nil {
		t, err := n.knownInput(1, "cond, the first condition (the loop is unrolled)")
		if err != nil {
			return nil, err
		}
		more = t.elem(0) != 0
	}
	carried := slices.Clone(n.in[min(2, len(n.in)):])
	var scans [][]*value
	iter := int64(0)
	for ; more && iter < trips; iter++ {
		if iter >= maxUnroll {
			return nil, unsupported("Loop of more than %d iterations", maxUnroll)
		}
		ins := append([]*value{constant(scalarTensor(ir.Int64, float64(iter))), constant(scalarTensor(ir.Bool, 1))}, carried...)
		outs, err := im.runGraph(n, "body", ins)
		if err != nil {
			return nil, err
		}
		if len(outs) < 1+len(carried) {
			return nil, fmt.Errorf("the body gives %d outputs for %d loop-carried values", len(outs), len(carried))
		}
		if !outs[0].known() {
			if trips > maxUnroll {
				return nil, &NeedsKnownError{Value: n.attrs["body"].GetG().GetOutput()[0].GetName(), what: "the body's condition (the loop is unrolled)"}
			}
			return nil, unsupported("Loop whose condition is computed at run time")
		}
		more = outs[0].c.elem(0) != 0
		copy(carried, outs[1:1+len(carried)])
		scans = append(scans, outs[1+len(carried):])
	}
	res := slices.Clone(carried)
	nScan := len(n.p.GetOutput()) - len(carried)
	for k := range nScan {
		if len(scans) == 0 {
			return nil, unsupported("Loop of no iterations with scan outputs (their shape is unknown)")
		}
		var parts []*value
		for _, s := range scans {
			parts = append(parts, s[k])
		}
		v, err := im.stack(parts, 0)
		if err != nil {
			return nil, err
		}
		res = append(res, v)
	}
	return res, nil
}

// stack joins values of one shape along a new axis.
func (im *importer) stack(parts []*value, axis int) (*value, error) {
	g := im.builder()
	ex := make([]*value, len(parts))
	for i, p := range parts {
		if p.known() {
			s := slices.Insert(slices.Clone(p.shape()), axis, 1)
			ex[i] = constant(p.c.reshaped(s))
			continue
		}
		ex[i] = g.op("expand_dims", map[string]any{"axis": anyInts([]int{axis})}, p)
	}
	if len(ex) == 1 {
		return g.one(ex[0])
	}
	if g.err == nil && !slices.ContainsFunc(ex, func(v *value) bool { return !v.known() }) {
		var ts []*Tensor
		for _, v := range ex {
			ts = append(ts, v.c)
		}
		if t := hostConcat(ts, axis); t.NumElements() <= foldLimit {
			return constant(t), nil
		}
	}
	return g.one(g.concat(ex, axis))
}

func convertScan(im *importer, n *node) ([]*value, error) {
	ins := n.in
	batched := n.opset < 9
	if batched {
		if l := n.input(0); l != nil {
			return nil, unsupported("Scan with sequence_lens")
		}
		ins = ins[1:]
	}
	k := int(n.attrInt("num_scan_inputs", 0))
	if k <= 0 || k > len(ins) {
		return nil, fmt.Errorf("num_scan_inputs %d for %d inputs", k, len(ins))
	}
	for i, v := range ins {
		if v == nil {
			return nil, fmt.Errorf("input %d is missing", i)
		}
	}
	states, xs := ins[:len(ins)-k], ins[len(ins)-k:]
	if !batched {
		return im.scan(n, states, xs)
	}
	// Opset 8: axis 0 of every input is a batch, scanned one entry at a
	// time along axis 1.
	for _, v := range ins {
		if v.rank() < 1 || v.shape()[0] != xs[0].shape()[0] {
			return nil, fmt.Errorf("Scan before opset 9 wants a batch axis of one size on every input")
		}
	}
	nb := xs[0].shape()[0]
	var per [][]*value
	g := im.builder()
	for b := range nb {
		pick := func(v *value) *value {
			s := v.shape()[1:]
			return g.reshape(g.slice1(v, 0, b, b+1), s)
		}
		var st, sx []*value
		for _, v := range states {
			st = append(st, pick(v))
		}
		for _, v := range xs {
			sx = append(sx, pick(v))
		}
		if g.err != nil {
			return nil, g.err
		}
		outs, err := im.scan(n, st, sx)
		if err != nil {
			return nil, err
		}
		per = append(per, outs)
	}
	res := make([]*value, len(per[0]))
	for j := range res {
		var parts []*value
		for _, p := range per {
			parts = append(parts, p[j])
		}
		v, err := im.stack(parts, 0)
		if err != nil {
			return nil, err
		}
		res[j] = v
	}
	return res, nil
}

// scan runs a Scan body over the scan inputs' axes (no batch axis).
func (im *importer) scan(n *node, states, xs []*value) ([]*value, error) {
	axisOf := func(attr string, i, r int) (int, error) {
		a := int64(0)
		if v, ok := n.attrInts(attr); ok && i < len(v) {
			a = v[i]
		}
		return normAxis(a, r)
	}
	dirOf := func(attr string, i int) bool {
		v, ok := n.attrInts(attr)
		return ok && i < len(v) && v[i] != 0
	}
	g := im.builder()
	steps := int64(-1)
	axes := make([]int, len(xs))
	for i, x := range xs {
		a, err := axisOf("scan_input_axes", i, x.rank())
		if err != nil {
			return nil, err
		}
		axes[i] = a
		if steps >= 0 && x.shape()[a] != steps {
			return nil, fmt.Errorf("scan inputs of %d and %d steps", steps, x.shape()[a])
		}
		steps = x.shape()[a]
	}
	if steps > maxUnroll {
		return nil, unsupported("Scan of more than %d iterations", maxUnroll)
	}
	st := slices.Clone(states)
	var scans [][]*value
	for t := range steps {
		ins := slices.Clone(st)
		for i, x := range xs {
			at := t
			if dirOf("scan_input_directions", i) {
				at = steps - 1 - t
			}
			s := slices.Delete(slices.Clone(x.shape()), axes[i], axes[i]+1)
			ins = append(ins, g.reshape(g.slice1(x, axes[i], at, at+1), s))
		}
		if g.err != nil {
			return nil, g.err
		}
		outs, err := im.runGraph(n, "body", ins)
		if err != nil {
			return nil, err
		}
		if len(outs) < len(st) {
			return nil, fmt.Errorf("the body gives %d outputs for %d states", len(outs), len(st))
		}
		copy(st, outs[:len(st)])
		scans = append(scans, outs[len(st):])
	}
	res := slices.Clone(st)
	if len(scans) == 0 {
		return res, nil
	}
	for j := range scans[0] {
		parts := make([]*value, len(scans))
		for t := range scans {
			parts[t] = scans[t][j]
		}
		if dirOf("scan_output_directions", j) {
			slices.Reverse(parts)
		}
		a, err := axisOf("scan_output_axes", j, parts[0].rank()+1)
		if err != nil {
			return nil, err
		}
		v, err := im.stack(parts, a)
		if err != nil {
			return nil, err
		}
		res = append(res, v)
	}
	return res, nil
}
