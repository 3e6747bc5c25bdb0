package schedule

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestRandomSchedules applies random primitives with random arguments to
// small functions. Whatever succeeds must keep the function well formed
// and computing the same values; whatever fails must fail with an error,
// never a panic.
func TestRandomSchedules(t *testing.T) {
	funcs := []struct {
		name string
		fn   func() *ir.PrimFunc
	}{
		{"matmul", func() *ir.PrimFunc { return matmul(12, 10, 6) }},
		{"chain", func() *ir.PrimFunc { return chain(6, 10) }},
		{"fanout", fanout},
		{"softmax_like", twoStageReduce},
		{"stencil", stencil},
	}
	want := map[string]map[string][]float64{}
	for _, f := range funcs {
		want[f.name] = runFunc(t, f.fn(), nil)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	applied := map[string]int{}
	for n := range 200 {
		f := funcs[n%len(funcs)]
		s, err := New(f.fn())
		check.NoError(t, err)
		var log []string
		for range 7 {
			name, err := randomStep(rng, s)
			log = append(log, fmt.Sprintf("%s: %v", name, err))
			if err == nil {
				applied[name]++
			}
		}
		t.Run(fmt.Sprintf("%d_%s", n, f.name), func(t *testing.T) {
			t.Log("steps:\n" + strings.Join(log, "\n") + "\ntrace:\n" + strings.Join(s.Trace(), "\n") + "\n" + script.Print(s.Func()))
			check.NoError(t, ir.Verify(s.Func()), strings.Join(log, "\n"))
			sameResults(t, runFunc(t, s.Func(), nil), want[f.name])
			checkReplay(t, f.fn(), s)
		})
	}
	// The walk must have exercised the primitives, not only failed.
	for _, p := range []string{"split", "fuse", "reorder", "parallel", "vectorize", "unroll", "cache_read", "cache_write", "compute_at", "reverse_compute_at", "compute_inline", "decompose_reduction",
		"reverse_compute_inline", "rfactor", "set_scope", "storage_align", "transform_layout", "pad_einsum", "blockize"} {
		check.True(t, applied[p] > 0, "no successful", p, applied)
	}
}

// randomStep applies one random primitive to random blocks and loops of s.
func randomStep(rng *rand.Rand, s *Schedule) (name string, err error) {
	defer func() {
		if r := recover(); r != nil {
			panic(fmt.Sprintf("%s panicked: %v\ntrace:\n%s", name, r, strings.Join(s.Trace(), "\n")))
		}
	}()
	// The blocks a handle can name (not those in a block's init), and
	// loops through handles, as a user gets them.
	var blocks []string
	ir.Visit(s.Func().Body, func(n ir.Node) bool {
		if b, ok := n.(*ir.Block); ok && b.Name != ir.RootBlockName && findBlock(s.Func().Body, b.Name) != nil {
			blocks = append(blocks, b.Name)
		}
		return true
	})
	block := func() BlockRV {
		b, err := s.GetBlock(blocks[rng.IntN(len(blocks))])
		if err != nil {
			panic(err)
		}
		return b
	}
	var loops []*ir.For
	loopRVs := map[*ir.Var]LoopRV{}
	for _, name := range blocks {
		b, _ := s.GetBlock(name)
		ls, _ := s.GetLoops(b)
		for _, l := range ls {
			if _, seen := loopRVs[l.v]; !seen {
				f, _ := s.LoopFor(l)
				loops = append(loops, f)
				loopRVs[l.v] = l
			}
		}
	}
	if len(loops) == 0 {
		return "no loops", nil
	}
	loop := func() LoopRV { return loopRVs[loops[rng.IntN(len(loops))].Var] }
	switch rng.IntN(20) {
	case 0:
		name = "split"
		factors := []int64{-1, int64(1 + rng.IntN(5))}
		if rng.IntN(2) == 0 {
			factors[0], factors[1] = factors[1], factors[0]
		}
		_, err = s.Split(loop(), factors...)
	case 1:
		name = "fuse"
		f := loops[rng.IntN(len(loops))]
		inner, ok := f.Body.(*ir.For)
		if !ok {
			return name, fmt.Errorf("no loop to fuse")
		}
		if _, ok := loopRVs[inner.Var]; !ok {
			return name, fmt.Errorf("no handle")
		}
		_, err = s.Fuse(loopRVs[f.Var], loopRVs[inner.Var])
	case 2:
		name = "reorder"
		err = s.Reorder(loop(), loop())
	case 3:
		name = "parallel"
		err = s.Parallel(loop())
	case 4:
		name = "vectorize"
		err = s.Vectorize(loop())
	case 5:
		name = "unroll"
		err = s.Unroll(loop())
	case 6:
		name = "cache_read"
		_, err = s.CacheRead(block(), rng.IntN(3), "local")
	case 7:
		name = "cache_write"
		_, err = s.CacheWrite(block(), 0, "global")
	case 8:
		name = "compute_at"
		err = s.ComputeAt(block(), loop())
	case 9:
		name = "reverse_compute_at"
		err = s.ReverseComputeAt(block(), loop())
	case 10:
		name = "compute_inline"
		err = s.ComputeInline(block())
	case 11:
		name = "decompose_reduction"
		_, err = s.DecomposeReduction(block(), loop())
	case 12:
		name = "reverse_compute_inline"
		err = s.ReverseComputeInline(block())
	case 13:
		name = "rfactor"
		_, err = s.RFactor(loop(), rng.IntN(3)-1)
	case 14:
		name = "set_scope"
		err = s.SetScope(block(), 0, "local")
	case 15:
		name = "storage_align"
		err = s.StorageAlign(block(), 0, rng.IntN(2)-1, int64(2+rng.IntN(6)), int64(rng.IntN(2)))
	case 16:
		name = "transform_layout"
		b := block()
		br, _ := s.BlockRealize(b)
		bi := BufferIndex{Write: rng.IntN(2) == 0}
		rs := br.Block.Reads
		if bi.Write {
			rs = br.Block.Writes
		}
		if len(rs) == 0 {
			return name, fmt.Errorf("no region")
		}
		bi.Index = rng.IntN(len(rs))
		maps := map[int][]string{
			1: {"lambda i: (i // 4, i % 4)", "lambda i: (i // 3, i % 3)"},
			2: {"lambda i, j: (j, i)", "lambda i, j: (i // 2, j, i % 2)", "lambda i, j: (j // 4, i, j % 4)"},
		}[len(rs[bi.Index].Buffer.Shape)]
		if len(maps) == 0 {
			return name, fmt.Errorf("no map")
		}
		m, perr := ParseIndexMap(maps[rng.IntN(len(maps))])
		if perr != nil {
			panic(perr)
		}
		z := 0.0
		err = s.TransformLayout(b, bi, m, &z)
	case 17:
		name = "pad_einsum"
		b := block()
		br, _ := s.BlockRealize(b)
		p := make([]int64, len(br.Block.IterVars))
		for i := range p {
			p[i] = int64(1 + rng.IntN(4))
		}
		err = s.PadEinsum(b, p)
	case 18:
		name = "blockize"
		_, err = s.Blockize(loop())
	case 19:
		name = "tensorize"
		err = s.Tensorize(loop(), VecFMAIntrin(4))
	}
	return name, err
}

// stencil returns C[i] = B[i] + B[i+1] with B[i] = A[i] + A[i+2]: reads
// of ranges, not points.
func stencil() *ir.PrimFunc {
	A := te.Placeholder(te.Shape(12), ir.Float32, "A")
	B := te.Compute(te.Shape(10), func(i ir.Expr) ir.Expr { return ir.Add(A.At(i), A.At(ir.Add(i, ir.I32(2)))) }, "B")
	C := te.Compute(te.Shape(9), func(i ir.Expr) ir.Expr { return ir.Add(B.At(i), B.At(ir.Add(i, ir.I32(1)))) }, "C")
	return mustFunc(A, C)
}
