package onnx

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// TfIdfVectorizer over integer tokens: for each gram length n and skip s
// (skips apply to n > 1 only), the windows of n tokens s apart are
// gathered ([B, P, n]), compared with every pooled n-gram, and the
// matches counted; a constant 0/1 matrix sends each pooled n-gram's
// count to its output column, then the mode weighs it.

func init() {
	reg("TfIdfVectorizer", 9, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		if _, ok := n.attrs["pool_strings"]; ok {
			return nil, unsupported("TfIdfVectorizer of strings")
		}
		if x.dtype().IsFloat() || x.dtype() == ir.Bool || x.rank() < 1 || x.rank() > 2 {
			return nil, fmt.Errorf("want integer tokens [C] or [N, C], got %s%v", x.dtype(), x.shape())
		}
		minN, maxN, maxSkip := n.attrInt("min_gram_length", 1), n.attrInt("max_gram_length", 1), n.attrInt("max_skip_count", 0)
		counts, _ := n.attrInts("ngram_counts")
		indexes, _ := n.attrInts("ngram_indexes")
		pool, _ := n.attrInts("pool_int64s")
		weights := n.attrs["weights"].GetFloats()
		mode := n.attrString("mode", "TF")
		if mode != "TF" && mode != "IDF" && mode != "TFIDF" {
			return nil, fmt.Errorf("mode %q is not TF, IDF or TFIDF", mode)
		}
		if minN < 1 || maxN < minN || maxSkip < 0 || int64(len(counts)) < maxN {
			return nil, fmt.Errorf("gram lengths %d…%d, max_skip_count %d and %d ngram_counts do not fit", minN, maxN, maxSkip, len(counts))
		}
		// The pooled n-grams of each length: pool[counts[n-1]:counts[n]].
		type gram struct {
			toks []int64
			col  int64
		}
		byLen := map[int64][]gram{}
		cols := int64(0)
		j := 0
		for ln := int64(1); ln <= int64(len(counts)); ln++ {
			start := counts[ln-1]
			end := int64(len(pool))
			if ln < int64(len(counts)) {
				end = counts[ln]
			}
			if start > end || end > int64(len(pool)) || (end-start)%ln != 0 {
				return nil, fmt.Errorf("ngram_counts %v do not fit a pool of %d tokens", counts, len(pool))
			}
			for p := start; p < end; p += ln {
				if j >= len(indexes) {
					return nil, fmt.Errorf("%d ngram_indexes for more pooled n-grams", len(indexes))
				}
				byLen[ln] = append(byLen[ln], gram{pool[p : p+ln], indexes[j]})
				cols = max(cols, indexes[j]+1)
				j++
			}
		}
		g := im.builder()
		xb := x
		if x.rank() == 1 {
			xb = g.reshape(x, []int64{1, x.shape()[0]})
		}
		xb = g.cast(xb, ir.Int64)
		if g.err != nil {
			return nil, g.err
		}
		b, c := xb.shape()[0], xb.shape()[1]
		var out *value
		for ln := minN; ln <= maxN; ln++ {
			grams := byLen[ln]
			if len(grams) == 0 {
				continue
			}
			gt := newTensor(ir.Int64, []int64{int64(len(grams)), 1, ln}) // [J, 1, n]
			route := newTensor(ir.Float32, []int64{int64(len(grams)), cols})
			for q, gr := range grams {
				for k, t := range gr.toks {
					putInt(gt.Data, ir.Int64, q*int(ln)+k, t)
				}
				setElem(route.Data, ir.Float32, q*int(cols)+int(gr.col), 1)
			}
			var cnt *value // [B, J]
			for s := int64(0); s <= maxSkip && (s == 0 || ln > 1); s++ {
				span := (ln-1)*(s+1) + 1
				if span > c {
					break
				}
				np := c - span + 1
				idx := newTensor(ir.Int64, []int64{np, ln})
				for p := range np {
					for k := range ln {
						putInt(idx.Data, ir.Int64, int(p*ln+k), p+k*(s+1))
					}
				}
				win := g.op("take", map[string]any{"axis": int64(1)}, xb, constant(idx)) // [B, P, n]
				win = g.reshape(win, []int64{b, 1, np, ln})
				eq := g.sum(g.cast(g.op("equal", nil, win, constant(gt)), ir.Int64), []int{3}, false) // [B, J, P]
				hit := g.sum(g.cast(g.op("equal", nil, eq, scalar(ir.Int64, float64(ln))), ir.Float32), []int{2}, false)
				if cnt == nil {
					cnt = hit
				} else {
					cnt = g.op("add", nil, cnt, hit)
				}
			}
			if cnt == nil {
				continue
			}
			part := g.op("matmul", nil, cnt, constant(route))
			if out == nil {
				out = part
			} else {
				out = g.op("add", nil, out, part)
			}
		}
		if out == nil {
			out = constant(newTensor(ir.Float32, []int64{b, cols}))
		}
		if mode != "TF" {
			if mode == "IDF" {
				out = g.op("minimum", nil, out, scalar(ir.Float32, 1))
			}
			if len(weights) > 0 {
				w := newTensor(ir.Float32, []int64{cols})
				for i, v := range weights {
					if i < int(cols) {
						setElem(w.Data, ir.Float32, i, float64(v))
					}
				}
				out = g.op("multiply", nil, out, constant(w))
			}
		}
		if x.rank() == 1 {
			out = g.reshape(out, []int64{cols})
		}
		return g.result(out)
	})
}
