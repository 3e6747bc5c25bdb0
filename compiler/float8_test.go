package compiler_test

import (
	"context"
	"testing"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/script"
	cudadev "github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestBuildFloat8CPU: a CPU target refuses the 8-bit float dtypes,
// naming the function and the buffer, before any code is generated.
func TestBuildFloat8CPU(t *testing.T) {
	for _, dt := range []string{"float8_e4m3", "float8_e5m2"} {
		m, err := script.Parse("q.py", `# from tvm.script import tir as T
@T.prim_func
def quant(A: T.Buffer((8,), "float32"), Q: T.Buffer((8,), "`+dt+`")):
    T.func_attr({"global_symbol": "quant"})
    for i in range(8):
        with T.block("Q"):
            vi = T.axis.spatial(8, i)
            Q[vi] = T.Cast("`+dt+`", A[vi])
`)
		check.NoError(t, err)
		_, err = compiler.Build(context.Background(), m, compiler.MustParseTarget("llvm"), compiler.BuildOptions{NoCache: true})
		check.Error(t, err, `build: function "quant": buffer "Q": `+dt+` is not supported on cpu (8-bit floats need a CUDA target of sm_89 or newer)`)
	}
}

// TestBuildFloat8CUDA: kiln build for cuda takes float8 buffers for sm_90
// and refuses them for sm_80, naming the kernel, the buffer and the
// architecture.
func TestBuildFloat8CUDA(t *testing.T) {
	needNVRTC(t)
	m, err := script.Parse("q.py", `# from tvm.script import tir as T
@T.prim_func
def quant(A: T.Buffer((256,), "float32"), Q: T.Buffer((256,), "float8_e4m3")):
    T.func_attr({"global_symbol": "quant"})
    for i in range(256):
        with T.block("Q"):
            vi = T.axis.spatial(256, i)
            Q[vi] = T.Cast("float8_e4m3", A[vi])
`)
	check.NoError(t, err)
	nv := compiler.BuildOptions{NoCache: true, CUDA: cudadev.NVRTC{}}
	_, err = compiler.Build(context.Background(), m, compiler.MustParseTarget("cuda -arch=sm_90"), nv)
	check.NoError(t, err)
	_, err = compiler.Build(context.Background(), m, compiler.MustParseTarget("cuda -arch=sm_80"), nv)
	check.Error(t, err, `kernel "quant_kernel": buffer "Q": float8_e4m3 needs sm_89 or newer; target is sm_80`)
}
