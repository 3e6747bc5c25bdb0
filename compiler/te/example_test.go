package te_test

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
)

// Example is the tensor-expression tutorial's matrix multiplication: C[i, j] = sum over k of
// A[i, k] * B[k, j], with symbolic sizes.
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
	fmt.Print(script.Print(f.WithAttr(ir.AttrGlobalSymbol, "matrix_multiply")))
	// Output:
	// # from tvm.script import tir as T
	//
	// @T.prim_func
	// def matrix_multiply(var_A: T.handle, var_B: T.handle, var_C: T.handle):
	//     T.func_attr({"tir.noalias": T.bool(True)})
	//     N = T.int32()
	//     K = T.int32()
	//     M = T.int32()
	//     A = T.match_buffer(var_A, (N, K))
	//     B = T.match_buffer(var_B, (K, M))
	//     C = T.match_buffer(var_C, (N, M))
	//     # with T.block("root"):
	//     for i, j, k in T.grid(N, M, K):
	//         with T.block("C"):
	//             v_i, v_j, v_k = T.axis.remap("SSR", [i, j, k])
	//             T.reads(A[v_i, v_k], B[v_k, v_j])
	//             T.writes(C[v_i, v_j])
	//             with T.init():
	//                 C[v_i, v_j] = T.float32(0.0)
	//             C[v_i, v_j] = C[v_i, v_j] + A[v_i, v_k] * B[v_k, v_j]
}
