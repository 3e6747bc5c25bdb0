package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// ErrArtifactMismatch is wrapped by FetchArtifact's error when the bytes
// downloaded do not hash to the sha256 they were asked for.
var ErrArtifactMismatch = errors.New("artifact does not match its sha256")

// cancelTimeout bounds the cancellation of a job nobody waits for.
const cancelTimeout = 5 * time.Second

// Build queues a build job at the tracker, waits for it and returns the
// job and its artifact, checked (see FetchArtifact): kiln build
// --tracker, the C API's and Python's remote builds and kiln tune's fleet
// all build through it. onSubmit (when set) sees the job once queued,
// onChange each change of it (see WaitBuild). When ctx ends before the
// job does, the job is cancelled at the tracker, so that compiler nodes
// do not build what nobody will download. A job that ended failed or
// cancelled is returned with an error wrapping ErrBuildFailed.
func (t *Tracker) Build(ctx context.Context, args proto.BuildSubmitArgs, onSubmit, onChange func(proto.BuildJob)) (proto.BuildJob, []byte, error) {
	job, err := t.SubmitBuild(ctx, args)
	if err != nil {
		return job, nil, err
	}
	if onSubmit != nil {
		onSubmit(job)
	}
	return t.AwaitBuild(ctx, job.ID, onChange)
}

// AwaitBuild is Build for a job already queued (id): it waits for the
// job, cancels it when ctx ends first, and fetches its artifact.
func (t *Tracker) AwaitBuild(ctx context.Context, id string, onChange func(proto.BuildJob)) (proto.BuildJob, []byte, error) {
	job, err := t.WaitBuild(ctx, id, onChange)
	if err != nil {
		if ctx.Err() != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelTimeout)
			_, cerr := t.CancelBuild(cctx, id)
			cancel()
			if cerr != nil {
				err = fmt.Errorf("%w (and cancelling build job %s failed: %v)", err, id, cerr)
			}
		}
		return job, nil, err
	}
	art, err := t.FetchArtifact(ctx, job.Artifact, job.ArtifactSize)
	if err != nil {
		return job, nil, fmt.Errorf("build job %s: %w", id, err)
	}
	return job, art, nil
}

// FetchArtifact downloads the artifact stored under sha (its sha256,
// lowercase hex; size its length in bytes, 0 when not known) and checks
// it: its bytes must hash to sha and read as a kiln artifact. Every
// artifact the tracker hands back for running goes through here.
func (t *Tracker) FetchArtifact(ctx context.Context, sha string, size int64) ([]byte, error) {
	var buf bytes.Buffer
	if size > 0 {
		buf.Grow(int(size))
	}
	if _, err := t.DownloadArtifact(ctx, sha, &buf); err != nil {
		return nil, fmt.Errorf("download artifact %s: %w", short(sha), err)
	}
	sum := sha256.Sum256(buf.Bytes())
	if got := hex.EncodeToString(sum[:]); got != sha {
		return nil, fmt.Errorf("downloaded artifact does not match its sha256 %s (got %s, %d bytes): %w", sha, got, buf.Len(), ErrArtifactMismatch)
	}
	if _, err := artifact.Read(bytes.NewReader(buf.Bytes()), int64(buf.Len())); err != nil {
		return nil, fmt.Errorf("downloaded artifact %s: %w", short(sha), err)
	}
	return buf.Bytes(), nil
}

func short(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}
