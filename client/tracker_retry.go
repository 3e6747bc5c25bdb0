package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// retryOn runs fn on the connection get returns (get waits or dials for
// up to the failover time since its argument), and again on the next while
// fn fails with a retryable error, until timeout has passed since the
// first try; lost is told of each connection fn failed on.
func retryOn(ctx context.Context, timeout time.Duration, get func(since time.Time) (*proto.Client, error),
	lost func(*proto.Client, error), fn func(c *proto.Client, try int) error) error {
	since := time.Now()
	for try := 0; ; try++ {
		c, err := get(since)
		if err != nil {
			return err
		}
		err = fn(c, try)
		if err == nil || !retryable(err) || ctx.Err() != nil || time.Since(since) > timeout {
			return unwrapFinal(err)
		}
		lost(c, err)
	}
}

// finalError is a failure that must not be retried on another connection
// although it wraps ErrUnavailable (a transfer that cannot start over).
type finalError struct{ error }

func (e finalError) Unwrap() error { return e.error }

// unwrapFinal returns err without its finalError mark.
func unwrapFinal(err error) error {
	var f finalError
	if errors.As(err, &f) {
		return f.error
	}
	return err
}

// randomKey returns a random idempotency key.
func randomKey() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// uploadArtifact sends size bytes of r under sha on c. A retry (try > 0)
// rewinds r first, or gives up with a finalError when r cannot rewind.
func uploadArtifact(ctx context.Context, c *proto.Client, sha string, size int64, r io.Reader, try int) error {
	if try > 0 {
		s, ok := r.(io.Seeker)
		if !ok {
			return finalError{fmt.Errorf("upload artifact %s: the tracker connection failed and the body cannot be read again: %w", sha, proto.ErrUnavailable)}
		}
		if _, err := s.Seek(0, io.SeekStart); err != nil {
			return finalError{fmt.Errorf("upload artifact %s: rewind for a retry: %w", sha, err)}
		}
	}
	if err := c.Upload(ctx, proto.BulkArtifactUpload, sha, size, r); err != nil {
		return fmt.Errorf("upload artifact %s: %w", sha, err)
	}
	return nil
}

// rewindable is a writer a download can start over in (an *os.File).
type rewindable interface {
	io.Seeker
	Truncate(size int64) error
}

// resettable is an in-memory writer a download can start over in (a
// *bytes.Buffer).
type resettable interface{ Reset() }

// downloadArtifact copies the artifact sha from c to w; written is what an
// earlier try wrote to w, which is discarded first (or the retry given up
// with a finalError when w cannot start over).
func downloadArtifact(ctx context.Context, c *proto.Client, sha string, w io.Writer, written int64) (int64, error) {
	return downloadBulk(ctx, c, proto.BulkArtifactDownload, "artifact "+sha, sha, w, written)
}

// downloadBulk copies what c's bulk method sends for name to w (what names
// the bytes in errors), starting w over first as downloadArtifact does.
func downloadBulk(ctx context.Context, c *proto.Client, method, what, name string, w io.Writer, written int64) (int64, error) {
	if written > 0 {
		switch rw := w.(type) {
		case resettable:
			rw.Reset()
		case rewindable:
			if _, err := rw.Seek(0, io.SeekStart); err != nil {
				return written, finalError{fmt.Errorf("download %s: rewind for a retry: %w", what, err)}
			}
			if err := rw.Truncate(0); err != nil {
				return written, finalError{fmt.Errorf("download %s: truncate for a retry: %w", what, err)}
			}
		default:
			return written, finalError{fmt.Errorf("download %s: the tracker connection failed after %d bytes and the destination cannot start over: %w", what, written, proto.ErrUnavailable)}
		}
	}
	n, err := c.Download(ctx, method, name, w)
	if err != nil {
		return n, fmt.Errorf("download %s: %w", what, err)
	}
	return n, nil
}

// downloadVia copies the artifact sha to w through do (a Tracker's or a
// Registrar's), starting over on the next connection where
// downloadArtifact allows.
func downloadVia(ctx context.Context, do func(context.Context, func(*proto.Client, int) error) error, sha string, w io.Writer) (int64, error) {
	var n int64
	err := do(ctx, func(c *proto.Client, _ int) error {
		var err error
		n, err = downloadArtifact(ctx, c, sha, w, n)
		return err
	})
	return n, err
}
