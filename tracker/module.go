package tracker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker/store"
)

// A single tracker keeps a queued or running build job's module text in
// the module store (Server.modules: "modules" beside the artifacts'
// blobs), under a random key its job record names, not in its memory or
// tracker.db: a queue full of large modules costs the tracker their keys
// and tracker.db their records only. A replica keeps it in etcd's modules
// table (every replica reaches etcd; its artifact directory may be its
// own), out of its memory too. The text is read back when a compiler node
// takes the job, and removed once the job is final.

// moduleIO bounds one module store operation.
const moduleIO = time.Minute

// putModule writes the size bytes r yields to the module store as they
// come, hashing them, and returns their key and sha256. The spool file is
// removed whatever happens: nothing of a module that failed to arrive is
// left behind.
func (s *Server) putModule(ctx context.Context, r io.Reader, size int64) (key, sum string, err error) {
	key = randomID("", 32)
	tmp, err := os.CreateTemp(s.modules.spoolDir(), "module-*")
	if err != nil {
		return "", "", fmt.Errorf("module store: %w", s.hidePaths(err))
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name()) // gone already once put renamed it
	}()
	h := sha256.New()
	buf := make([]byte, moduleCopyBuf)
	n, err := io.CopyBuffer(io.MultiWriter(tmp, h), io.LimitReader(r, size), buf)
	if err == nil && n != size {
		err = fmt.Errorf("got %d of %d bytes: %w", n, size, io.ErrUnexpectedEOF)
	}
	if err != nil {
		return "", "", fmt.Errorf("receive module: %w", s.hidePaths(err))
	}
	if err = tmp.Sync(); err == nil {
		ctx, cancel := context.WithTimeout(ctx, moduleIO)
		err = s.modules.put(ctx, key, tmp, size)
		cancel()
	}
	if err != nil {
		return "", "", fmt.Errorf("module store: %w", s.hidePaths(err))
	}
	return key, hex.EncodeToString(h.Sum(nil)), nil
}

// moduleCopyBuf is the buffer a module is received or sent through: a
// module never is in the tracker's memory whole.
const moduleCopyBuf = 256 << 10

// jobModule returns job id's module text: from the module store under
// key, or from the state store's modules table when key is "".
func (s *Server) jobModule(ctx context.Context, id, key string, size int64) (string, error) {
	if key != "" {
		return s.readModule(ctx, key, size)
	}
	b, ok, err := s.st.Get(store.Modules, id)
	if err == nil && !ok {
		err = fmt.Errorf("no module stored for job %s", id)
	}
	if err != nil {
		return "", fmt.Errorf("tracker store: %w", err)
	}
	var text string
	return text, store.Decode(b, &text)
}

// readModule returns the text stored under key.
func (s *Server) readModule(ctx context.Context, key string, size int64) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, moduleIO)
	defer cancel()
	r, err := s.modules.open(ctx, key)
	if err != nil {
		return "", fmt.Errorf("module store: %w", s.hidePaths(err))
	}
	defer r.Close()
	var b strings.Builder
	b.Grow(int(size))
	if _, err := io.Copy(&b, io.LimitReader(r, size+1)); err != nil {
		return "", fmt.Errorf("module store: %w", s.hidePaths(err))
	}
	if int64(b.Len()) != size {
		return "", fmt.Errorf("module store: module %s holds %d bytes, its job says %d", key[:8], b.Len(), size)
	}
	return b.String(), nil
}

// removeModule removes the text stored under key, logging a failure (an
// orphaned blob costs space, not correctness).
func (s *Server) removeModule(key string) {
	ctx, cancel := context.WithTimeout(context.Background(), moduleIO)
	defer cancel()
	if err := s.modules.remove(ctx, key); err != nil {
		s.log.Warn("remove a finished job's module", "err", err)
	}
}

// removeModuleAfter removes the text stored under key once durable (the
// write of its final job's record, without the key) reports success; the
// returned channel receives the same result.
func (s *Server) removeModuleAfter(key string, durable <-chan error) <-chan error {
	out := make(chan error, 1)
	go func() {
		err := <-durable
		out <- err
		if err == nil {
			s.removeModule(key)
		}
	}()
	return out
}

// handleBuildModule sends a running job's module (in.Name is the job's id)
// to the compiler node running it, streamed from the module store.
func (s *Server) handleBuildModule(ctx context.Context, c *proto.Conn, in proto.Bulk) (proto.Bulk, error) {
	what := fmt.Sprintf("read build job %q's module", in.Name)
	if c.Role() != proto.RoleCompiler {
		return proto.Bulk{}, fmt.Errorf("%s: only the compiler node running it may: %w", what, proto.ErrBadRequest)
	}
	s.mu.Lock()
	j, err := s.jobLocked(in.Name)
	if err == nil {
		if n := s.nodes[j.Node]; j.State != proto.JobRunning || n == nil || n.conn != c {
			err = fmt.Errorf("it is %s, not running on the compiler node registered on this connection: %w", j.State, proto.ErrNotFound)
		}
	}
	var key string
	var size int64
	var stored bool
	if err == nil {
		key, size, stored = j.moduleKey, j.moduleSize, j.moduleStored
		if key == "" && !stored {
			err = fmt.Errorf("its module is inline (format %q): %w", j.Format, proto.ErrNotFound)
		}
	}
	s.mu.Unlock()
	if err != nil {
		return proto.Bulk{}, fmt.Errorf("%s: %w", what, err)
	}
	if stored {
		text, err := s.jobModule(ctx, in.Name, "", size)
		if err != nil {
			return proto.Bulk{}, fmt.Errorf("%s: %w", what, err)
		}
		return proto.Bulk{Name: in.Name, Size: int64(len(text)), Body: strings.NewReader(text)}, nil
	}
	r, err := s.modules.open(ctx, key) // the stream's deadline bounds it
	if err != nil {
		return proto.Bulk{}, fmt.Errorf("%s: module store: %w", what, s.hidePaths(err))
	}
	return proto.Bulk{Name: in.Name, Size: size, Body: r}, nil
}
