package c_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/cpu"

	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/ckernel"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// sharedLoadsSrc is y[o, r, l] = x[o + r + l] + x[o + r + 1 + l] over
// rows r of vectors of lanes: row r's second vector is row r+1's first,
// a load the rows share. With pinned, the row loop is annotated
// pragma_vector_loads_in_registers.
func sharedLoadsSrc(name string, lanes, rows int, pinned bool) string {
	ann := ""
	if pinned {
		ann = `, annotations={"pragma_vector_loads_in_registers": True}`
	}
	return fmt.Sprintf(`
@T.prim_func
def %[1]s(x: T.Buffer((T.int64(%[2]d),), "float32"), y: T.Buffer((T.int64(%[3]d),), "float32")):
    T.func_attr({"tir.noalias": T.bool(True), "kiln.vector_bytes": T.int64(%[4]d)})
    for o in T.serial(T.int64(2)%[5]s):
        for r in T.unroll(T.int64(%[6]d)):
            for l in T.vectorized(T.int64(%[7]d)):
                with T.block("rows"):
                    vo, vr, vl = T.axis.remap("SSS", [o, r, l])
                    y[vo * T.int64(%[8]d) + vr * T.int64(%[7]d) + vl] = x[vo + vr + vl] + x[vo + vr + T.int64(1) + vl]
`, name, rows+lanes+2, 2*rows*lanes, 4*lanes, ann, rows, lanes, rows*lanes)
}

// TestLoadsInRegisters: vector loads inside a loop annotated
// pragma_vector_loads_in_registers go through kiln_vload_reg (a load
// kept in a register), those of other loops through kiln_vload, and
// both compute the same as the function says, for 4, 8 and 16 lanes.
func TestLoadsInRegisters(t *testing.T) {
	var src strings.Builder
	for _, lanes := range []int{4, 8, 16} {
		for _, pinned := range []bool{false, true} {
			src.WriteString(sharedLoadsSrc(fmt.Sprintf("rows_l%d_%v", lanes, pinned), lanes, 3, pinned))
		}
	}
	mod, err := script.Parse("shared.py", src.String())
	check.NoError(t, err)
	csrc := ckernel.Source(t, mod)
	for _, lanes := range []int{4, 8, 16} {
		body := func(name string) string {
			i := strings.Index(csrc, "int32_t "+name+"(")
			check.True(t, i >= 0, name, "in:\n", csrc)
			return csrc[i:]
		}
		on, off := body(fmt.Sprintf("rows_l%d_true", lanes)), body(fmt.Sprintf("rows_l%d_false", lanes))
		on, off = on[:strings.Index(on, "\n}\n")], off[:strings.Index(off, "\n}\n")]
		reg := fmt.Sprintf("kiln_vload_reg_float32x%d(&x[", lanes)
		check.True(t, strings.Contains(on, reg), "annotated: loads kept in registers:\n", on)
		check.True(t, !strings.Contains(off, reg), "not annotated: plain loads:\n", off)
		check.True(t, strings.Contains(csrc, fmt.Sprintf("kiln_vload_reg_float32x%d(const float* p)", lanes)), "its helper")
	}
	check.True(t, strings.Contains(csrc, "#define KILN_IN_REGISTER_64(v)"), "the macro:\n", csrc)
	// Built for the host, and on x86-64 also for SSE2 alone (the 16-byte
	// vectors held in registers, the wider ones loaded plainly) and AVX2
	// (the 16-lane vectors wider than its registers).
	flagSets := [][]string{{"-O3", "-march=native"}}
	if runtime.GOARCH == "amd64" {
		flagSets = append(flagSets, []string{"-O3"})
		if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
			flagSets = append(flagSets, []string{"-O3", "-march=haswell"})
		}
	}
	for _, flags := range flagSets {
		m := ckernel.Load(t, csrc, flags...)
		for _, lanes := range []int{4, 8, 16} {
			for _, pinned := range []bool{false, true} {
				name := fmt.Sprintf("%s/rows_l%d_%v", strings.Join(flags, "_"), lanes, pinned)
				fn := fmt.Sprintf("rows_l%d_%v", lanes, pinned)
				t.Run(name, func(t *testing.T) {
					const rows = 3
					xs := make([]float32, rows+lanes+2)
					for i := range xs {
						xs[i] = float32(i*i) + 0.5
					}
					x, err := ndarray.FromSlice(xs, ndarray.Shape{int64(len(xs))})
					check.NoError(t, err)
					y, err := ndarray.FromSlice(make([]float32, 2*rows*lanes), ndarray.Shape{int64(2 * rows * lanes)})
					check.NoError(t, err)
					f, err := m.GetFunction(fn)
					check.NoError(t, err)
					_, err = f.Call(packedfunc.Array(x), packedfunc.Array(y))
					check.NoError(t, err)
					got, err := ndarray.ToSlice[float32](y)
					check.NoError(t, err)
					for o := 0; o < 2; o++ {
						for r := 0; r < rows; r++ {
							for l := 0; l < lanes; l++ {
								check.Equal(t, got[o*rows*lanes+r*lanes+l], xs[o+r+l]+xs[o+r+1+l], "o", o, "row", r, "lane", l)
							}
						}
					}
				})
			}
		}
	}
}
