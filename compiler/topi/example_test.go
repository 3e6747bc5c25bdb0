package topi_test

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/topi"
)

// ExampleLegalizeCall legalizes the IRModule tutorial's R.nn.relu(lv2) into the
// PrimFunc LegalizeOps calls with call_tir.
func ExampleLegalizeCall() {
	lv2 := ir.NewDataflowVar("lv2", ir.TensorOfShape(ir.Float32, 1, 256))
	call, err := op.Call("relax.nn.relu", []ir.RExpr{lv2}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	r, err := topi.LegalizeCall(call)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.NameHint, len(r.Args), r.Out)
	fmt.Print(script.Print(r.Func))
	// Output:
	// relu 1 R.Tensor((1, 256), dtype="float32")
	// # from tvm.script import tir as T
	//
	// @T.prim_func(private=True)
	// def main(lv2: T.Buffer((T.int64(1), T.int64(256)), "float32"), compute: T.Buffer((T.int64(1), T.int64(256)), "float32")):
	//     T.func_attr({"tir.noalias": T.bool(True)})
	//     # with T.block("root"):
	//     for i0, i1 in T.grid(T.int64(1), T.int64(256)):
	//         with T.block("compute"):
	//             v_i0, v_i1 = T.axis.remap("SS", [i0, i1])
	//             T.reads(lv2[v_i0, v_i1])
	//             T.writes(compute[v_i0, v_i1])
	//             compute[v_i0, v_i1] = T.max(lv2[v_i0, v_i1], T.float32(0.0))
}
