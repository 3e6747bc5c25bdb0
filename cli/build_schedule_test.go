package cli

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// userConv2D is a 3×3 convolution written by hand in TVMScript (a padding
// block, then the convolution over NCHW with an OIHW kernel): nothing
// schedules it but kiln build.
func userConv2D(c, hw int) string {
	return fmt.Sprintf(`@T.prim_func
def conv2d(X: T.Buffer((1, %[1]d, %[2]d, %[2]d), "float32"), W: T.Buffer((%[1]d, %[1]d, 3, 3), "float32"), Y: T.Buffer((1, %[1]d, %[2]d, %[2]d), "float32")):
    P = T.alloc_buffer((1, %[1]d, %[3]d, %[3]d), "float32")
    for n, c, h, w in T.grid(1, %[1]d, %[3]d, %[3]d):
        with T.block("pad"):
            vn, vc, vh, vw = T.axis.remap("SSSS", [n, c, h, w])
            T.reads(X[vn, vc, vh - 1, vw - 1])
            T.writes(P[vn, vc, vh, vw])
            P[vn, vc, vh, vw] = T.if_then_else(1 <= vh and vh < %[4]d and 1 <= vw and vw < %[4]d, X[vn, vc, vh - 1, vw - 1], T.float32(0))
    for n, f, y, x, rc, ry, rx in T.grid(1, %[1]d, %[2]d, %[2]d, %[1]d, 3, 3):
        with T.block("conv"):
            vn, vf, vy, vx, vrc, vry, vrx = T.axis.remap("SSSSRRR", [n, f, y, x, rc, ry, rx])
            T.reads(P[vn, vrc, vy + vry, vx + vrx], W[vf, vrc, vry, vrx])
            T.writes(Y[vn, vf, vy, vx])
            with T.init():
                Y[vn, vf, vy, vx] = T.float32(0)
            Y[vn, vf, vy, vx] = Y[vn, vf, vy, vx] + P[vn, vrc, vy + vry, vx + vrx] * W[vf, vrc, vry, vrx]
`, c, hw, hw+2, hw+1)
}

// conv2DReference is userConv2D computed here, in float64.
func conv2DReference(x, w []float32, c, hw int) []float64 {
	y := make([]float64, c*hw*hw)
	for f := range c {
		for oy := range hw {
			for ox := range hw {
				s := 0.0
				for rc := range c {
					for ry := range 3 {
						for rx := range 3 {
							iy, ix := oy+ry-1, ox+rx-1
							if iy < 0 || iy >= hw || ix < 0 || ix >= hw {
								continue
							}
							s += float64(x[(rc*hw+iy)*hw+ix]) * float64(w[((f*c+rc)*3+ry)*3+rx])
						}
					}
				}
				y[(f*hw+oy)*hw+ox] = s
			}
		}
	}
	return y
}

// TestBuildDefaultSchedule: kiln build gives a hand-written conv2d the
// default schedule and says so, --no-default-schedule builds it as
// written, and both compute the convolution.
func TestBuildDefaultSchedule(t *testing.T) {
	const c, hw = 8, 12
	dir := t.TempDir()
	src := filepath.Join(dir, "conv.py")
	check.NoError(t, os.WriteFile(src, []byte(userConv2D(c, hw)), 0o644))

	rng := rand.New(rand.NewPCG(3, 4))
	random := func(name string, shape ndarray.Shape) []float32 {
		v := make([]float32, shape.NumElements())
		for i := range v {
			v[i] = rng.Float32()*2 - 1
		}
		a, err := ndarray.FromSlice(v, shape)
		check.NoError(t, err)
		check.NoError(t, ndarray.SaveNPY(filepath.Join(dir, name+".npy"), a))
		return v
	}
	x := random("x", ndarray.Shape{1, c, hw, hw})
	w := random("w", ndarray.Shape{c, c, 3, 3})
	want := conv2DReference(x, w, c, hw)

	sources := map[string]string{}
	for _, tc := range []struct {
		name, line string
		flags      []string
	}{
		{"default", "build: conv2d: default schedule (", nil},
		{"unscheduled", "build: conv2d: unscheduled\n", []string{"--no-default-schedule"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			art := filepath.Join(dir, tc.name+".kiln")
			keep := filepath.Join(dir, tc.name+"-src")
			_, errOut, err := runApp(t, append([]string{"build", src, "-o", art, "--no-cache", "--keep-source", keep}, tc.flags...)...)
			check.NoError(t, err, errOut)
			check.True(t, strings.Contains(errOut, tc.line), errOut)
			b, err := os.ReadFile(filepath.Join(keep, "host.c"))
			check.NoError(t, err)
			sources[tc.name] = string(b)

			out := filepath.Join(dir, tc.name+"-out")
			_, errOut, err = runApp(t, "run", art, "--input", "X="+filepath.Join(dir, "x.npy"), "--input", "W="+filepath.Join(dir, "w.npy"), "--output", out)
			check.NoError(t, err, errOut)
			ya, err := ndarray.LoadNPY(filepath.Join(out, "Y.npy"))
			check.NoError(t, err)
			got, err := ndarray.ToSlice[float32](ya)
			check.NoError(t, err)
			check.Equal(t, len(got), len(want))
			for i := range want {
				if d := math.Abs(float64(got[i]) - want[i]); !(d <= 1e-4*(1+math.Abs(want[i]))) {
					t.Fatalf("Y[%d] = %g, want %g", i, got[i], want[i])
				}
			}
		})
	}
	// The default schedule computes vectors; the function as written, scalars.
	const vector = "__attribute__((vector_size("
	check.True(t, strings.Contains(sources["default"], vector), "the default schedule has no vector code")
	check.True(t, !strings.Contains(sources["unscheduled"], vector), "the unscheduled build has vector code")
}

// TestBuildKeepsUserSchedule: the tensor-expression demo's matmul, its
// outer loop made parallel by its author, is built with that schedule.
func TestBuildKeepsUserSchedule(t *testing.T) {
	f, _, err := teMatmulScheduled()
	check.NoError(t, err)
	dir := t.TempDir()
	src := filepath.Join(dir, "matmul.py")
	check.NoError(t, os.WriteFile(src, []byte(script.Print(f)), 0o644))
	keep := filepath.Join(dir, "src")
	_, errOut, err := runApp(t, "build", src, "-o", filepath.Join(dir, "matmul.kiln"), "--no-cache", "--keep-source", keep)
	check.NoError(t, err, errOut)
	check.True(t, strings.Contains(errOut, "build: matrix_multiply: already scheduled (loop "), errOut)
	check.True(t, strings.Contains(errOut, " is parallel)"), errOut)
	b, err := os.ReadFile(filepath.Join(keep, "host.c"))
	check.NoError(t, err)
	check.True(t, strings.Contains(string(b), "kiln_parallel_run(kiln_parallel_"), "the parallel loop is lost")
	check.True(t, !strings.Contains(string(b), "__attribute__((vector_size("), "a default schedule was added")
}
