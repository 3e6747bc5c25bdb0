package cli

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/compiler/frontend/nn"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// TestMLPRemote is the IRModule tutorial's deployment: the MLP written with the NN
// builder and saved as TVMScript plus safetensors weights is built through
// the fleet's queue (default O2 pipeline) and run on the remote device with
// --params, and locally from an artifact with the weights bundled; both
// match a reference computed here.
func TestMLPRemote(t *testing.T) {
	dir := t.TempDir()
	src, pfile, xfile, checkOut := mlpFiles(t, dir)

	fl, tok := testFleet(t, dir, "tok")
	addr := fl.tracker.Addr()

	art := filepath.Join(dir, "mlp.kiln")
	_, _, err := runApp(t, "build", src, "--tracker", addr, "--token-file", tok, "-o", art)
	check.NoError(t, err)
	out := filepath.Join(dir, "remote")
	_, _, err = runApp(t, "run", art, "--tracker", addr, "--key", "cpu", "--token-file", tok,
		"--input", "x="+xfile, "--params", pfile, "--output", out)
	check.NoError(t, err)
	checkOut(filepath.Join(out, "output.npy"))

	// Weights bundled into the artifact; run here with the naive allocator.
	bundled := filepath.Join(dir, "mlp-bundled.kiln")
	_, _, err = runApp(t, "build", src, "--params", pfile, "-o", bundled)
	check.NoError(t, err)
	local := filepath.Join(dir, "local")
	_, _, err = runApp(t, "run", bundled, "--input", "x="+xfile, "--memory-cfg", "naive", "--output", local)
	check.NoError(t, err)
	checkOut(filepath.Join(local, "output.npy"))

	// A missing weight and a wrong input shape are named.
	_, _, err = runApp(t, "run", art, "--input", "x="+xfile)
	check.Error(t, err, `parameter "fc1_weight" not given`)
	bad, err := ndarray.FromSlice(make([]float32, 780), ndarray.Shape{1, 780})
	check.NoError(t, err)
	badFile := filepath.Join(dir, "bad.npy")
	check.NoError(t, ndarray.SaveNPY(badFile, bad))
	_, _, err = runApp(t, "run", bundled, "--input", "x="+badFile)
	check.Error(t, err, `"x"`, "(1, 780)")
}

// mlpFiles writes the IRModule tutorial's MLP (784-256-10, as TVMScript),
// its weights (safetensors) and an input x (npy) into dir, and returns
// them with a check of an output file against a reference computed here.
func mlpFiles(t *testing.T, dir string) (src, pfile, xfile string, checkOut func(path string)) {
	t.Helper()
	mod, params, err := nn.Export(nn.NewNamedSequential(
		nn.Named("fc1", nn.NewLinear(784, 256, true)),
		nn.Named("relu1", nn.NewReLU()),
		nn.Named("fc2", nn.NewLinear(256, 10, true)),
	), nn.Spec{Inputs: []nn.Input{{Name: "x", Shape: []int64{1, 784}, DType: ir.Float32}}, Seed: 3})
	check.NoError(t, err)
	src = filepath.Join(dir, "mlp.py")
	check.NoError(t, os.WriteFile(src, []byte(script.Print(mod)), 0o644))
	pfile = filepath.Join(dir, "params.safetensors")
	check.NoError(t, params.Save(pfile))
	xs := make([]float32, 784)
	for i := range xs {
		xs[i] = float32(math.Sin(float64(i)))
	}
	x, err := ndarray.FromSlice(xs, ndarray.Shape{1, 784})
	check.NoError(t, err)
	xfile = filepath.Join(dir, "x.npy")
	check.NoError(t, ndarray.SaveNPY(xfile, x))
	nds, err := params.NDArrays(devices.CPUDevice)
	check.NoError(t, err)
	host := map[string][]float32{}
	for name, a := range nds {
		host[name], err = ndarray.ToSlice[float32](a)
		check.NoError(t, err)
	}
	want := mlpRef(xs, host)
	checkOut = func(path string) {
		t.Helper()
		o, err := ndarray.LoadNPY(path)
		check.NoError(t, err)
		got, err := ndarray.ToSlice[float32](o)
		check.NoError(t, err)
		check.Equal(t, len(got), 10)
		for i := range want {
			if math.Abs(float64(got[i])-want[i]) > 1e-4*math.Max(1, math.Abs(want[i])) {
				t.Fatalf("%s: output %d = %g, want %g", path, i, got[i], want[i])
			}
		}
	}
	return src, pfile, xfile, checkOut
}

func mlpRef(x []float32, p map[string][]float32) []float64 {
	h := make([]float64, 256)
	for j := range 256 {
		s := float64(p["fc1.bias"][j])
		for k := range 784 {
			s += float64(x[k]) * float64(p["fc1.weight"][j*784+k])
		}
		h[j] = math.Max(s, 0)
	}
	out := make([]float64, 10)
	for j := range 10 {
		s := float64(p["fc2.bias"][j])
		for k := range 256 {
			s += h[k] * float64(p["fc2.weight"][j*256+k])
		}
		out[j] = s
	}
	return out
}
