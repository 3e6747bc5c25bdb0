package cuda

import (
	"errors"
	"fmt"

	"github.com/kiln-ml/kiln/compiler/codegen/c"
	"github.com/kiln-ml/kiln/compiler/ir"
)

// call prints the GPU instructions of CUDA C that the C renderer leaves
// to its dialect (c.Dialect.Call): a warp shuffle as __shfl_down_sync and
// a ptx_mma as the prelude's kiln_mma_m16n8k16 helper.
func call(r *c.Renderer, e *ir.Call) (string, bool, error) {
	switch e.Op {
	case ir.OpWarpShuffleDown:
		if len(e.Args) != 5 || e.Type.Lanes > 1 {
			return "", false, errors.New("a warp shuffle takes 5 scalar arguments (mask, value, delta, width, warp size)")
		}
		return fmt.Sprintf("__shfl_down_sync(%s, %s, %s, %s)", r.Expr(e.Args[0]), r.Expr(e.Args[1]), r.Expr(e.Args[2]), r.Expr(e.Args[3])), true, nil
	case ir.OpPtxMma:
		s, err := ptxMma(r, e)
		return s, err == nil, err
	}
	return "", false, nil
}

// ptxMma prints a ptx_mma (ir.OpPtxMma) as the prelude's helper
// kiln_mma_m16n8k16_f32_<fp16|bf16>(d, a, b), whose inline PTX is
// mma.sync.aligned.m16n8k16.row.col.f32.<ab>.<ab>.f32 with C = D.
func ptxMma(r *c.Renderer, e *ir.Call) (string, error) {
	if len(e.Args) != 13 {
		return "", fmt.Errorf("ptx_mma takes 13 arguments, not %d", len(e.Args))
	}
	str := func(i int) string {
		if s, ok := e.Args[i].(*ir.StringImm); ok {
			return s.Value
		}
		return ""
	}
	ab := str(3)
	sat, _ := ir.IsConstInt(e.Args[12])
	if str(0) != "m16n8k16" || str(1) != "row" || str(2) != "col" || (ab != "fp16" && ab != "bf16") || str(4) != ab || str(5) != "fp32" || sat != 0 {
		return "", errors.New("only ptx_mma m16n8k16 row col of fp16 or bf16 into fp32, not saturating, is supported")
	}
	frags := make([]string, 3)
	for n, i := range []int{10, 6, 8} {
		v, ok := e.Args[i].(*ir.Var)
		if !ok {
			return "", fmt.Errorf("argument %d is not a buffer's data", i)
		}
		frags[n] = fmt.Sprintf("&%s[%s]", r.VarName(v), r.Expr(e.Args[i+1]))
	}
	return fmt.Sprintf("kiln_mma_m16n8k16_f32_%s(%s, %s, %s)", ab, frags[0], frags[1], frags[2]), nil
}
