package rpcserver

import (
	"container/list"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// uploadCache keeps uploaded files by content for the life of the daemon,
// so that a file a later session wants again (a model's weights) is linked
// into its directory instead of sent again (proto.FileLinkCached).
//
// The files are hard links into a directory of the daemon's own, beside
// the session directories on the same file system and never bound into a
// sandbox: a session sees only the links in its own directory. Evicting a
// file removes the cache's name for it, never a session's: a live session
// keeps its link, and the bytes go when its directory does. The bound
// counts the files the cache names.
//
// Files are kept per lease user, so that one tenant's file is never
// another's, and made read-only. A cached file whose size or modification
// time changed since it was kept is dropped, never linked.
type uploadCache struct {
	dir string
	max int64

	mu      sync.Mutex
	used    int64
	entries map[cacheKey]*list.Element // of *cacheEntry
	lru     *list.List                 // front: the most recently used
}

// cacheKey names a kept file: its lease user and its SHA-256 (hex).
type cacheKey struct{ user, sum string }

type cacheEntry struct {
	key   cacheKey
	path  string
	size  int64
	mtime time.Time
}

// newUploadCache makes an empty cache of max bytes in a new directory of
// parent; nil when max is not positive.
func newUploadCache(parent string, max int64) (*uploadCache, error) {
	if max <= 0 {
		return nil, nil
	}
	dir, err := os.MkdirTemp(parent, "upload-cache-")
	if err != nil {
		return nil, fmt.Errorf("upload cache: %w", err)
	}
	return &uploadCache{dir: dir, max: max, entries: map[cacheKey]*list.Element{}, lru: list.New()}, nil
}

// close removes the cache's files (the sessions' links stay).
func (c *uploadCache) close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries, c.used = map[cacheKey]*list.Element{}, 0
	c.lru.Init()
	return os.RemoveAll(c.dir)
}

// checkSum validates a client's hex SHA-256.
func checkSum(sum string) error {
	b, err := hex.DecodeString(sum)
	if err != nil || len(b) != sha256.Size {
		return fmt.Errorf("sha256 %q is not 64 hex digits: %w", sum, proto.ErrBadRequest)
	}
	return nil
}

// lookup returns the path of the file kept under k, of size bytes, and
// marks it used; "" when there is none.
func (c *uploadCache) lookup(k cacheKey, size int64) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[k]
	if !ok {
		return ""
	}
	e := el.Value.(*cacheEntry)
	fi, err := os.Lstat(e.path)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != e.size || !fi.ModTime().Equal(e.mtime) {
		c.drop(el)
		return ""
	}
	if e.size != size {
		return ""
	}
	c.lru.MoveToFront(el)
	return e.path
}

// keep links the file base of the directory dir (a finished upload whose
// digest is k.sum) into the cache, evicting the least recently used files
// beyond the bound. A file larger than the bound is not kept; failing to
// keep one is not the upload's failure, so keep only logs why.
func (c *uploadCache) keep(k cacheKey, dir *os.File, base string, size int64) error {
	if size > c.max {
		return nil
	}
	c.mu.Lock()
	if el, ok := c.entries[k]; ok {
		c.lru.MoveToFront(el)
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	var rnd [12]byte
	rand.Read(rnd[:])
	path := filepath.Join(c.dir, hex.EncodeToString(rnd[:]))
	rc, err := dir.SyscallConn()
	if err != nil {
		return err
	}
	var lerr error
	if err := rc.Control(func(fd uintptr) {
		lerr = unix.Linkat(int(fd), base, unix.AT_FDCWD, path, 0)
	}); err != nil {
		return err
	}
	if lerr != nil {
		return fmt.Errorf("link into the upload cache: %w", lerr)
	}
	if err := os.Chmod(path, 0o444); err != nil {
		os.Remove(path)
		return err
	}
	fi, err := os.Lstat(path)
	if err != nil {
		os.Remove(path)
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[k]; ok {
		os.Remove(path) // kept meanwhile by another session
		return nil
	}
	c.entries[k] = c.lru.PushFront(&cacheEntry{key: k, path: path, size: size, mtime: fi.ModTime()})
	c.used += size
	for c.used > c.max {
		c.drop(c.lru.Back())
	}
	return nil
}

// drop forgets el and removes the cache's name for its file (c.mu held).
func (c *uploadCache) drop(el *list.Element) {
	e := c.lru.Remove(el).(*cacheEntry)
	delete(c.entries, e.key)
	c.used -= e.size
	os.Remove(e.path)
}

// fileSum is the hex SHA-256 of the file base of dir.
func fileSum(root *os.Root, name string) (string, error) {
	f, err := root.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// userName is the lease user the session opened under.
func (s *session) userName() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.user
}

// linkCached answers proto.FileLinkCached for s.
func (d *Daemon) linkCached(s *session, a proto.LinkCachedArgs) (proto.LinkCached, error) {
	box, err := s.liveBox()
	if err != nil {
		return proto.LinkCached{}, err
	}
	if err := checkSum(a.SHA256); err != nil {
		return proto.LinkCached{}, fmt.Errorf("link cached %q: %w", a.Name, err)
	}
	if d.cache == nil {
		return proto.LinkCached{}, nil
	}
	path := d.cache.lookup(cacheKey{user: s.userName(), sum: a.SHA256}, a.Size)
	if path == "" {
		return proto.LinkCached{}, nil
	}
	err = box.link(a.Name, a.Size, path)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.EXDEV) {
		return proto.LinkCached{}, nil // evicted meanwhile, or not linkable here
	}
	if err != nil {
		return proto.LinkCached{}, err
	}
	d.m.cacheLinked.Add(float64(a.Size))
	return proto.LinkCached{Linked: true}, nil
}

// link places the daemon's file path, of size bytes, as name, counted
// against the session's quota as an upload of it would be.
func (s *sandbox) link(name string, size int64, path string) error {
	host, err := checkName(name)
	if err != nil {
		return fmt.Errorf("link cached: %w", err)
	}
	if err := s.noLink("link cached", host, name); err != nil {
		return err
	}
	release, err := s.reserve(name, host, size)
	if err != nil {
		return err
	}
	defer release()
	if dir := filepath.Dir(host); dir != "." {
		if err := s.root.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("link cached: %w", rootErr("make directory for", name, err))
		}
	}
	d, err := s.root.Open(filepath.Dir(host))
	if err != nil {
		return fmt.Errorf("link cached: %w", rootErr("open directory of", name, err))
	}
	defer d.Close()
	tmp := tmpName(host)
	rc, err := d.SyscallConn()
	if err != nil {
		return err
	}
	var lerr error
	if err := rc.Control(func(fd uintptr) {
		lerr = unix.Linkat(unix.AT_FDCWD, path, int(fd), filepath.Base(tmp), 0)
	}); err != nil {
		return err
	}
	if lerr != nil {
		return fmt.Errorf("link cached %q: %w", name, lerr)
	}
	if err := s.replace(tmp, host); err != nil {
		s.root.Remove(tmp)
		return fmt.Errorf("link cached: %w", rootErr("rename link to", name, err))
	}
	return nil
}
