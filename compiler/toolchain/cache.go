package toolchain

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
)

// Cache is a content-addressed store of build outputs on disk. Entries are
// written atomically, so a crash never leaves a half-written one.
type Cache struct {
	Dir string
}

// DefaultCache is the per-user build cache ($KILN_CACHE, else the user
// cache directory's kiln/build).
func DefaultCache() (*Cache, error) {
	if d := os.Getenv("KILN_CACHE"); d != "" {
		return &Cache{Dir: d}, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return nil, fmt.Errorf("build cache: %w", err)
	}
	return &Cache{Dir: filepath.Join(d, "kiln", "build")}, nil
}

// Key hashes the parts that decide a build's output into a cache key.
func Key(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s;", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (c *Cache) path(key string) string {
	return filepath.Join(c.Dir, key[:2], key)
}

// Get returns a cached entry, or ok=false.
func (c *Cache) Get(key string) (data []byte, ok bool) {
	b, err := os.ReadFile(c.path(key))
	if err != nil {
		return nil, false
	}
	return b, true
}

// Put stores an entry.
func (c *Cache) Put(key string, data []byte) error {
	p := c.path(key)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("build cache: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return fmt.Errorf("build cache: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("build cache: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("build cache: %w", err)
	}
	if err := os.Rename(f.Name(), p); err != nil {
		return fmt.Errorf("build cache: %w", err)
	}
	return nil
}
