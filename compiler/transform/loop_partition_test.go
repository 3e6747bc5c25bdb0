package transform

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

// partitionSrc is a padding stage (one row and column of zeros around A)
// whose loops ask to be partitioned, and one of stride 2 whose phase is
// unrolled (the comparisons of its columns become constant after unroll).
const partitionSrc = `
@T.prim_func
def pad(A: T.Buffer((6, 5), "float32"), B: T.Buffer((8, 9), "float32")):
    for i in T.serial(8, annotations={"pragma_loop_partition_hint": T.bool(True)}):
        for j in T.serial(9, annotations={"pragma_loop_partition_hint": T.bool(True)}):
            with T.block("B"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = T.if_then_else(1 <= vi and vi < 7 and 1 <= vj and vj < 6, A[vi - 1, vj - 1], T.float32(0.0))

@T.prim_func
def phases(A: T.Buffer((4, 9), "float32"), B: T.Buffer((2, 4, 6), "float32")):
    for p in T.unroll(2):
        for i in range(4):
            for j in T.serial(6, annotations={"pragma_loop_partition_hint": T.bool(True)}):
                with T.block("B"):
                    vp, vi, vj = T.axis.remap("SSS", [p, i, j])
                    B[vp, vi, vj] = T.if_then_else(1 <= vj * 2 + vp and vj * 2 + vp < 10, A[vi, vj * 2 + vp - 1], T.float32(0.0))

@T.prim_func
def plain(A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32")):
    for i in range(8):
        with T.block("B"):
            vi = T.axis.remap("S", [i])
            B[vi] = T.if_then_else(vi < 5, A[vi], T.float32(0.0))
`

// TestPartitionLoops lowers each function with and without
// partition_loops: the results agree with the function's in the
// interpreter, and the partitioned interior reads A with no condition.
func TestPartitionLoops(t *testing.T) {
	m, err := script.Parse("partition.py", partitionSrc)
	check.NoError(t, err)
	rng := rand.New(rand.NewPCG(5, 6))
	for name, f := range m.PrimFuncs() {
		t.Run(name, func(t *testing.T) {
			with, err := Lower(f, Options{StopAfter: "storage_rewrite", Verify: true})
			check.NoError(t, err)
			without, err := Lower(f, Options{StopAfter: "storage_rewrite", Skip: []string{"partition_loops"}, Verify: true})
			check.NoError(t, err)
			args := randomArgs(t, rng, f)
			var results [][][]byte
			for _, g := range []*ir.PrimFunc{f, with, without} {
				cp := copyArgs(t, args)
				check.NoError(t, interp.RunOptions(g, interp.Options{Poison: true, MaxSteps: 1 << 20}, cp...))
				results = append(results, argBytes(t, cp))
			}
			check.True(t, slices.EqualFunc(results[0], results[1], bytes.Equal), "partitioned lowering differs from the function")
			check.True(t, slices.EqualFunc(results[0], results[2], bytes.Equal), "lowering without partitioning differs from the function")
			text := script.Print(with)
			hinted := name != "plain"
			check.Equal(t, unguardedLoad(with.Body), hinted, "a load of A outside any condition:\n", text)
			check.Equal(t, strings.Contains(script.Print(without), "if_then_else"), true)
		})
	}
}

// unguardedLoad reports whether s loads a buffer outside every
// if_then_else (the interior of a partitioned padding stage).
func unguardedLoad(s ir.Stmt) bool {
	found := false
	ir.Visit(s, func(n ir.Node) bool {
		if c, ok := n.(*ir.Call); ok && c.Op == ir.OpIfThenElse {
			return false
		}
		if _, ok := n.(*ir.BufferLoad); ok {
			found = true
		}
		return !found
	})
	return found
}

// lanesSrc is a run of 49 elements in vectors of 16 lanes, the lanes past
// the run guarded (a block predicate on the lanes' variable, the form of
// a split that does not divide its loop): the loop over vectors asks to
// be partitioned.
const lanesSrc = `
@T.prim_func
def lanes(A: T.Buffer((2, 49), "float32"), B: T.Buffer((2, 49), "float32")):
    for c in range(2):
        for vo in T.serial(4, annotations={"pragma_loop_partition_hint": T.bool(True)}):
            for l in T.vectorized(16):
                with T.block("B"):
                    vc = T.axis.spatial(2, c)
                    vi = T.axis.spatial(49, vo * 16 + l)
                    T.where(vo * 16 + l < 49)
                    B[vc, vi] = A[vc, vi] * T.float32(2.0)
`

// TestPartitionLoopsLanes lowers a guarded vector loop with and without
// partition_loops: both agree with the function in the interpreter, and
// partitioned, the whole vectors are a loop of their own with no guard
// (the loop over vectors is cut where the guard holds for every lane,
// not only where it holds for lane 0).
func TestPartitionLoopsLanes(t *testing.T) {
	m, err := script.Parse("lanes.py", lanesSrc)
	check.NoError(t, err)
	f := m.PrimFunc("lanes")
	with, err := Lower(f, Options{StopAfter: "storage_rewrite", Verify: true})
	check.NoError(t, err)
	without, err := Lower(f, Options{StopAfter: "storage_rewrite", Skip: []string{"partition_loops"}, Verify: true})
	check.NoError(t, err)
	args := randomArgs(t, rand.New(rand.NewPCG(7, 8)), f)
	var results [][][]byte
	for _, g := range []*ir.PrimFunc{f, with, without} {
		cp := copyArgs(t, args)
		check.NoError(t, interp.RunOptions(g, interp.Options{Poison: true, MaxSteps: 1 << 20}, cp...))
		results = append(results, argBytes(t, cp))
	}
	check.True(t, slices.EqualFunc(results[0], results[1], bytes.Equal), "partitioned lowering differs from the function")
	check.True(t, slices.EqualFunc(results[0], results[2], bytes.Equal), "lowering without partitioning differs from the function")
	check.Equal(t, loadOutsideIf(with.Body), true, "whole vectors without a guard:\n", script.Print(with))
	check.Equal(t, loadOutsideIf(without.Body), false, "every vector guarded:\n", script.Print(without))
}

// loadOutsideIf reports whether s loads a buffer outside every if
// statement and if_then_else.
func loadOutsideIf(s ir.Stmt) bool {
	found := false
	ir.Visit(s, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.IfThenElse:
			return false
		case *ir.Call:
			if n.Op == ir.OpIfThenElse {
				return false
			}
		case *ir.BufferLoad:
			found = true
		}
		return !found
	})
	return found
}
