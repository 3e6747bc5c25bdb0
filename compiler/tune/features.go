package tune

import (
	"math"
	"sort"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// The feature vector of a candidate describes its two heaviest blocks
// (by iterations × arithmetic per iteration), blockFeatures each, then
// the function as a whole.
const (
	blockFeatures = 24
	// NumFeatures is the length of Features' vectors.
	NumFeatures = 2*blockFeatures + 2
)

// levelIters are the inner iteration counts at which the bytes a block
// touches are measured: the innermost loops whose extents multiply to at
// least each (about a register tile, L1, L2, L3 and beyond).
var levelIters = []int64{16, 256, 4096, 65536, 1 << 20}

// Features describes f's scheduled loop nest for the cost model: for its
// heaviest blocks, the iteration count, arithmetic per iteration, the
// extent of parallel, vectorized and unrolled loops, the bytes touched
// by the innermost loops at several levels and the arithmetic intensity
// there, how accesses stride along the innermost loop, the accumulator
// tile inside the reduction, and whether the block writes a local
// buffer. Every value is a log2 or a small count.
func Features(f *ir.PrimFunc) []float64 {
	var blocks [][]float64
	var work []float64
	leafBlocks(f, func(br *ir.BlockRealize, loops []*ir.For) {
		v, w := blockFeatureVector(br, loops)
		blocks = append(blocks, v)
		work = append(work, w)
	})
	idx := make([]int, len(blocks))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return work[idx[a]] > work[idx[b]] })
	out := make([]float64, NumFeatures)
	total := 0.0
	for i, j := range idx {
		if i < 2 {
			copy(out[i*blockFeatures:], blocks[j])
		}
		total += work[j]
	}
	out[2*blockFeatures] = log2(total)
	out[2*blockFeatures+1] = float64(len(blocks))
	return out
}

// leafBlocks calls fn for every block of f whose body is a single store,
// with the loops around it (outermost first), and for every store under
// loops outside any block (a lowered function's), as a block of that
// store alone.
func leafBlocks(f *ir.PrimFunc, fn func(br *ir.BlockRealize, loops []*ir.For)) {
	var stack []*ir.For
	var walk func(s ir.Stmt)
	walk = func(s ir.Stmt) {
		switch s := s.(type) {
		case *ir.For:
			stack = append(stack, s)
			walk(s.Body)
			stack = stack[:len(stack)-1]
		case *ir.SeqStmt:
			for _, x := range s.Seq {
				walk(x)
			}
		case *ir.BlockRealize:
			if _, leaf := s.Block.Body.(*ir.BufferStore); !leaf {
				walk(s.Block.Body)
				return
			}
			fn(s, stack)
		case *ir.BufferStore:
			if len(stack) > 0 {
				fn(&ir.BlockRealize{Block: &ir.Block{Body: s, Writes: []ir.BufferRegion{{Buffer: s.Buffer}}}}, stack)
			}
		default:
			ir.Visit(s, func(n ir.Node) bool {
				switch n.(type) {
				case *ir.For, *ir.BlockRealize, *ir.SeqStmt, *ir.BufferStore:
					walk(n.(ir.Stmt))
					return false
				}
				return true
			})
		}
	}
	walk(f.Body)
}

func log2(x float64) float64 {
	if x <= 1 {
		return 0
	}
	return math.Log2(x)
}

// access is one buffer access of a block: its indices.
type access struct {
	buf     *ir.Buffer
	indices []ir.Expr
}

// blockFeatureVector computes one block's features under loops (outer
// first) and returns them with the block's work.
func blockFeatureVector(br *ir.BlockRealize, loops []*ir.For) ([]float64, float64) {
	v := make([]float64, blockFeatures)
	bind := map[*ir.Var]ir.Expr{}
	for i, iv := range br.Block.IterVars {
		if i < len(br.IterValues) {
			bind[iv.Var] = br.IterValues[i]
		}
	}
	ext := make([]int64, len(loops))
	iters := 1.0
	par, vec, unr := 1.0, 1.0, 1.0
	for i, l := range loops {
		e, ok := ir.IsConstInt(l.Extent)
		if !ok {
			e = 64
		}
		ext[i] = e
		iters *= float64(e)
		switch l.Kind {
		case ir.ForParallel:
			par *= float64(e)
		case ir.ForVectorized:
			vec *= float64(e)
		case ir.ForUnrolled:
			unr *= float64(e)
		}
	}
	var accs []access
	flops := 0
	ir.Visit(br.Block.Body, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.BufferLoad:
			accs = append(accs, access{n.Buffer, n.Indices})
		case *ir.BufferStore:
			accs = append(accs, access{n.Buffer, n.Indices})
		case *ir.Binary:
			if n.Op <= ir.OpMax {
				flops++
			}
		case *ir.Call:
			flops++
		}
		return true
	})
	reduce := false
	for _, iv := range br.Block.IterVars {
		reduce = reduce || iv.Kind == ir.IterReduce
	}
	v[0] = log2(iters)
	v[1] = log2(float64(flops) + 1)
	v[2] = log2(par)
	v[3] = log2(vec)
	v[4] = log2(unr)
	if reduce {
		v[5] = 1
	}
	v[6] = float64(len(loops))
	// Bytes touched by the innermost loops at each level.
	for k, want := range levelIters {
		inner := map[*ir.Var]int64{}
		n := int64(1)
		for i := len(loops) - 1; i >= 0 && n < want; i-- {
			inner[loops[i].Var] = ext[i]
			n *= ext[i]
		}
		bytes := 0.0
		for _, a := range accs {
			bytes += footprint(a, inner, bind)
		}
		v[7+2*k] = log2(bytes)
		v[8+2*k] = math.Log2((float64(flops)*float64(n) + 1) / (bytes + 1))
	}
	all := map[*ir.Var]int64{}
	for i, l := range loops {
		all[l.Var] = ext[i]
	}
	total := 0.0
	for _, a := range accs {
		total += footprint(a, all, bind)
	}
	v[17] = log2(total)
	// Strides along the innermost loop.
	if len(loops) > 0 {
		in := loops[len(loops)-1].Var
		for _, a := range accs {
			switch s := stride(a, in, bind); {
			case s == 0:
				v[18]++
			case s == 1:
				v[19]++
			default:
				v[20]++
			}
		}
	}
	// The accumulator tile: spatial extents inside the outermost loop
	// that drives a reduction variable.
	if reduce {
		first := -1
		for i, l := range loops {
			for _, iv := range br.Block.IterVars {
				if iv.Kind == ir.IterReduce && mentions(bind[iv.Var], l.Var) {
					first = i
					break
				}
			}
			if first >= 0 {
				break
			}
		}
		tile := 1.0
		for i := first + 1; first >= 0 && i < len(loops); i++ {
			spatial := true
			for _, iv := range br.Block.IterVars {
				if iv.Kind == ir.IterReduce && mentions(bind[iv.Var], loops[i].Var) {
					spatial = false
				}
			}
			if spatial {
				tile *= float64(ext[i])
			}
		}
		v[21] = log2(tile)
	}
	for _, w := range br.Block.Writes {
		if w.Buffer.StorageScope() == "local" {
			v[22] = 1
		}
	}
	if len(loops) > 0 && loops[0].Kind == ir.ForParallel {
		v[23] = 1
	}
	return v, iters * float64(max(flops, 1))
}

// footprint is the bytes a access touches while the loops in inner run
// (the others fixed): the product over its indices of the span each
// covers.
func footprint(a access, inner map[*ir.Var]int64, bind map[*ir.Var]ir.Expr) float64 {
	n := 1.0
	for _, e := range a.indices {
		n *= float64(span(e, inner, bind) + 1)
	}
	return n * float64(max(a.buf.DType.Bits/8, 1))
}

// span bounds how far e moves while the loops in inner run: the
// difference between its largest and smallest value, for expressions
// affine in the loop variables (floordiv and floormod bounded); 0 for
// what does not depend on them.
func span(e ir.Expr, inner map[*ir.Var]int64, bind map[*ir.Var]ir.Expr) int64 {
	switch e := e.(type) {
	case *ir.Var:
		if x, ok := inner[e]; ok {
			return x - 1
		}
		if b, ok := bind[e]; ok {
			return span(b, inner, nil)
		}
		return 0
	case *ir.Binary:
		a, b := span(e.A, inner, bind), span(e.B, inner, bind)
		switch e.Op {
		case ir.OpAdd, ir.OpSub:
			return a + b
		case ir.OpMul:
			if c, ok := ir.IsConstInt(e.B); ok {
				return a * abs64(c)
			}
			if c, ok := ir.IsConstInt(e.A); ok {
				return b * abs64(c)
			}
			return a + b
		case ir.OpFloorDiv, ir.OpDiv:
			if c, ok := ir.IsConstInt(e.B); ok && c != 0 {
				return a / abs64(c)
			}
			return a
		case ir.OpFloorMod, ir.OpMod:
			if c, ok := ir.IsConstInt(e.B); ok && c != 0 {
				return min(a, abs64(c)-1)
			}
			return a
		}
		return a + b
	case *ir.Cast:
		return span(e.Value, inner, bind)
	}
	return 0
}

// stride is how far access a's last index moves per iteration of loop v
// (its other indices must not move, else it is a large stride).
func stride(a access, v *ir.Var, bind map[*ir.Var]ir.Expr) int64 {
	one := map[*ir.Var]int64{v: 2}
	var s int64
	for i, e := range a.indices {
		d := span(e, one, bind)
		if i < len(a.indices)-1 && d != 0 {
			return 1 << 20
		}
		s = d
	}
	return s
}

func mentions(e ir.Expr, v *ir.Var) bool {
	if e == nil {
		return false
	}
	found := false
	ir.Visit(e, func(n ir.Node) bool {
		if x, ok := n.(*ir.Var); ok && x == v {
			found = true
		}
		return !found
	})
	return found
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
