package cli

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

const onnxTestdata = "../compiler/frontend/onnx/testdata"

// TestONNXModel builds the small CNN test model (Conv, BatchNormalization,
// MaxPool, a depthwise Conv, Clip, GlobalAveragePool, PyTorch's flatten
// subgraph and Gemm) from its .onnx file, here and through the fleet, runs
// both artifacts, here and on the remote device, and compares with the
// output numpy computed when the model was written.
func TestONNXModel(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(onnxTestdata, "smallcnn.onnx")
	x := filepath.Join(onnxTestdata, "smallcnn_x.npy")
	wantArr, err := ndarray.LoadNPY(filepath.Join(onnxTestdata, "smallcnn_y.npy"))
	check.NoError(t, err)
	want, err := ndarray.ToSlice[float32](wantArr)
	check.NoError(t, err)
	checkOut := func(path string) {
		t.Helper()
		o, err := ndarray.LoadNPY(path)
		check.NoError(t, err)
		check.Equal(t, o.Shape(), ndarray.Shape{2, 5})
		got, err := ndarray.ToSlice[float32](o)
		check.NoError(t, err)
		for i := range want {
			if math.Abs(float64(got[i]-want[i])) > 1e-4*math.Max(1, math.Abs(float64(want[i]))) {
				t.Fatalf("%s: output %d = %g, want %g", path, i, got[i], want[i])
			}
		}
	}

	// The batch is symbolic: refused without --input-shape, naming it.
	_, _, err = runApp(t, "build", model, "-o", filepath.Join(dir, "x.kiln"))
	check.Error(t, err, `input "x": dim 0 is symbolic ("N")`, "--input-shape")
	_, _, err = runApp(t, "build", model, "--input-shape", "x=2x3xfoo")
	check.Error(t, err, `dim "foo" is not a size`)

	out, _, err := runApp(t, "print", model, "--input-shape", "x=2x3x16x16")
	check.NoError(t, err)
	for _, want := range []string{"def main(x: R.Tensor((2, 3, 16, 16)", "R.nn.conv2d", "R.reshape(mean, R.shape([2, 8]))"} {
		check.True(t, strings.Contains(out, want), "print output lacks", want, "\n", out)
	}

	art := filepath.Join(dir, "smallcnn.kiln")
	_, _, err = runApp(t, "build", model, "--input-shape", "x=2x3x16x16", "-o", art)
	check.NoError(t, err)
	local := filepath.Join(dir, "local")
	_, _, err = runApp(t, "run", art, "--input", "x="+x, "--output", local)
	check.NoError(t, err)
	checkOut(filepath.Join(local, "output.npy"))

	// A wrong input shape is named.
	_, _, err = runApp(t, "run", art, "--input", "x="+filepath.Join(onnxTestdata, "smallcnn_y.npy"))
	check.Error(t, err, `"x"`, "(2, 5)")
	// So is an input the model does not have, with the ones it has.
	_, _, err = runApp(t, "run", art, "--input", "x="+x, "--input", "y="+x)
	check.Error(t, err, `--input y: main has no input "y" (its inputs: "x")`)

	// Through the fleet: the model travels to a compiler node, which
	// imports and builds it; the artifact runs on the remote device.
	fl, tok := testFleet(t, dir, "tok")
	addr := fl.tracker.Addr()
	remoteArt := filepath.Join(dir, "remote.kiln")
	_, _, err = runApp(t, "build", model, "--input-shape", "x=2x3x16x16", "--tracker", addr, "--token-file", tok, "-o", remoteArt)
	check.NoError(t, err)
	remote := filepath.Join(dir, "remote")
	_, _, err = runApp(t, "run", remoteArt, "--tracker", addr, "--key", "cpu", "--token-file", tok,
		"--input", "x="+x, "--output", remote)
	check.NoError(t, err)
	checkOut(filepath.Join(remote, "output.npy"))

	// Not a model: refused before anything is queued.
	bad := filepath.Join(dir, "bad.onnx")
	check.NoError(t, os.WriteFile(bad, []byte("not a model"), 0o644))
	_, _, err = runApp(t, "build", bad, "--tracker", addr, "--token-file", tok)
	check.Error(t, err, "not an ONNX model")
}
