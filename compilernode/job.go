package compilernode

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/frontend/onnx"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// RunJob builds the job in dir (JobFile and ModuleFile) into ArtifactFile.
// On failure it also writes the error's text to ErrorFile, which the node
// reports to the tracker as the job's message. It is what the job
// subprocess runs; it writes a line StagePrefix+NAME to stages as each
// phase of the build starts (the node reports them as the job's
// progress).
func RunJob(ctx context.Context, dir string, stages io.Writer) error {
	err := runJob(ctx, dir, stages)
	if err != nil {
		_ = os.WriteFile(filepath.Join(dir, ErrorFile), []byte(err.Error()), 0o644)
	}
	return err
}

// StagePrefix starts the lines of RunJob's stages.
const StagePrefix = "kiln build stage: "

func runJob(ctx context.Context, dir string, stages io.Writer) error {
	b, err := os.ReadFile(filepath.Join(dir, JobFile))
	if err != nil {
		return fmt.Errorf("read job: %w", err)
	}
	var job Job
	if err := json.Unmarshal(b, &job); err != nil {
		return fmt.Errorf("read job: %w", err)
	}
	if job.Format != "" && job.Format != "tvmscript" && job.Format != "onnx-base64" && !proto.StoredFormat(job.Format) {
		return fmt.Errorf("job %s: module format %q is not supported by this compiler node (tvmscript, onnx-base64, onnx-artifact or tvmscript-artifact)", job.ID, job.Format)
	}
	src, err := os.ReadFile(filepath.Join(dir, ModuleFile))
	if err != nil {
		return fmt.Errorf("read module: %w", err)
	}
	target, err := compiler.ParseTarget(job.Target)
	if err != nil {
		return err
	}
	name := job.Name
	if name == "" {
		name = "module.py"
	}
	opts := compiler.BuildOptions{CC: job.CC, Progress: func(st compiler.Stage) {
		if !st.Done {
			fmt.Fprintf(stages, "%s%s\n", StagePrefix, st.Name)
		}
	}}
	if v := job.Options["tuning-db"]; v != "" {
		// The module and its tuning records came as one bundle from
		// the artifact store.
		if v != TunedBundleOption || !proto.StoredFormat(job.Format) {
			return fmt.Errorf("job %s: build option tuning-db=%q: want %s, with an onnx-artifact or tvmscript-artifact module", job.ID, v, TunedBundleOption)
		}
		var db []byte
		if src, db, err = openTunedBundle(job.Format, src); err != nil {
			return fmt.Errorf("job %s: %w", job.ID, err)
		}
		if err = tunedSchedule(db, target, job.Options["shape"], &opts); err != nil {
			return fmt.Errorf("job %s: %w", job.ID, err)
		}
	}
	var mod *ir.IRModule
	if job.Format == "onnx-base64" || job.Format == "onnx-artifact" {
		// An ONNX model: imported here, its weights bundled. The node
		// fetched an onnx-artifact model from the store as raw bytes.
		b := src
		if job.Format == "onnx-base64" {
			if b, err = base64.StdEncoding.DecodeString(string(src)); err != nil {
				return fmt.Errorf("job %s: module is not base64: %w", job.ID, err)
			}
		}
		var shapes map[string][]int64
		if v := job.Options["input-shape"]; v != "" {
			if shapes, err = onnx.ParseInputShapes(strings.Split(v, ",")); err != nil {
				return fmt.Errorf("job %s: %w", job.ID, err)
			}
		}
		if mod, opts.Params, err = onnx.ImportBytes(name, b, onnx.Options{InputShapes: shapes}); err != nil {
			return err
		}
	} else if mod, err = script.Parse(name, string(src)); err != nil {
		return err
	}
	if v, ok := job.Options["cc"]; ok {
		// The node chooses its compiler: a client that could name the
		// program to run would run any program here.
		return fmt.Errorf("job %s: build option cc=%q refused: a compiler node uses its own C compiler", job.ID, v)
	}
	for k, v := range job.Options {
		switch k {
		case "cflags":
			opts.CFlags = strings.Fields(v)
			if err := compiler.CheckRemoteCFlags(opts.CFlags); err != nil {
				return fmt.Errorf("job %s: %w", job.ID, err)
			}
		case "pipeline":
			opts.Pipeline = v
		case "default-schedule":
			if v != "none" {
				return fmt.Errorf("job %s: build option default-schedule=%q: want none (or leave it out for the default schedules)", job.ID, v)
			}
			opts.NoDefaultSchedule = true
		case "input-shape":
			if job.Format != "onnx-base64" && job.Format != "onnx-artifact" {
				return fmt.Errorf("job %s: build option input-shape is for ONNX models", job.ID)
			}
		case "tuning-db":
			// Checked above.
		case "shape":
			if job.Options["tuning-db"] == "" {
				return fmt.Errorf("job %s: build option shape needs tuning-db", job.ID)
			}
		default:
			return fmt.Errorf("job %s: unknown build option %q (known: cflags, pipeline, default-schedule, input-shape, tuning-db, shape)", job.ID, k)
		}
	}
	a, err := compiler.Build(ctx, mod, target, opts)
	if err != nil {
		return err
	}
	if err := a.Save(filepath.Join(dir, ArtifactFile)); err != nil {
		return errors.Join(errors.New("save artifact"), err)
	}
	return nil
}
