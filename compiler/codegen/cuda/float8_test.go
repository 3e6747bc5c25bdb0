package cuda

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/transform"
	cudadev "github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/internal/check"
)

// float8Source quantizes A (scaled past float8_e4m3's largest value) into Q of dtype dt and reads it back
// into B, one thread per element.
func float8Source(dt string) string {
	return strings.ReplaceAll(`# from tvm.script import tir as T
@T.prim_func
def quant(A: T.Buffer((256,), "float32"), Q: T.Buffer((256,), "DT"), B: T.Buffer((256,), "float32"), H: T.Buffer((256,), "float16")):
    T.func_attr({"global_symbol": "quant", "tir.noalias": T.bool(True)})
    for bx in T.thread_binding(2, thread="blockIdx.x"):
        for tx in T.thread_binding(128, thread="threadIdx.x"):
            with T.block("Q"):
                vi = T.axis.spatial(256, bx * 128 + tx)
                Q[vi] = T.Cast("DT", A[vi] * T.float32(600))
                B[vi] = T.Cast("float32", Q[vi]) + T.float32(0.5)
                H[vi] = T.Cast("float16", Q[vi])
`, "DT", dt)
}

// TestFloat8 generates kernels that convert to and from float8_e4m3 and
// float8_e5m2 for sm_89 and sm_90: NVRTC compiles them to PTX's
// cvt.rn.satfinite conversions, and the host emulation of the generated
// source matches the interpreter (rounding to nearest even, saturating).
// (The conversions of sm_90, PTX's, are compiled but not run here.) For
// sm_80 and sm_86 they are refused naming the kernel, the buffer and
// the architecture, and arithmetic in float8 is refused everywhere.
func TestFloat8(t *testing.T) {
	for _, dt := range []string{"float8_e4m3", "float8_e5m2"} {
		t.Run(dt, func(t *testing.T) {
			m, err := script.Parse("quant.py", float8Source(dt))
			check.NoError(t, err)
			lowered, err := transform.LowerModule(m, LowerOptions())
			check.NoError(t, err)
			for _, arch := range []string{"sm_80", "sm_86"} {
				lim, err := ArchLimits(arch)
				check.NoError(t, err)
				_, _, err = Generate(lowered, lim)
				check.Error(t, err, `kernel "quant": buffer "Q": `+dt+` needs sm_89 or newer; target is `+arch)
			}
			lim, err := ArchLimits("sm_90")
			check.NoError(t, err)
			src, ks, err := Generate(lowered, lim)
			check.NoError(t, err)
			check.True(t, strings.Contains(src, "kiln_fp8_"+strings.TrimPrefix(dt, "float8_")+"* __restrict__ Q"), src)
			t.Run("nvrtc", func(t *testing.T) {
				if _, _, _, err := cudadev.NVRTCVersion(); err != nil {
					t.Skipf("NVRTC is not installed (%v)", err)
				}
				for _, arch := range []string{"sm_89", "sm_90"} {
					ptx, log, err := cudadev.CompilePTX(src, "kernels.cu", []string{"--gpu-architecture=compute_" + strings.TrimPrefix(arch, "sm_")})
					check.NoError(t, err, log)
					// sm_90 converts with PTX's cvt; sm_89, which NVRTC 11.8's
					// ptxas does not give it, with float bit arithmetic (the
					// code the host emulation runs).
					cvt := strings.Contains(ptx, "cvt.rn.satfinite."+strings.TrimPrefix(dt, "float8_")+"x2.f32")
					check.Equal(t, cvt, arch == "sm_90", "PTX float8 conversion for", arch)
					_, log, err = cudadev.CompileCUBIN(src, "kernels.cu", []string{"--gpu-architecture=" + arch, "--ptxas-options=-v"})
					check.NoError(t, err, log)
				}
			})
			t.Run("emulate", func(t *testing.T) { emulate(t, m, src, ks) })
		})
	}
	bad := strings.Replace(float8Source("float8_e4m3"), `B[vi] = T.Cast("float32", Q[vi]) + T.float32(0.5)`, `Q[vi] = Q[vi] + Q[vi]`, 1)
	m, err := script.Parse("bad.py", bad)
	check.NoError(t, err)
	lowered, err := transform.LowerModule(m, LowerOptions())
	check.NoError(t, err)
	lim, err := ArchLimits("sm_90")
	check.NoError(t, err)
	_, _, err = Generate(lowered, lim)
	check.Error(t, err, `float8_e4m3 is a storage type: convert it to float32 (T.Cast) to compute`)
}
