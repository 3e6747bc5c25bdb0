package main

/*
#include <stdlib.h>
#include "support.h"
*/
import "C"

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"time"
	"unsafe"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/compiler"
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
		if err := buildRemote(ctx, t, src, n, tgt, o, func(line string) { say(progress, user, line) }); err != nil {
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
	say(progress, user, fmt.Sprintf("building %s for %s", n, target2))
	res, err := compiler.BuildWithResult(ctx, mod, target2, compiler.BuildOptions{})
	if err != nil {
		return fail(fmt.Errorf("build %s: %w", n, err), errBuild)
	}
	if err := res.Artifact.Save(o); err != nil {
		return fail(fmt.Errorf("build %s: %w", n, err), errBuild)
	}
	how := "from the build cache"
	if !res.Cached {
		how = fmt.Sprintf("lowered in %s, compiled in %s", res.Lower.Round(time.Millisecond), res.Compile.Round(time.Millisecond))
	}
	say(progress, user, fmt.Sprintf("built %s: %d function(s) for %s, %s", o, len(res.Artifact.Manifest.Functions), target2, how))
	return outString(out, o)
}

// buildRemote queues the module at the tracker, reports the job's progress
// and downloads the artifact to out, as kiln build --tracker does.
func buildRemote(ctx context.Context, t *tracker, src, name, target, out string, say func(string)) error {
	job, err := t.t.SubmitBuild(ctx, proto.BuildSubmitArgs{
		Name: filepath.Base(name), Module: src, Target: target, RunTimeout: remoteBuildTimeout,
	})
	if err != nil {
		return fmt.Errorf("build %s: %w", name, err)
	}
	say(fmt.Sprintf("build job %s queued", job.ID))
	job, err = t.t.WaitBuild(ctx, job.ID, func(j proto.BuildJob) {
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
		if ctx.Err() != nil {
			cctx, cancel := context.WithTimeout(context.Background(), freeTimeout)
			t.t.CancelBuild(cctx, job.ID)
			cancel()
		}
		return fmt.Errorf("build %s: %w", name, err)
	}
	var buf bytes.Buffer
	if _, err := t.t.DownloadArtifact(ctx, job.Artifact, &buf); err != nil {
		return fmt.Errorf("build %s: download artifact: %w", name, err)
	}
	sum := sha256.Sum256(buf.Bytes())
	if hex.EncodeToString(sum[:]) != job.Artifact {
		return fmt.Errorf("build %s: downloaded artifact does not match its sha256 %s", name, job.Artifact)
	}
	if _, err := artifact.Read(bytes.NewReader(buf.Bytes()), int64(buf.Len())); err != nil {
		return fmt.Errorf("build %s: downloaded artifact: %w", name, err)
	}
	if err := writeFileAtomic(out, buf.Bytes()); err != nil {
		return fmt.Errorf("build %s: %w", name, err)
	}
	say(fmt.Sprintf("built %s on %s (%d bytes)", out, job.Node, buf.Len()))
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
