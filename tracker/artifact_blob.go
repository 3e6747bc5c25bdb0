package tracker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// blobStore keeps the artifacts' bytes, each under its sha256 (content
// addressed, so a blob never changes once stored). The tracker's store
// keeps the index (sizes, last use); a blobStore only keeps bytes. Two
// implementations: dirStore (a directory, the default) and s3Store (an
// S3-compatible bucket).
type blobStore interface {
	// spoolDir is where an upload is written and its hash checked before
	// put; dirStore's is on its own file system so put is a rename.
	spoolDir() string
	// put stores the spooled file f (size bytes, hashing to sha) under
	// sha. f is the caller's to close and remove afterwards.
	put(ctx context.Context, sha string, f *os.File, size int64) error
	// open returns sha's bytes; an error wrapping os.ErrNotExist when the
	// store has none.
	open(ctx context.Context, sha string) (io.ReadCloser, error)
	// remove deletes sha's bytes; a blob already gone is no error.
	remove(ctx context.Context, sha string) error
	// String names the store for logs (never credentials).
	String() string
	// sub returns a store of its own beside this one's blobs (a
	// subdirectory, a key prefix), for another kind of blob.
	sub(name string) (blobStore, error)
}

// openBlobStore opens the store spec names: "" for DATA/artifacts, a
// directory, or s3://BUCKET[/PREFIX]?endpoint=URL (see openS3Store).
func openBlobStore(ctx context.Context, spec, dataDir string) (blobStore, error) {
	switch {
	case spec == "":
		return openDirStore(filepath.Join(dataDir, "artifacts"))
	case strings.HasPrefix(spec, "s3://"):
		u, err := url.Parse(spec)
		if err != nil {
			return nil, fmt.Errorf("artifact store %q: %w", spec, err)
		}
		return openS3Store(ctx, u, filepath.Join(dataDir, "artifacts-spool"))
	case strings.Contains(spec, "://"):
		return nil, fmt.Errorf("artifact store %q: unknown scheme; want a directory or s3://BUCKET?endpoint=URL", spec)
	}
	return openDirStore(spec)
}

// dirStore keeps blobs as files DIR/ab/abcd… (the first two hex digits
// name a subdirectory), spooled in DIR/tmp. Several trackers may share DIR
// (a ReadWriteMany volume): blobs are written once, by rename.
type dirStore struct{ dir string }

func openDirStore(dir string) (*dirStore, error) {
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		return nil, fmt.Errorf("artifact store: %w", err)
	}
	return &dirStore{dir: dir}, nil
}

func (d *dirStore) path(sha string) string { return filepath.Join(d.dir, sha[:2], sha) }
func (d *dirStore) spoolDir() string       { return filepath.Join(d.dir, "tmp") }
func (d *dirStore) String() string         { return d.dir }

func (d *dirStore) sub(name string) (blobStore, error) {
	return openDirStore(filepath.Join(d.dir, name))
}

func (d *dirStore) put(_ context.Context, sha string, f *os.File, _ int64) error {
	dst := d.path(sha)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.Rename(f.Name(), dst)
}

func (d *dirStore) open(_ context.Context, sha string) (io.ReadCloser, error) {
	return os.Open(d.path(sha))
}

func (d *dirStore) remove(_ context.Context, sha string) error {
	if err := os.Remove(d.path(sha)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
