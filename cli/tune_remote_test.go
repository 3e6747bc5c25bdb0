package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/compiler/tune"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// TestTunedModelRemoteBuild builds the small CNN with a tuning database
// from a short kiln tune here and through an in-process tracker and
// compiler node: the node applies the same records, so the two artifacts
// have the same kernels and compute the same outputs, bit for bit. A
// garbled database is refused before anything is queued.
func TestTunedModelRemoteBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("tunes a model")
	}
	model := filepath.Join(onnxTestdata, "smallcnn.onnx")
	x := filepath.Join(onnxTestdata, "smallcnn_x.npy")
	checkTunedRemoteBuild(t, model, []string{"--input-shape", "x=2x3x16x16"}, []string{"x=" + x}, "output.npy")
}

// TestTunedGraphModuleRemoteBuild does the same for a TVMScript module
// with an @R.function (a small MLP), whose kernels the graph pipeline
// makes on the compiler node: module and records travel as one bundle.
func TestTunedGraphModuleRemoteBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("tunes a module")
	}
	dir := t.TempDir()
	var inputs []string
	for i, in := range []struct {
		name  string
		shape ndarray.Shape
	}{{"inp_0", ndarray.Shape{1, 16}}, {"fc1_bias", ndarray.Shape{8}}, {"fc1_weight", ndarray.Shape{8, 16}}, {"fc2_bias", ndarray.Shape{4}}, {"fc2_weight", ndarray.Shape{4, 8}}} {
		n := int(in.shape.NumElements())
		v := make([]float32, n)
		for j := range v {
			v[j] = float32((j*7+i*3)%11-5) / 8
		}
		a, err := ndarray.FromSlice(v, in.shape)
		check.NoError(t, err)
		p := filepath.Join(dir, in.name+".npy")
		check.NoError(t, ndarray.SaveNPY(p, a))
		inputs = append(inputs, in.name+"="+p)
	}
	checkTunedRemoteBuild(t, "../compiler/relax/transform/testdata/mlp_small.py", nil, inputs, "output.npy")
}

// checkTunedRemoteBuild tunes file briefly (flags: its import options),
// builds it with the database here and through an in-process fleet, and
// checks that the two artifacts have the same kernels and give output
// (one of the files kiln run writes) bit for bit from inputs.
func checkTunedRemoteBuild(t *testing.T, file string, flags, inputs []string, output string) {
	t.Helper()
	dir := t.TempDir()
	db := filepath.Join(dir, "tuning.jsonl")
	_, errOut, err := runApp(t, append(append([]string{"tune", file}, flags...), "--trials", "24", "--batch", "4", "--db", db, "--seed", "1")...)
	check.NoError(t, err, errOut)
	favourSearched(t, db)

	local := filepath.Join(dir, "local.kiln")
	_, errOut, err = runApp(t, append(append([]string{"build", file}, flags...), "--tuning-db", db, "-o", local, "--no-cache")...)
	check.NoError(t, err, errOut)
	check.True(t, strings.Contains(errOut, "tuned, the best record"), errOut)

	fl, tok := testFleet(t, dir, "tok")
	addr := fl.tracker.Addr()
	remote := filepath.Join(dir, "remote.kiln")
	remoteBuild := func(db string) error {
		_, errOut, err := runApp(t, append(append([]string{"build", file}, flags...), "--tuning-db", db,
			"--tracker", addr, "--token-file", tok, "-o", remote)...)
		if err != nil {
			return fmt.Errorf("%w\n%s", err, errOut)
		}
		return nil
	}
	check.NoError(t, remoteBuild(db))

	read := func(p string) *artifact.Artifact {
		t.Helper()
		b, err := os.ReadFile(p)
		check.NoError(t, err)
		a, err := artifact.Read(bytes.NewReader(b), int64(len(b)))
		check.NoError(t, err)
		return a
	}
	la, ra := read(local), read(remote)
	check.Equal(t, len(ra.Manifest.Functions), len(la.Manifest.Functions))
	for i := range la.Manifest.Functions {
		check.Equal(t, ra.Manifest.Functions[i].Name, la.Manifest.Functions[i].Name)
	}
	// Kernel for kernel: the same C compiled the same way.
	check.Equal(t, ra.Manifest.Entries, la.Manifest.Entries)

	outs := map[string][]float32{}
	for name, art := range map[string]string{"local": local, "remote": remote} {
		o := filepath.Join(dir, "out-"+name)
		args := []string{"run", art}
		for _, in := range inputs {
			args = append(args, "--input", in)
		}
		_, errOut, err := runApp(t, append(args, "--output", o)...)
		check.NoError(t, err, errOut)
		arr, err := ndarray.LoadNPY(filepath.Join(o, output))
		check.NoError(t, err)
		outs[name], err = ndarray.ToSlice[float32](arr)
		check.NoError(t, err)
	}
	check.Equal(t, outs["remote"], outs["local"])

	bad := filepath.Join(dir, "bad.jsonl")
	check.NoError(t, os.WriteFile(bad, []byte("not json\n"), 0o644))
	check.Error(t, remoteBuild(bad), "--tuning-db", "bad.jsonl:1")
}

// favourSearched rewrites the tuning database at path so that the
// search's valid candidates beat the default schedule: a short tune on a
// busy machine may find nothing faster, and the test needs kernels whose
// schedule only the records give.
func favourSearched(t *testing.T, path string) {
	t.Helper()
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(readFile(t, path)), "\n") {
		var r map[string]any
		check.NoError(t, json.Unmarshal([]byte(line), &r))
		delete(r, "pair")
		if r["schedule"] != tune.DefaultSchedule && r["error"] == nil && r["times"] != nil {
			r["times"] = []float64{1e-12}
		}
		b, err := json.Marshal(r)
		check.NoError(t, err)
		out = append(out, string(b))
	}
	check.NoError(t, os.WriteFile(path, []byte(strings.Join(out, "\n")+"\n"), 0o644))
}
