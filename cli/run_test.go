package cli

import (
	"os"
	"os/exec"
	"path/filepath"
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
		{"no func", []string{"run", art}, "name the function with --func (the artifact has vadd, fill_index)"},
		{"unknown func", []string{"run", art, "--func", "nope"}, `no function "nope"`},
		{"shape", []string{"run", art, "--func", "vadd", "--input", "A=" + npy("a"), "--input", "B=" + npy("b")}, `parameter "B": dimension 0 is 2, but n is 3 from parameter A`},
		{"dtype", []string{"run", art, "--func", "vadd", "--input", "A=" + npy("i"), "--input", "B=" + npy("a")}, "input A: dtype int32, vadd wants float32"},
		{"missing file", []string{"run", art, "--func", "vadd", "--input", "A=" + npy("zz")}, "input A:"},
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
