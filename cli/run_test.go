package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// kernelArtifact compiles the CPU loader's hand-written test kernels into
// a .kiln artifact whose manifest lists their signatures.
func kernelArtifact(t *testing.T) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler (cc) on PATH")
	}
	dir := t.TempDir()
	check.NoError(t, os.WriteFile(filepath.Join(dir, abi.HeaderName), []byte(abi.Header), 0o644))
	so := filepath.Join(dir, "k.so")
	out, err := exec.Command(cc, "-O2", "-shared", "-fPIC", "-I", dir, "-o", so, "../devices/cpu/testdata/kernels.c").CombinedOutput()
	check.NoError(t, err, string(out))
	lib, err := os.ReadFile(so)
	check.NoError(t, err)
	a := artifact.New("c", "test")
	check.NoError(t, a.Add(artifact.HostLib, lib))
	n := abi.Dim{Name: "n"}
	a.Manifest.Functions = []abi.FuncInfo{
		{Name: "vadd", Params: []abi.ParamInfo{
			{Name: "A", Kind: abi.ParamTensor, DType: "float32", Shape: []abi.Dim{n}},
			{Name: "B", Kind: abi.ParamTensor, DType: "float32", Shape: []abi.Dim{n}},
			{Name: "C", Kind: abi.ParamTensor, DType: "float32", Shape: []abi.Dim{n}},
		}},
		{Name: "fill_index", Params: []abi.ParamInfo{
			{Name: "X", Kind: abi.ParamTensor, DType: "int32", Shape: []abi.Dim{{Value: 4}}},
			{Name: "offset", Kind: abi.ParamInt},
		}},
		// Marked as the compiler marks it: X is updated in place.
		{Name: "scale", Params: []abi.ParamInfo{
			{Name: "X", Kind: abi.ParamTensor, DType: "float64", Shape: []abi.Dim{{Name: "m"}, {Value: 4}}, Output: true},
			{Name: "alpha", Kind: abi.ParamFloat},
		}},
	}
	p := filepath.Join(dir, "k.kiln")
	check.NoError(t, a.Save(p))
	return p
}

func TestRunLocal(t *testing.T) {
	art := kernelArtifact(t)
	dir := t.TempDir()
	a, err := ndarray.FromSlice([]float32{1, 2, 3}, ndarray.Shape{3})
	check.NoError(t, err)
	b, err := ndarray.FromSlice([]float32{10, 20, 30}, ndarray.Shape{3})
	check.NoError(t, err)
	check.NoError(t, ndarray.SaveNPY(filepath.Join(dir, "a.npy"), a))
	check.NoError(t, ndarray.SaveNPY(filepath.Join(dir, "b.npy"), b))
	outDir := filepath.Join(dir, "out")

	stdout, _, err := runApp(t, "run", art, "--func", "vadd", "--input", "A="+filepath.Join(dir, "a.npy"), "--input", "B="+filepath.Join(dir, "b.npy"), "--output", outDir)
	check.NoError(t, err)
	check.True(t, len(stdout) > 0)
	c, err := ndarray.LoadNPY(filepath.Join(outDir, "C.npy"))
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](c)
	check.NoError(t, err)
	check.Equal(t, got, []float32{11, 22, 33})

	_, _, err = runApp(t, "run", art, "--func", "fill_index", "--arg", "offset=5", "--output", outDir)
	check.NoError(t, err)
	x, err := ndarray.LoadNPY(filepath.Join(outDir, "X.npy"))
	check.NoError(t, err)
	xs, err := ndarray.ToSlice[int32](x)
	check.NoError(t, err)
	check.Equal(t, xs, []int32{5, 6, 7, 8})
}

func TestRunErrors(t *testing.T) {
	art := kernelArtifact(t)
	dir := t.TempDir()
	a, err := ndarray.FromSlice([]float32{1, 2, 3}, ndarray.Shape{3})
	check.NoError(t, err)
	b, err := ndarray.FromSlice([]float32{1, 2}, ndarray.Shape{2})
	check.NoError(t, err)
	i, err := ndarray.FromSlice([]int32{1, 2, 3}, ndarray.Shape{3})
	check.NoError(t, err)
	for name, arr := range map[string]*ndarray.NDArray{"a": a, "b": b, "i": i} {
		check.NoError(t, ndarray.SaveNPY(filepath.Join(dir, name+".npy"), arr))
	}
	npy := func(n string) string { return filepath.Join(dir, n+".npy") }
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no func", []string{"run", art}, "name the function with --func (the artifact has vadd, fill_index, scale)"},
		{"unknown func", []string{"run", art, "--func", "nope"}, `no function "nope"`},
		{"shape", []string{"run", art, "--func", "vadd", "--input", "A=" + npy("a"), "--input", "B=" + npy("b")}, `parameter "B": dimension 0 is 2, but n is 3 from parameter A`},
		{"dtype", []string{"run", art, "--func", "vadd", "--input", "A=" + npy("i"), "--input", "B=" + npy("a")}, "input A: dtype int32, vadd wants float32"},
		{"missing file", []string{"run", art, "--func", "vadd", "--input", "A=" + npy("zz")}, "input A:"},
		{"missing input", []string{"run", art, "--func", "vadd", "--input", "A=" + npy("a")}, `vadd: tensor parameter "B" is not given and the function only reads it: pass --input B=FILE.npy (or --allow-missing to pass zeros)`},
		{"unknown input", []string{"run", art, "--func", "vadd", "--input", "Z=" + npy("a")}, "--input Z: vadd has no parameter of that name (parameters: A, B, C)"},
		{"missing inputs", []string{"run", art, "--func", "vadd"}, `tensor parameters "A", "B" are not given`},
		{"bad input flag", []string{"run", art, "--func", "vadd", "--input", "A"}, "want NAME=FILE.npy"},
		{"missing scalar", []string{"run", art, "--func", "fill_index"}, "parameter offset (int) not given"},
		{"bad scalar", []string{"run", art, "--func", "fill_index", "--arg", "offset=x"}, `"x" is not an integer`},
		{"no artifact", []string{"run", filepath.Join(dir, "none.kiln")}, "run:"},
		{"device of another kind", []string{"run", art, "--func", "fill_index", "--arg", "offset=1", "--device", "cuda"}, `--device cuda: the artifact is built for "`},
		{"other cpu", []string{"run", art, "--func", "fill_index", "--arg", "offset=1", "--device", "cpu:1"}, "--device cpu:1: kiln runs cpu artifacts on cpu:0"},
		{"unknown device", []string{"run", art, "--func", "fill_index", "--arg", "offset=1", "--device", "tpu"}, "--device: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := runApp(t, tc.args...)
			check.Error(t, err, tc.want)
		})
	}
}

// TestRunMissingInputs: the tensors a function only reads are inputs, so
// one left out is refused (TestRunErrors) or, with --allow-missing, passed
// as zeros and not written out; an output given as an input starts from
// the file's values and is written out.
func TestRunMissingInputs(t *testing.T) {
	art := kernelArtifact(t)
	dir := t.TempDir()
	a, err := ndarray.FromSlice([]float32{1, 2, 3}, ndarray.Shape{3})
	check.NoError(t, err)
	x, err := ndarray.FromSlice([]float64{1, 2, 3, 4, 5, 6, 7, 8}, ndarray.Shape{2, 4})
	check.NoError(t, err)
	check.NoError(t, ndarray.SaveNPY(filepath.Join(dir, "a.npy"), a))
	check.NoError(t, ndarray.SaveNPY(filepath.Join(dir, "x.npy"), x))

	out := filepath.Join(dir, "zeros")
	stdout, _, err := runApp(t, "run", art, "--func", "vadd", "--input", "A="+filepath.Join(dir, "a.npy"), "--allow-missing", "--output", out)
	check.NoError(t, err)
	c, err := ndarray.LoadNPY(filepath.Join(out, "C.npy"))
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](c)
	check.NoError(t, err)
	check.Equal(t, got, []float32{1, 2, 3})
	_, err = os.Stat(filepath.Join(out, "B.npy"))
	check.True(t, os.IsNotExist(err), "the zero-filled input B was written out:", err)
	check.True(t, !strings.Contains(stdout, "B.npy"), stdout)

	out = filepath.Join(dir, "inplace")
	_, _, err = runApp(t, "run", art, "--func", "scale", "--input", "X="+filepath.Join(dir, "x.npy"), "--arg", "alpha=2", "--output", out)
	check.NoError(t, err)
	y, err := ndarray.LoadNPY(filepath.Join(out, "X.npy"))
	check.NoError(t, err)
	ys, err := ndarray.ToSlice[float64](y)
	check.NoError(t, err)
	check.Equal(t, ys, []float64{2, 4, 6, 8, 10, 12, 14, 16})
}

// TestRunPrintsResult: kiln run prints the scalar a PrimFunc returns, and
// no "no outputs" line for it.
func TestRunPrintsResult(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "addone.py")
	check.NoError(t, os.WriteFile(src, []byte(`from tvm.script import tir as T

@T.prim_func
def addone(x: T.int64) -> T.int64:
    return x + T.int64(1)
`), 0o644))
	art := filepath.Join(dir, "addone.kiln")
	_, errOut, err := runApp(t, "build", src, "-o", art)
	check.NoError(t, err, errOut)
	out, errOut, err := runApp(t, "run", art, "--func", "addone", "--arg", "x=41")
	check.NoError(t, err, errOut)
	check.Equal(t, out, "addone returned 42 (int64)\n")
}
