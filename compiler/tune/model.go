package tune

import "sort"

// Model is the search's cost model: gradient-boosted regression trees
// (squared loss) over Features, predicting a candidate's normalized
// throughput (the best time of its workload divided by its time, so 1 is
// the best seen and invalid candidates are 0). Fit retrains from all the
// data each time; the data are a few thousand rows at most.
type Model struct {
	base  float64
	trees []*treeNode
	// Trees, Depth, Rate and MinLeaf shape the ensemble.
	Trees, Depth, MinLeaf int
	Rate                  float64
}

// NewModel returns an untrained model with the defaults: 60 trees of
// depth 4, learning rate 0.2, at least 2 samples a leaf.
func NewModel() *Model { return &Model{Trees: 60, Depth: 4, MinLeaf: 2, Rate: 0.2} }

// Trained reports whether Fit has been given data.
func (m *Model) Trained() bool { return len(m.trees) > 0 }

type treeNode struct {
	feature     int
	threshold   float64
	left, right *treeNode
	value       float64 // leaves
}

func (n *treeNode) predict(x []float64) float64 {
	for n.left != nil {
		if x[n.feature] <= n.threshold {
			n = n.left
		} else {
			n = n.right
		}
	}
	return n.value
}

// Predict returns the model's score for a feature vector (0 before any
// Fit).
func (m *Model) Predict(x []float64) float64 {
	s := m.base
	for _, t := range m.trees {
		s += m.Rate * t.predict(x)
	}
	return s
}

// Fit trains the model on rows x with targets y.
func (m *Model) Fit(x [][]float64, y []float64) {
	m.trees = nil
	if len(x) == 0 {
		m.base = 0
		return
	}
	mean := 0.0
	for _, v := range y {
		mean += v
	}
	m.base = mean / float64(len(y))
	resid := make([]float64, len(y))
	for i := range y {
		resid[i] = y[i] - m.base
	}
	nf := len(x[0])
	sorted := make([][]int, nf)
	for f := range nf {
		o := make([]int, len(x))
		for i := range o {
			o[i] = i
		}
		sort.SliceStable(o, func(a, b int) bool { return x[o[a]][f] < x[o[b]][f] })
		sorted[f] = o
	}
	left := make([]bool, len(x))
	for range m.Trees {
		t := m.grow(x, resid, sorted, left, m.Depth)
		m.trees = append(m.trees, t)
		for i := range resid {
			resid[i] -= m.Rate * t.predict(x[i])
		}
	}
}

// grow builds a tree over the rows in sorted (each feature's rows in
// ascending order of that feature); left is scratch space.
func (m *Model) grow(x [][]float64, r []float64, sorted [][]int, left []bool, depth int) *treeNode {
	rows := sorted[0]
	sum := 0.0
	for _, i := range rows {
		sum += r[i]
	}
	n := len(rows)
	leaf := &treeNode{value: sum / float64(n)}
	if depth == 0 || n < 2*m.MinLeaf {
		return leaf
	}
	bestGain, bestF, bestT := 1e-12, -1, 0.0
	for f, order := range sorted {
		acc := 0.0
		for k := 0; k < n-1; k++ {
			acc += r[order[k]]
			nl := k + 1
			if nl < m.MinLeaf || n-nl < m.MinLeaf {
				continue
			}
			a, b := x[order[k]][f], x[order[k+1]][f]
			if a == b {
				continue
			}
			right := sum - acc
			gain := acc*acc/float64(nl) + right*right/float64(n-nl) - sum*sum/float64(n)
			if gain > bestGain {
				bestGain, bestF, bestT = gain, f, (a+b)/2
			}
		}
	}
	if bestF < 0 {
		return leaf
	}
	for _, i := range rows {
		left[i] = x[i][bestF] <= bestT
	}
	ls, rs := make([][]int, len(sorted)), make([][]int, len(sorted))
	for f, order := range sorted {
		for _, i := range order {
			if left[i] {
				ls[f] = append(ls[f], i)
			} else {
				rs[f] = append(rs[f], i)
			}
		}
	}
	return &treeNode{feature: bestF, threshold: bestT, left: m.grow(x, r, ls, left, depth-1), right: m.grow(x, r, rs, left, depth-1)}
}

// rankCorrelation is Spearman's correlation of a and b (ties by order),
// used by tests to see that the model learns an ordering.
func rankCorrelation(a, b []float64) float64 {
	ra, rb := ranks(a), ranks(b)
	n := float64(len(a))
	var d2 float64
	for i := range ra {
		d := ra[i] - rb[i]
		d2 += d * d
	}
	return 1 - 6*d2/(n*(n*n-1))
}

func ranks(v []float64) []float64 {
	idx := make([]int, len(v))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return v[idx[a]] < v[idx[b]] })
	r := make([]float64, len(v))
	for k, i := range idx {
		r[i] = float64(k)
	}
	return r
}
