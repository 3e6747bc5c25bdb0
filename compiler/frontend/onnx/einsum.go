package onnx

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Einsum in three steps: each operand's repeated subscripts are reduced
// to their diagonal (masked by an identity and summed), every operand is
// laid out over all the equation's subscripts (output ones first, then
// the summed ones; a missing subscript is a dimension of 1), and the
// operands are multiplied together with broadcasting and summed over the
// subscripts the output leaves out. An ellipsis stands for the same
// leading dimensions in every operand (broadcast from the right).

func init() {
	reg("Einsum", 12, func(im *importer, n *node) ([]*value, error) {
		var ops []*value
		for i := range n.in {
			v, err := n.need(i)
			if err != nil {
				return nil, err
			}
			ops = append(ops, v)
		}
		eq := n.attrString("equation", "")
		terms, out, err := parseEinsum(eq, ops)
		if err != nil {
			return nil, fmt.Errorf("equation %q: %w", eq, err)
		}
		return ret(im.einsum(ops, terms, out))
	})
}

// parseEinsum returns each operand's subscripts and the output's, with
// an ellipsis spelled out as the digits 0…9 (which the equation cannot
// hold), aligned from the right across operands.
func parseEinsum(eq string, ops []*value) ([][]rune, []rune, error) {
	eq = strings.ReplaceAll(eq, " ", "")
	lhs, rhs, explicit := strings.Cut(eq, "->")
	parts := strings.Split(lhs, ",")
	if len(parts) != len(ops) {
		return nil, nil, fmt.Errorf("%d terms for %d inputs", len(parts), len(ops))
	}
	ell := 0 // dimensions the ellipsis covers, the most over operands
	terms := make([][]rune, len(parts))
	for i, p := range parts {
		letters := strings.Replace(p, "...", "", 1)
		for _, r := range letters {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
				return nil, nil, fmt.Errorf("term %q: %q is not a subscript", p, r)
			}
		}
		k := ops[i].rank() - len(letters)
		has := strings.Contains(p, "...")
		if k < 0 || k > 0 && !has || k > 10 {
			return nil, nil, fmt.Errorf("term %q does not fit input %d of rank %d", p, i, ops[i].rank())
		}
		ell = max(ell, k)
		pre, post, _ := strings.Cut(p, "...")
		t := []rune(pre)
		for j := range k {
			t = append(t, rune('0'+10-k+j))
		}
		terms[i] = append(t, []rune(post)...)
	}
	var ellNames []rune
	for j := range ell {
		ellNames = append(ellNames, rune('0'+10-ell+j))
	}
	var out []rune
	if explicit {
		pre, post, has := strings.Cut(rhs, "...")
		out = []rune(pre)
		if has {
			out = append(out, ellNames...)
		}
		out = append(out, []rune(post)...)
		for _, r := range out {
			if !slices.ContainsFunc(terms, func(t []rune) bool { return slices.Contains(t, r) }) {
				return nil, nil, fmt.Errorf("output subscript %q is in no input", r)
			}
		}
	} else {
		// Implicit output: the ellipsis, then the subscripts used once,
		// in alphabetical order.
		count := map[rune]int{}
		for _, t := range terms {
			for _, r := range t {
				count[r]++
			}
		}
		var once []rune
		for r, c := range count {
			if c == 1 && !(r >= '0' && r <= '9') {
				once = append(once, r)
			}
		}
		slices.Sort(once)
		out = append(ellNames, once...)
	}
	return terms, out, nil
}

func (im *importer) einsum(ops []*value, terms [][]rune, out []rune) (*value, error) {
	g := im.builder()
	all := slices.Clone(out)
	size := map[rune]int64{}
	for i, t := range terms {
		for j, r := range t {
			d := ops[i].shape()[j]
			if s, ok := size[r]; ok && s != d && s != 1 && d != 1 {
				return nil, fmt.Errorf("subscript %q is %d in one place and %d in another", r, s, d)
			}
			size[r] = max(size[r], d)
			if !slices.Contains(all, r) {
				all = append(all, r)
			}
		}
	}
	var prod *value
	for i, x := range ops {
		if g.err != nil {
			break
		}
		t := slices.Clone(terms[i])
		// Diagonals: keep the first of each repeated subscript.
		for j := 0; j < len(t); j++ {
			for k := len(t) - 1; k > j; k-- {
				if t[k] != t[j] {
					continue
				}
				d := x.shape()[j]
				ms := make([]int64, len(t))
				for a := range ms {
					ms[a] = 1
				}
				ms[j], ms[k] = d, d
				eye := newTensor(x.dtype(), ms)
				st := stridesOf(ms)
				for a := range d {
					setIElem(eye.Data, x.dtype(), int(a*st[j]+a*st[k]), 1)
				}
				x = g.sum(g.op("multiply", nil, x, constant(eye)), []int{k}, false)
				t = slices.Delete(t, k, k+1)
				if g.err != nil {
					return nil, g.err
				}
			}
		}
		// Lay the operand over all subscripts.
		var perm []int
		shape := make([]int64, len(all))
		for a, r := range all {
			shape[a] = 1
			if j := slices.Index(t, r); j >= 0 {
				perm = append(perm, j)
				if g.err == nil {
					shape[a] = x.shape()[j]
				}
			}
		}
		if !slices.IsSorted(perm) {
			x = g.permute(x, perm)
		}
		x = g.reshape(x, shape)
		if prod == nil {
			prod = x
		} else {
			prod = g.op("multiply", nil, prod, x)
		}
	}
	if len(all) > len(out) {
		var red []int
		for a := len(out); a < len(all); a++ {
			red = append(red, a)
		}
		prod = g.sum(prod, red, false)
	} else if len(ops) == 1 {
		prod = g.op("add", nil, prod, scalar(prod.dtype(), 0))
	}
	if g.err == nil && !slices.Equal(prod.shape(), outShape(out, size)) {
		prod = g.op("broadcast_to", nil, prod, &ir.ShapeExpr{Values: ir.Dims(outShape(out, size)...)})
	}
	return g.one(prod)
}

func outShape(out []rune, size map[rune]int64) []int64 {
	s := make([]int64, len(out))
	for i, r := range out {
		s[i] = size[r]
	}
	return s
}
