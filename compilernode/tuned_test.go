package compilernode

import (
	"testing"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestTunedBundle unpacks what TunedBundle packs and refuses a bundle
// that is not one, or whose database is garbled, naming what was wrong.
func TestTunedBundle(t *testing.T) {
	for _, f := range []string{"onnx-artifact", "tvmscript-artifact"} {
		b, err := TunedBundle(f, []byte("module bytes"), []byte("{}\n"))
		check.NoError(t, err)
		module, db, err := openTunedBundle(f, b)
		check.NoError(t, err)
		check.Equal(t, string(module), "module bytes")
		check.Equal(t, string(db), "{}\n")
	}
	// A bundle is opened as the format its job names: an ONNX model's
	// bundle is not a TVMScript module's.
	b, err := TunedBundle("onnx-artifact", []byte("model bytes"), []byte("{}\n"))
	check.NoError(t, err)
	_, _, err = openTunedBundle("tvmscript-artifact", b)
	check.Error(t, err, `unexpected member "model.onnx"`, "module.py")
	_, err = TunedBundle("tvmscript", nil, nil)
	check.Error(t, err, `module format "tvmscript"`)

	_, _, err = openTunedBundle("onnx-artifact", []byte("not a zip"))
	check.Error(t, err, "tuned bundle")

	target, err := compiler.ParseTarget("cpu")
	check.NoError(t, err)
	err = tunedSchedule([]byte("not json\n"), target, "", &compiler.BuildOptions{})
	check.Error(t, err, "tuning database", "tuning.jsonl:1")
	err = tunedSchedule(nil, target, "n=x", &compiler.BuildOptions{})
	check.Error(t, err, "build option shape")
}
