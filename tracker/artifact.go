package tracker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// artifactRecord is an artifact index entry.
type artifactRecord struct {
	Size    int64     `msgpack:"size"`
	Created time.Time `msgpack:"created"`
}

func (s *Server) artifactPath(sha string) string {
	return filepath.Join(s.arts, sha[:2], sha)
}

// artifactSize returns the size of a stored artifact, or an error wrapping
// ErrNotFound.
func (s *Server) artifactSize(sha string) (int64, error) {
	var rec artifactRecord
	found := false
	err := s.st.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketArtifacts).Get([]byte(sha))
		if b == nil {
			return nil
		}
		found = true
		return msgpack.Unmarshal(b, &rec)
	})
	if err != nil {
		return 0, fmt.Errorf("artifact %s: read index: %w", sha, err)
	}
	if !found {
		return 0, fmt.Errorf("artifact %s: %w", sha, proto.ErrNotFound)
	}
	return rec.Size, nil
}

// handleArtifactUpload stores the uploaded bytes under their sha256,
// checking that the name is that hash.
func (s *Server) handleArtifactUpload(ctx context.Context, c *proto.Conn, in proto.Bulk) (proto.Bulk, error) {
	if c.Role() != proto.RoleCompiler && c.Role() != proto.RoleClient {
		return proto.Bulk{}, fmt.Errorf("upload artifact: role %s may not upload: %w", c.Role(), proto.ErrBadRequest)
	}
	if err := proto.ValidSHA256(in.Name); err != nil {
		return proto.Bulk{}, fmt.Errorf("upload artifact: %w", err)
	}
	if size, err := s.artifactSize(in.Name); err == nil && size == in.Size {
		return proto.Bulk{}, nil // already stored
	}
	tmp, err := os.CreateTemp(filepath.Join(s.arts, "tmp"), "upload-*")
	if err != nil {
		return proto.Bulk{}, fmt.Errorf("upload artifact %s: %w", in.Name, err)
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(in.Body, in.Size))
	if err == nil && n != in.Size {
		err = fmt.Errorf("got %d of %d bytes: %w", n, in.Size, io.ErrUnexpectedEOF)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return proto.Bulk{}, fmt.Errorf("upload artifact %s: %w", in.Name, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != in.Name {
		return proto.Bulk{}, fmt.Errorf("upload artifact %s: the bytes hash to %s: %w", in.Name, got, proto.ErrBadRequest)
	}
	dst := s.artifactPath(in.Name)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return proto.Bulk{}, fmt.Errorf("upload artifact %s: %w", in.Name, err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return proto.Bulk{}, fmt.Errorf("upload artifact %s: %w", in.Name, err)
	}
	rec := artifactRecord{Size: in.Size, Created: time.Now()}
	name := in.Name
	s.mu.Lock()
	durable := s.st.write(func(tx *bolt.Tx) error { return put(tx, bucketArtifacts, name, rec) })
	s.mu.Unlock()
	if err := <-durable; err != nil {
		return proto.Bulk{}, fmt.Errorf("upload artifact %s: index: %w", in.Name, err)
	}
	s.log.Info("artifact stored", "sha256", in.Name, "size", in.Size)
	return proto.Bulk{}, nil
}

func (s *Server) handleArtifactDownload(ctx context.Context, c *proto.Conn, in proto.Bulk) (proto.Bulk, error) {
	if err := proto.ValidSHA256(in.Name); err != nil {
		return proto.Bulk{}, fmt.Errorf("download artifact: %w", err)
	}
	size, err := s.artifactSize(in.Name)
	if err != nil {
		return proto.Bulk{}, fmt.Errorf("download artifact: %w", err)
	}
	f, err := os.Open(s.artifactPath(in.Name))
	if errors.Is(err, os.ErrNotExist) {
		return proto.Bulk{}, fmt.Errorf("download artifact %s: indexed but missing on disk: %w", in.Name, proto.ErrNotFound)
	}
	if err != nil {
		return proto.Bulk{}, fmt.Errorf("download artifact %s: %w", in.Name, err)
	}
	return proto.Bulk{Name: in.Name, Size: size, Body: f}, nil
}
