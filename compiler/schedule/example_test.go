package schedule_test

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
)

// Example is the tensor-expression tutorial's matrix multiplication with its schedule
// s[C].parallel(C.op.axis[0]): the loop of C's first axis runs in
// parallel.
func Example() {
	N, M, K := te.Var("N"), te.Var("M"), te.Var("K")
	A := te.Placeholder([]ir.Expr{N, K}, ir.Float32, "A")
	B := te.Placeholder([]ir.Expr{K, M}, ir.Float32, "B")
	k := te.ReduceAxis(ir.RangeFromExtent(K), "k")
	C := te.Compute([]ir.Expr{N, M}, func(i, j ir.Expr) ir.Expr {
		return te.Sum(ir.Mul(A.At(i, k), B.At(k, j)), k)
	}, "C")
	f, err := te.CreatePrimFunc([]*te.Tensor{A, B, C})
	if err != nil {
		fmt.Println(err)
		return
	}

	s, err := schedule.New(f) // s = te.create_schedule(C.op)
	if err != nil {
		fmt.Println(err)
		return
	}
	c, _ := s.GetBlock("C")
	axis, _ := s.GetLoops(c)                    // C.op.axis (and the reduce axis)
	if err := s.Parallel(axis[0]); err != nil { // s[C].parallel(C.op.axis[0])
		fmt.Println(err)
		return
	}
	fmt.Print(script.Print(s.Func()))
	// Output:
	// # from tvm.script import tir as T
	//
	// @T.prim_func
	// def main(var_A: T.handle, var_B: T.handle, var_C: T.handle):
	//     T.func_attr({"tir.noalias": T.bool(True)})
	//     N = T.int32()
	//     K = T.int32()
	//     M = T.int32()
	//     A = T.match_buffer(var_A, (N, K))
	//     B = T.match_buffer(var_B, (K, M))
	//     C = T.match_buffer(var_C, (N, M))
	//     # with T.block("root"):
	//     for i in T.parallel(N):
	//         for j, k in T.grid(M, K):
	//             with T.block("C"):
	//                 v_i, v_j, v_k = T.axis.remap("SSR", [i, j, k])
	//                 T.reads(A[v_i, v_k], B[v_k, v_j])
	//                 T.writes(C[v_i, v_j])
	//                 with T.init():
	//                     C[v_i, v_j] = T.float32(0.0)
	//                 C[v_i, v_j] = C[v_i, v_j] + A[v_i, v_k] * B[v_k, v_j]
}

// Example_registerBlocked is the schedule of the matmul benchmark: an
// 8×32 tile of C accumulates in a local buffer over the whole reduction,
// one 32-lane vector per row, rows unrolled, tiles in parallel.
func Example_registerBlocked() {
	A := te.Placeholder(te.Shape(1024, 1024), ir.Float32, "A")
	B := te.Placeholder(te.Shape(1024, 1024), ir.Float32, "B")
	k := te.ReduceAxis(ir.RangeFromExtent(ir.I32(1024)), "k")
	C := te.Compute(te.Shape(1024, 1024), func(i, j ir.Expr) ir.Expr {
		return te.Sum(ir.Mul(A.At(i, k), B.At(k, j)), k)
	}, "C")
	f, _ := te.CreatePrimFunc([]*te.Tensor{A, B, C})
	s, _ := schedule.New(f)
	err := func() error {
		c, _ := s.GetBlock("C")
		l, _ := s.GetLoops(c)
		i, err := s.Split(l[0], -1, 8)
		if err != nil {
			return err
		}
		j, err := s.Split(l[1], -1, 32)
		if err != nil {
			return err
		}
		if err := s.Reorder(i[0], j[0], l[2], i[1], j[1]); err != nil {
			return err
		}
		wb, err := s.CacheWrite(c, 0, "local")
		if err != nil {
			return err
		}
		if err := s.ReverseComputeAt(wb, j[0]); err != nil {
			return err
		}
		init, err := s.DecomposeReduction(c, l[2])
		if err != nil {
			return err
		}
		il, _ := s.GetLoops(init)
		wl, _ := s.GetLoops(wb)
		for _, v := range []schedule.LoopRV{j[1], il[len(il)-1], wl[len(wl)-1]} {
			if err := s.Vectorize(v); err != nil {
				return err
			}
		}
		if err := s.Unroll(i[1]); err != nil {
			return err
		}
		fused, err := s.Fuse(i[0], j[0])
		if err != nil {
			return err
		}
		return s.Parallel(fused)
	}()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, line := range s.Trace() {
		fmt.Println(line)
	}
	// Output:
	// C = sch.get_block("C")
	// i, j, k = sch.get_loops(C)
	// i_0, i_1 = sch.split(loop=i, factors=[None, 8])
	// j_0, j_1 = sch.split(loop=j, factors=[None, 32])
	// sch.reorder(i_0, j_0, k, i_1, j_1)
	// C_local = sch.cache_write(C, 0, "local")
	// sch.reverse_compute_at(C_local, j_0)
	// C_init = sch.decompose_reduction(C, k)
	// i_0, j_0, i_1_init, j_1_init = sch.get_loops(C_init)
	// i_0, j_0, ax0, ax1 = sch.get_loops(C_local)
	// sch.vectorize(j_1)
	// sch.vectorize(j_1_init)
	// sch.vectorize(ax1)
	// sch.unroll(i_1)
	// i_0_j_0_fused = sch.fuse(i_0, j_0)
	// sch.parallel(i_0_j_0_fused)
}

// A matmul's inner loop as the vector microkernel, and its trace replayed.
func Example_tensorize() {
	A := te.Placeholder(te.Shape(4, 3), ir.Float32, "A")
	B := te.Placeholder(te.Shape(3, 32), ir.Float32, "B")
	k := te.ReduceAxis(ir.RangeFromExtent(ir.I32(3)), "k")
	C := te.Compute(te.Shape(4, 32), func(i, j ir.Expr) ir.Expr { return te.Sum(ir.Mul(A.At(i, k), B.At(k, j)), k) }, "C")
	f, _ := te.CreatePrimFunc([]*te.Tensor{A, B, C})
	s, _ := schedule.New(f)
	err := func() error {
		c, _ := s.GetBlock("C")
		ls, _ := s.GetLoops(c)
		j, err := s.Split(ls[1], -1, 16)
		if err != nil {
			return err
		}
		if err := s.Reorder(ls[0], j[0], ls[2], j[1]); err != nil {
			return err
		}
		if _, err := s.DecomposeReduction(c, ls[2]); err != nil {
			return err
		}
		return s.Tensorize(j[1], schedule.VecFMAIntrin(16))
	}()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, line := range s.Trace() {
		fmt.Println(line)
	}
	r, err := schedule.Replay(f, s.Trace())
	fmt.Println(err == nil && ir.StructuralEqual(r.Func(), s.Func()))
	// Output:
	// C = sch.get_block("C")
	// i, j, k = sch.get_loops(C)
	// j_0, j_1 = sch.split(loop=j, factors=[None, 16])
	// sch.reorder(i, j_0, k, j_1)
	// C_init = sch.decompose_reduction(C, k)
	// sch.tensorize(j_1, "kiln.vec_fma_f32x16")
	// true
}
