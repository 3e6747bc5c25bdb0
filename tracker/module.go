package tracker

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

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

// putModule writes text to the module store and returns its key.
func (s *Server) putModule(ctx context.Context, text string) (string, error) {
	key := randomID("", 32)
	tmp, err := os.CreateTemp(s.modules.spoolDir(), "module-*")
	if err != nil {
		return "", fmt.Errorf("module store: %w", s.hidePaths(err))
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name()) // gone already once put renamed it
	}()
	_, err = io.Copy(tmp, strings.NewReader(text))
	if err == nil {
		err = tmp.Sync()
	}
	if err == nil {
		ctx, cancel := context.WithTimeout(ctx, moduleIO)
		err = s.modules.put(ctx, key, tmp, int64(len(text)))
		cancel()
	}
	if err != nil {
		return "", fmt.Errorf("module store: %w", s.hidePaths(err))
	}
	return key, nil
}

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
