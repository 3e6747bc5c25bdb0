package onnx

import (
	"fmt"
)

// Det of small matrices by the Leibniz formula: the signed sum, over the
// permutations of the columns, of the products of one element per row.
// Exact in arithmetic and free of pivoting, it suits matrices up to
// maxDetOrder rows; larger ones are refused.

const maxDetOrder = 5

func init() {
	reg("Det", 11, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		s := x.shape()
		r := len(s)
		if r < 2 || s[r-1] != s[r-2] || !x.dtype().IsFloat() {
			return nil, fmt.Errorf("want float square matrices [..., n, n], got %s%v", x.dtype(), s)
		}
		order := int(s[r-1])
		if order > maxDetOrder {
			return nil, unsupported("Det of %d×%d matrices (kiln computes up to %d×%d)", order, order, maxDetOrder, maxDetOrder)
		}
		g := im.builder()
		batch := s[:r-2]
		el := make([][]*value, order)
		for i := range order {
			row := g.slice1(x, r-2, int64(i), int64(i+1))
			for j := range order {
				el[i] = append(el[i], g.reshape(g.slice1(row, r-1, int64(j), int64(j+1)), batch))
			}
		}
		var sum *value
		for _, p := range permutations(order) {
			term := el[0][p.perm[0]]
			for i := 1; i < order; i++ {
				term = g.op("multiply", nil, term, el[i][p.perm[i]])
			}
			switch {
			case sum == nil && p.odd:
				sum = g.op("negative", nil, term)
			case sum == nil:
				sum = term
			case p.odd:
				sum = g.op("subtract", nil, sum, term)
			default:
				sum = g.op("add", nil, sum, term)
			}
		}
		if order == 1 {
			sum = g.op("add", nil, sum, scalar(x.dtype(), 0))
		}
		return g.result(sum)
	})
}

type permutation struct {
	perm []int
	odd  bool
}

// permutations lists the permutations of 0…n−1 with their parity.
func permutations(n int) []permutation {
	if n == 0 {
		return []permutation{{}}
	}
	var out []permutation
	for _, p := range permutations(n - 1) {
		// Insert n−1 at each position; moving it k places left from the
		// end is k transpositions.
		for at := 0; at <= len(p.perm); at++ {
			q := append(append(append([]int{}, p.perm[:at]...), n-1), p.perm[at:]...)
			out = append(out, permutation{q, p.odd != ((len(p.perm)-at)%2 == 1)})
		}
	}
	return out
}
