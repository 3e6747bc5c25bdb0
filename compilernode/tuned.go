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
// the stored module of an artifact-format job (proto.StoredFormat) is a
// tuned bundle (see TunedBundle). A node that does not know the option
// or the format refuses the job, so a tuned build is never built untuned.
const TunedBundleOption = "bundled"

// The members of a tuned bundle: the module (an ONNX model for an
// onnx-artifact job, TVMScript text for a tvmscript-artifact one) and
// the database.
const (
	bundleModel  = "model.onnx"
	bundleScript = "module.py"
	bundleTuning = "tuning.jsonl"
)

// bundleMember is the name of a tuned bundle's module for job format f.
func bundleMember(f string) (string, error) {
	switch f {
	case "onnx-artifact":
		return bundleModel, nil
	case "tvmscript-artifact":
		return bundleScript, nil
	}
	return "", fmt.Errorf("tuned bundle: module format %q has none (want onnx-artifact or tvmscript-artifact)", f)
}

// maxBundleMember bounds a member of a tuned bundle as it is unpacked.
const maxBundleMember = 4 << 30

// TunedBundle packs a module and a tuning database (JSON lines, as kiln
// tune writes it) into one zip archive, uploaded to the tracker's
// artifact store as the module of a job of format (onnx-artifact for an
// ONNX model, tvmscript-artifact for TVMScript text) with the build
// option tuning-db=bundled. The node applies the database's best records
// to the kernels the module's import and graph pipeline make, as a local
// kiln build --tuning-db does.
func TunedBundle(format string, module, db []byte) ([]byte, error) {
	member, err := bundleMember(format)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, m := range []struct {
		name string
		b    []byte
	}{{member, module}, {bundleTuning, db}} {
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

// openTunedBundle is TunedBundle undone for a job of format: the module
// and the database.
func openTunedBundle(format string, b []byte) (module, db []byte, err error) {
	member, err := bundleMember(format)
	if err != nil {
		return nil, nil, err
	}
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return nil, nil, fmt.Errorf("tuned bundle: %w", err)
	}
	got := map[string][]byte{}
	for _, f := range zr.File {
		if f.Name != member && f.Name != bundleTuning {
			return nil, nil, fmt.Errorf("tuned bundle: unexpected member %q (want %s and %s)", f.Name, member, bundleTuning)
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
	for _, n := range []string{member, bundleTuning} {
		if _, ok := got[n]; !ok {
			return nil, nil, fmt.Errorf("tuned bundle: no member %q", n)
		}
	}
	return got[member], got[bundleTuning], nil
}

// tunedSchedule sets opts' build hooks that apply db's best records for
// target, with the symbolic sizes shape ("NAME=SIZE,…", "" for none)
// picks: each convolution's kernel layout, each dense layer's weight
// layout and each kernel's schedule, what kiln build --tuning-db gives a
// local build.
func tunedSchedule(db []byte, target compiler.Target, shape string, opts *compiler.BuildOptions) error {
	d := tune.NewDatabase(target.String())
	if _, err := d.Read(bundleTuning, bytes.NewReader(db)); err != nil {
		return fmt.Errorf("tuning database: %w", err)
	}
	var sh []string
	if shape != "" {
		sh = strings.Split(shape, ",")
	}
	bind, err := tune.ParseShape(sh)
	if err != nil {
		return fmt.Errorf("build option shape: %w", err)
	}
	rt, err := target.TuneTarget()
	if err != nil {
		return err
	}
	opts.Layouts = tune.LayoutChooser(d, rt, bind, nil)
	opts.Schedule = func(mod *ir.IRModule) (*ir.IRModule, error) {
		out, _, err := tune.Apply(mod, d, rt, bind)
		return out, err
	}
	return nil
}
