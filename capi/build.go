package main

/*
#include <stdlib.h>
#include "support.h"
*/
import "C"

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/frontend/onnx"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// remoteBuildTimeout bounds a build job on a compiler node.
const remoteBuildTimeout = 10 * time.Minute

//export kiln_build
func kiln_build(source, name, target *C.char, trackerH C.KilnHandle, output *C.char, progress C.KilnProgressFn, user unsafe.Pointer, cancel C.KilnHandle, out **C.char) C.int {
	ctx, err := contextOf(cancel)
	if err != nil {
		return fail(err, errArgument)
	}
	if out == nil {
		return fail(badArg("no place for the artifact's path (NULL)"), errArgument)
	}
	src, n, tgt, o := gostr(source), gostr(name), gostr(target), gostr(output)
	if n == "" {
		n = "module.py"
	}
	if tgt == "" {
		tgt = "cpu"
	}
	if o == "" {
		return fail(badArg("build %s: no output path given", n), errArgument)
	}
	if trackerH != 0 {
		t, err := lookup[*tracker](trackerH, "tracker")
		if err != nil {
			return fail(err, errArgument)
		}
		args := proto.BuildSubmitArgs{Name: filepath.Base(n), Module: src, Target: tgt, RunTimeout: remoteBuildTimeout}
		if err := buildRemote(ctx, t, args, o, func(line string) { say(progress, user, line) }); err != nil {
			return fail(err, errBuild)
		}
		return outString(out, o)
	}
	target2, err := compiler.ParseTarget(tgt)
	if err != nil {
		return fail(badArg("build %s: %v", n, err), errArgument)
	}
	mod, err := script.Parse(n, src)
	if err != nil {
		return fail(fmt.Errorf("build %s: %w", n, err), errBuild)
	}
	return buildLocal(ctx, mod, n, target2, compiler.BuildOptions{}, o, func(line string) { say(progress, user, line) }, out)
}

// sayLine passes a progress line to the caller's callback.
func sayLine(fn C.KilnProgressFn, user unsafe.Pointer, line string) { say(fn, user, line) }

// buildLocal compiles mod here and saves the artifact to o.
func buildLocal(ctx context.Context, mod *ir.IRModule, name string, target compiler.Target, opts compiler.BuildOptions, o string, say func(string), out **C.char) C.int {
	say(fmt.Sprintf("building %s for %s", name, target))
	res, err := compiler.BuildWithResult(ctx, mod, target, opts)
	if err != nil {
		return fail(fmt.Errorf("build %s: %w", name, err), errBuild)
	}
	if err := res.Artifact.Save(o); err != nil {
		return fail(fmt.Errorf("build %s: %w", name, err), errBuild)
	}
	how := "from the build cache"
	if !res.Cached {
		how = fmt.Sprintf("lowered in %s, compiled in %s", res.Lower.Round(time.Millisecond), res.Compile.Round(time.Millisecond))
	}
	say(fmt.Sprintf("built %s: %d function(s) for %s, %s", o, len(res.Artifact.Manifest.Functions), target, how))
	return outString(out, o)
}

//export kiln_build_file
func kiln_build_file(path, target *C.char, trackerH C.KilnHandle, output, inputShapes *C.char, progress C.KilnProgressFn, user unsafe.Pointer, cancel C.KilnHandle, out **C.char) C.int {
	ctx, err := contextOf(cancel)
	if err != nil {
		return fail(err, errArgument)
	}
	if out == nil {
		return fail(badArg("no place for the artifact's path (NULL)"), errArgument)
	}
	p, tgt, o := gostr(path), gostr(target), gostr(output)
	if tgt == "" {
		tgt = "cpu"
	}
	if o == "" {
		o = strings.TrimSuffix(p, filepath.Ext(p)) + ".kiln"
	}
	src, err := os.ReadFile(p)
	if err != nil {
		return fail(badArg("build: %v", err), errArgument)
	}
	var specs []string
	for _, line := range strings.Split(gostr(inputShapes), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			specs = append(specs, line)
		}
	}
	shapes, err := onnx.ParseInputShapes(specs)
	if err != nil {
		return fail(badArg("build %s: %v", p, err), errArgument)
	}
	if !onnx.IsModelPath(p) {
		if len(shapes) > 0 {
			return fail(badArg("build %s: input shapes are for ONNX models (FILE.onnx)", p), errArgument)
		}
		cs := C.CString(string(src))
		defer C.free(unsafe.Pointer(cs))
		cn := C.CString(p)
		defer C.free(unsafe.Pointer(cn))
		co := C.CString(o)
		defer C.free(unsafe.Pointer(co))
		return kiln_build(cs, cn, target, trackerH, co, progress, user, cancel, out)
	}
	say := func(line string) { sayLine(progress, user, line) }
	if trackerH != 0 {
		t, err := lookup[*tracker](trackerH, "tracker")
		if err != nil {
			return fail(err, errArgument)
		}
		// Import here first, so a model kiln cannot import is refused
		// before it is queued; the compiler node imports the same bytes.
		if _, _, err := onnx.ImportBytes(p, src, onnx.Options{InputShapes: shapes}); err != nil {
			return fail(fmt.Errorf("build %s: %w", p, err), errBuild)
		}
		args := proto.BuildSubmitArgs{
			Name: filepath.Base(p), Format: "onnx-base64", Module: base64.StdEncoding.EncodeToString(src),
			Target: tgt, RunTimeout: remoteBuildTimeout,
		}
		if len(shapes) > 0 {
			args.Options = map[string]string{"input-shape": strings.Join(onnx.FormatInputShapes(shapes), ",")}
		}
		if err := buildRemote(ctx, t, args, o, say); err != nil {
			return fail(err, errBuild)
		}
		return outString(out, o)
	}
	target2, err := compiler.ParseTarget(tgt)
	if err != nil {
		return fail(badArg("build %s: %v", p, err), errArgument)
	}
	mod, weights, err := onnx.ImportBytes(p, src, onnx.Options{InputShapes: shapes})
	if err != nil {
		return fail(fmt.Errorf("build %s: %w", p, err), errBuild)
	}
	return buildLocal(ctx, mod, p, target2, compiler.BuildOptions{Params: weights}, o, say, out)
}

// buildRemote builds the module on the fleet (client.Tracker.Build, as
// kiln build --tracker does: the job is cancelled when ctx ends, the
// artifact checked against its sha256), reporting the job's progress, and
// writes the artifact to out.
func buildRemote(ctx context.Context, t *tracker, args proto.BuildSubmitArgs, out string, say func(string)) error {
	name := args.Name
	job, art, err := t.client().Build(ctx, args, func(j proto.BuildJob) {
		say(fmt.Sprintf("build job %s queued", j.ID))
	}, func(j proto.BuildJob) {
		line := fmt.Sprintf("build job %s: %s", j.ID, j.State)
		if j.Node != "" {
			line += " on " + j.Node
		}
		if j.Progress > 0 {
			line += fmt.Sprintf(" %3.0f%%", 100*j.Progress)
		}
		if j.Message != "" {
			line += ": " + j.Message
		}
		say(line)
	})
	if err != nil {
		return fmt.Errorf("build %s: %w", name, err)
	}
	if err := writeFileAtomic(out, art); err != nil {
		return fmt.Errorf("build %s: %w", name, err)
	}
	say(fmt.Sprintf("built %s on %s (%d bytes)", out, job.Node, len(art)))
	return nil
}

// writeFileAtomic writes through a temporary file and a rename, so a crash
// never leaves half a file under the name.
func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}
