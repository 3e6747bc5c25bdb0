package cpu_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// buildSO compiles a C file from testdata into a shared object.
func buildSO(t *testing.T, name string) string { return buildSOB(t, name) }

// buildSOB is buildSO for tests and benchmarks.
func buildSOB(t testing.TB, name string) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler (cc) on PATH")
	}
	dir := t.TempDir()
	check.NoError(t, os.WriteFile(filepath.Join(dir, abi.HeaderName), []byte(abi.Header), 0o644))
	src, err := filepath.Abs(filepath.Join("testdata", name+".c"))
	check.NoError(t, err)
	out := filepath.Join(dir, name+".so")
	cmd := exec.Command(cc, "-O2", "-shared", "-fPIC", "-I", dir, "-o", out, src)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cc %s: %v\n%s", name, err, b)
	}
	return out
}

func TestLoadAndCallThroughRegistry(t *testing.T) {
	path := buildSO(t, "kernels")
	loader, err := packedfunc.Get("runtime.module.load_cpu")
	check.NoError(t, err)
	mv, err := loader.Call(packedfunc.String(path))
	check.NoError(t, err)
	mod, err := mv.AsModule()
	check.NoError(t, err)
	defer mod.Close()
	check.Equal(t, mod.Type(), "cpu")
	check.Equal(t, mod.Functions(), []string{"fail", "fill_index", "scale", "vadd"})

	vadd, err := mod.GetFunction("vadd")
	check.NoError(t, err)
	n := 1000
	xa, xb := make([]float32, n), make([]float32, n)
	for i := range xa {
		xa[i], xb[i] = float32(i), float32(2*i)+0.5
	}
	a, err := ndarray.FromSlice(xa, ndarray.Shape{int64(n)})
	check.NoError(t, err)
	b, err := ndarray.FromSlice(xb, ndarray.Shape{int64(n)})
	check.NoError(t, err)
	c, err := ndarray.Empty(ndarray.Shape{int64(n)}, ndarray.Float32, a.Device())
	check.NoError(t, err)
	_, err = vadd.Call(packedfunc.Array(a), packedfunc.Array(b), packedfunc.Array(c))
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](c)
	check.NoError(t, err)
	for i := range got {
		if got[i] != xa[i]+xb[i] {
			t.Fatalf("c[%d] = %v, want %v", i, got[i], xa[i]+xb[i])
		}
	}

	// Scalars: a float and an int argument.
	scale, err := mod.GetFunction("scale")
	check.NoError(t, err)
	x, err := ndarray.FromSlice([]float64{1, 2, 3, 4, 5, 6, 7, 8}, ndarray.Shape{2, 4})
	check.NoError(t, err)
	_, err = scale.Call(packedfunc.Array(x), packedfunc.Float(0.5))
	check.NoError(t, err)
	gx, err := ndarray.ToSlice[float64](x)
	check.NoError(t, err)
	check.Equal(t, gx, []float64{0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4})
	// An int converts to a float parameter.
	_, err = scale.Call(packedfunc.Array(x), packedfunc.Int(2))
	check.NoError(t, err)

	fill, err := mod.GetFunction("fill_index")
	check.NoError(t, err)
	y, err := ndarray.Empty(ndarray.Shape{5}, ndarray.Int32, a.Device())
	check.NoError(t, err)
	_, err = fill.Call(packedfunc.Array(y), packedfunc.Int(10))
	check.NoError(t, err)
	gy, err := ndarray.ToSlice[int32](y)
	check.NoError(t, err)
	check.Equal(t, gy, []int32{10, 11, 12, 13, 14})
}

func TestBadCalls(t *testing.T) {
	mod, err := cpu.Load(buildSO(t, "kernels"))
	check.NoError(t, err)
	defer mod.Close()
	vec := func(n int64, dt ndarray.DType) packedfunc.Value {
		a, err := ndarray.Zeros(ndarray.Shape{n}, dt, devices.CPUDevice)
		check.NoError(t, err)
		return packedfunc.Array(a)
	}
	f32 := ndarray.Float32
	mat, err := ndarray.Zeros(ndarray.Shape{2, 3}, ndarray.Float64, devices.CPUDevice)
	check.NoError(t, err)
	mat4, err := ndarray.Zeros(ndarray.Shape{2, 4}, ndarray.Float64, devices.CPUDevice)
	check.NoError(t, err)
	cases := []struct {
		name, fn string
		args     []packedfunc.Value
		want     []string
		is       error
	}{
		{"too few", "vadd", []packedfunc.Value{vec(4, f32), vec(4, f32)}, []string{"vadd", "want 3, got 2"}, packedfunc.ErrArity},
		{"too many", "fail", []packedfunc.Value{packedfunc.Int(1), packedfunc.Int(2)}, []string{"fail", "want 1, got 2"}, packedfunc.ErrArity},
		{"int for tensor", "vadd", []packedfunc.Value{vec(4, f32), packedfunc.Int(3), vec(4, f32)}, []string{"argument 1", `"B"`, "want ndarray, got int"}, packedfunc.ErrType},
		{"wrong dtype", "vadd", []packedfunc.Value{vec(4, f32), vec(4, ndarray.Int32), vec(4, f32)}, []string{"argument 1", "dtype int32, want float32"}, nil},
		{"symbolic mismatch", "vadd", []packedfunc.Value{vec(4, f32), vec(4, f32), vec(5, f32)}, []string{"argument 2", `"C"`, "n is already 4"}, nil},
		{"wrong ndim", "scale", []packedfunc.Value{vec(8, ndarray.Float64), packedfunc.Float(1)}, []string{"argument 0", "1 dimensions", "want 2"}, nil},
		{"static shape", "scale", []packedfunc.Value{packedfunc.Array(mat), packedfunc.Float(1)}, []string{"argument 0", "shape (2, 3), want (m, 4)"}, nil},
		{"string for float", "scale", []packedfunc.Value{packedfunc.Array(mat4), packedfunc.String("x")}, []string{"argument 1", `"alpha"`, "want float, got string"}, packedfunc.ErrType},
		{"float for int", "fill_index", []packedfunc.Value{vec(4, ndarray.Int32), packedfunc.Float(1.5)}, []string{"argument 1", "want int, got float"}, packedfunc.ErrType},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := mod.GetFunction(tc.fn)
			check.NoError(t, err)
			_, err = f.Call(tc.args...)
			check.Error(t, err, tc.want...)
			if tc.is != nil {
				check.ErrorIs(t, err, tc.is)
			}
		})
	}
}

func TestKernelErrorCarriesLastError(t *testing.T) {
	mod, err := cpu.Load(buildSO(t, "kernels"))
	check.NoError(t, err)
	defer mod.Close()
	f, err := mod.GetFunction("fail")
	check.NoError(t, err)
	// Concurrent failures each see their own thread's message.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := f.Call(packedfunc.Int(int64(i)))
			var ke *cpu.KernelError
			if !errors.As(err, &ke) {
				t.Errorf("want KernelError, got %v", err)
				return
			}
			if ke.Code != 7 || ke.Msg != "fail: input was "+string(rune('0'+i)) {
				t.Errorf("got %+v", ke)
			}
		}()
	}
	wg.Wait()
}

func TestLoadErrors(t *testing.T) {
	_, err := cpu.Load(filepath.Join(t.TempDir(), "missing.so"))
	check.Error(t, err, "missing.so")
	_, err = cpu.Load(buildSO(t, "nometa"))
	check.Error(t, err, "not a kiln module")
}

func TestMissingFunctionAndClose(t *testing.T) {
	mod, err := cpu.Load(buildSO(t, "kernels"))
	check.NoError(t, err)
	_, err = mod.GetFunction("nope")
	check.ErrorIs(t, err, packedfunc.ErrNotFound)
	f, err := mod.GetFunction("fail")
	check.NoError(t, err)
	check.NoError(t, mod.Close())
	check.NoError(t, mod.Close())
	_, err = f.Call(packedfunc.Int(1))
	check.ErrorIs(t, err, cpu.ErrClosed)
}
