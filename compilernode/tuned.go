package compilernode

import (
	"archive/zip"
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/tune"
)

// TunedBundleOption is the value of the build option tuning-db that says
// an onnx-artifact job's model is a tuned bundle (see TunedBundle). A
// node that does not know the option refuses the job, so a tuned build
// is never built untuned.
const TunedBundleOption = "bundled"

// The members of a tuned bundle.
const (
	bundleModel  = "model.onnx"
	bundleTuning = "tuning.jsonl"
)

// maxBundleMember bounds a member of a tuned bundle as it is unpacked.
const maxBundleMember = 4 << 30

// TunedBundle packs an ONNX model and a tuning database (JSON lines, as
// kiln tune writes it) into one zip archive, uploaded to the tracker's
// artifact store as the model of an onnx-artifact job with the build
// option tuning-db=bundled. The node applies the database's best records
// to the kernels of the model, as a local kiln build --tuning-db does.
func TunedBundle(model, db []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, m := range []struct {
		name string
		b    []byte
	}{{bundleModel, model}, {bundleTuning, db}} {
		w, err := zw.Create(m.name)
		if err != nil {
			return nil, fmt.Errorf("tuned bundle: %w", err)
		}
		if _, err := w.Write(m.b); err != nil {
			return nil, fmt.Errorf("tuned bundle: %w", err)
		}
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("tuned bundle: %w", err)
	}
	return buf.Bytes(), nil
}

// openTunedBundle is TunedBundle undone: the model and the database.
func openTunedBundle(b []byte) (model, db []byte, err error) {
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return nil, nil, fmt.Errorf("tuned bundle: %w", err)
	}
	got := map[string][]byte{}
	for _, f := range zr.File {
		if f.Name != bundleModel && f.Name != bundleTuning {
			return nil, nil, fmt.Errorf("tuned bundle: unexpected member %q (want %s and %s)", f.Name, bundleModel, bundleTuning)
		}
		if _, dup := got[f.Name]; dup {
			return nil, nil, fmt.Errorf("tuned bundle: member %q twice", f.Name)
		}
		r, err := f.Open()
		if err != nil {
			return nil, nil, fmt.Errorf("tuned bundle: %s: %w", f.Name, err)
		}
		data, err := io.ReadAll(io.LimitReader(r, maxBundleMember+1))
		r.Close()
		if err != nil {
			return nil, nil, fmt.Errorf("tuned bundle: %s: %w", f.Name, err)
		}
		if len(data) > maxBundleMember {
			return nil, nil, fmt.Errorf("tuned bundle: %s is over %d bytes", f.Name, maxBundleMember)
		}
		got[f.Name] = data
	}
	for _, n := range []string{bundleModel, bundleTuning} {
		if _, ok := got[n]; !ok {
			return nil, nil, fmt.Errorf("tuned bundle: no member %q", n)
		}
	}
	return got[bundleModel], got[bundleTuning], nil
}

// tunedSchedule is the build hook that applies db's best records for
// target, with the symbolic sizes shape ("NAME=SIZE,…", "" for none)
// picks: what kiln build --tuning-db gives a local build.
func tunedSchedule(db []byte, target compiler.Target, shape string) (func(*ir.IRModule) (*ir.IRModule, error), error) {
	d := tune.NewDatabase(target.String())
	if _, err := d.Read(bundleTuning, bytes.NewReader(db)); err != nil {
		return nil, fmt.Errorf("tuning database: %w", err)
	}
	var sh []string
	if shape != "" {
		sh = strings.Split(shape, ",")
	}
	bind, err := tune.ParseShape(sh)
	if err != nil {
		return nil, fmt.Errorf("build option shape: %w", err)
	}
	rt, err := target.TuneTarget()
	if err != nil {
		return nil, err
	}
	return func(mod *ir.IRModule) (*ir.IRModule, error) {
		out, _, err := tune.Apply(mod, d, rt, bind)
		return out, err
	}, nil
}
