package rpcserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// maxNameLen bounds a file name sent by a client.
const maxNameLen = 1024

// partSuffix marks an upload in progress; such files are hidden from list.
const partSuffix = ".kiln-part"

// sandbox is a session's directory as its client sees it. Every name is
// checked lexically (relative, no "..", no absolute path) and then resolved
// through an os.Root, so a symbolic link cannot lead out of it either.
type sandbox struct {
	dir   string
	root  *os.Root
	quota int64 // bytes; 0 means no limit
	// counted is the directory whose files the quota covers: the
	// session's directory, so that the worker's private copies of loaded
	// modules count too (dir itself when empty).
	counted string
	// worker is the pid of the session's worker process (0 until it
	// starts): where the session's directory is a tmpfs in the worker's
	// mount namespace, what is written there counts too.
	worker atomic.Int64

	mu   sync.Mutex // serializes quota checks of uploads
	used int64      // bytes reserved by uploads in progress
}

// openSandbox opens dir (which must exist) as a sandbox.
func openSandbox(dir string, quota int64) (*sandbox, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open session directory: %w", err)
	}
	return &sandbox{dir: dir, root: root, quota: quota}, nil
}

func (s *sandbox) Close() error { return s.root.Close() }

// checkName validates a client's file name and returns it in the host's
// form. Refusals wrap proto.ErrBadRequest.
func checkName(name string) (string, error) {
	switch {
	case name == "":
		return "", fmt.Errorf("file name is empty: %w", proto.ErrBadRequest)
	case len(name) > maxNameLen:
		return "", fmt.Errorf("file name of %d bytes exceeds %d: %w", len(name), maxNameLen, proto.ErrBadRequest)
	case strings.ContainsRune(name, 0) || strings.Contains(name, `\`):
		return "", fmt.Errorf("file name %q holds a NUL or a backslash: %w", name, proto.ErrBadRequest)
	case strings.HasPrefix(name, "/"):
		return "", fmt.Errorf("file name %q is absolute: names are relative to the session directory: %w", name, proto.ErrBadRequest)
	}
	clean := path.Clean(name)
	if clean == "." || !filepath.IsLocal(filepath.FromSlash(clean)) || strings.HasPrefix(clean, "../") || clean == ".." {
		return "", fmt.Errorf("file name %q leaves the session directory: %w", name, proto.ErrBadRequest)
	}
	if strings.HasSuffix(clean, partSuffix) {
		return "", fmt.Errorf("file name %q ends in the reserved suffix %q: %w", name, partSuffix, proto.ErrBadRequest)
	}
	return filepath.FromSlash(clean), nil
}

// rootErr maps an os.Root failure on name to a wire error: an escape (a
// symbolic link out) is a bad request, a missing file not found.
func rootErr(op, name string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s %q: no such file: %w", op, name, proto.ErrNotFound)
	case strings.Contains(err.Error(), "escapes from parent") || strings.Contains(err.Error(), "path escapes"):
		return fmt.Errorf("%s %q: the name leads out of the session directory: %w", op, name, proto.ErrBadRequest)
	}
	return fmt.Errorf("%s %q: %w", op, name, err)
}

// noLink refuses a name whose last element is a symbolic link: clients
// cannot make links, so one is foreign, and may point anywhere.
func (s *sandbox) noLink(op, host, name string) error {
	fi, err := s.root.Lstat(host)
	if err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("%s %q: the name is a symbolic link: %w", op, name, proto.ErrBadRequest)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return rootErr(op, name, err)
	}
	return nil
}

// usage sums the sizes of the files the quota covers.
func (s *sandbox) usage() int64 {
	if s.counted == "" {
		return dirBytes(s.dir)
	}
	// On the host: the uploads (and, uncapped, the module copies); in the
	// worker's tmpfs, when there is one, the copies and kernels' files.
	return dirBytes(s.counted) + sessionTmpfsUsed(int(s.worker.Load()), s.counted)
}

// dirBytes sums the sizes of the regular files under dir.
func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// Upload writes size bytes of r to name, atomically: a partial upload
// never replaces an existing file. With a claimed digest want (hex
// SHA-256), bytes of another digest are refused and nothing is kept; bytes
// that match are passed to keep (when not nil) before they take the name.
func (s *sandbox) Upload(ctx context.Context, name string, size int64, r io.Reader, want string, keep func(dir *os.File, base string)) error {
	host, err := checkName(name)
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	if err := s.noLink("upload", host, name); err != nil {
		return err
	}
	release, err := s.reserve(name, host, size)
	if err != nil {
		return err
	}
	defer release()
	if dir := filepath.Dir(host); dir != "." {
		if err := s.root.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("upload: %w", rootErr("make directory for", name, err))
		}
	}
	tmp := tmpName(host)
	f, err := s.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("upload: %w", rootErr("create", name, err))
	}
	var n int64
	if _, isConn := r.(net.Conn); isConn {
		// A socket of its own: let the kernel splice it into the file.
		n, err = f.ReadFrom(io.LimitReader(r, size))
	} else {
		buf := make([]byte, min(size, 1<<20)+1)
		n, err = io.CopyBuffer(writerOnly{f}, io.LimitReader(r, size), buf)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n != size {
		err = fmt.Errorf("got %d of %d bytes: %w", n, size, io.ErrUnexpectedEOF)
	}
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	if err == nil && want != "" {
		err = s.verify(tmp, want, keep)
	}
	if err == nil {
		err = s.replace(tmp, host)
		if err != nil {
			err = rootErr("rename upload to", name, err)
		}
	}
	if err != nil {
		s.root.Remove(tmp)
		return fmt.Errorf("upload %q: %w", name, err)
	}
	return nil
}

// reserve checks that size more bytes as name (host) fit the session's
// quota, a file replaced by them counting no more, and holds them until
// release.
func (s *sandbox) reserve(name, host string, size int64) (release func(), err error) {
	if s.quota <= 0 {
		return func() {}, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := int64(0)
	if fi, err := s.root.Lstat(host); err == nil && fi.Mode().IsRegular() {
		old = fi.Size()
	}
	if s.usage()+s.used-old+size > s.quota {
		return nil, fmt.Errorf("upload %q: %d bytes would exceed the session's disk quota of %d bytes (the daemon's --max-session-bytes); nothing was kept: %w", name, size, s.quota, proto.ErrQuota)
	}
	s.used += size
	return func() {
		s.mu.Lock()
		s.used -= size
		s.mu.Unlock()
	}, nil
}

// tmpName is a fresh name beside host for a file on its way there.
func tmpName(host string) string {
	var rnd [6]byte
	rand.Read(rnd[:])
	return host + "." + hex.EncodeToString(rnd[:]) + partSuffix
}

// verify checks that the finished upload tmp has the SHA-256 want, and
// hands it to keep when it has.
func (s *sandbox) verify(tmp, want string, keep func(dir *os.File, base string)) error {
	got, err := fileSum(s.root, tmp)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("the bytes' SHA-256 is %s, not the claimed %s; nothing was kept: %w", got, want, proto.ErrBadRequest)
	}
	if keep == nil {
		return nil
	}
	d, err := s.root.Open(filepath.Dir(tmp))
	if err != nil {
		return err
	}
	defer d.Close()
	keep(d, filepath.Base(tmp))
	return nil
}

// Open opens a regular file for reading.
func (s *sandbox) Open(name string) (*os.File, int64, error) {
	host, err := checkName(name)
	if err != nil {
		return nil, 0, err
	}
	if err := s.noLink("open", host, name); err != nil {
		return nil, 0, err
	}
	f, err := s.root.Open(host)
	if err != nil {
		return nil, 0, rootErr("open", name, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("open %q: %w", name, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("open %q: not a regular file: %w", name, proto.ErrBadRequest)
	}
	return f, fi.Size(), nil
}

// Stat describes one file.
func (s *sandbox) Stat(name string) (proto.FileInfo, error) {
	host, err := checkName(name)
	if err != nil {
		return proto.FileInfo{}, err
	}
	if err := s.noLink("stat", host, name); err != nil {
		return proto.FileInfo{}, err
	}
	fi, err := s.root.Stat(host)
	if err != nil {
		return proto.FileInfo{}, rootErr("stat", name, err)
	}
	return proto.FileInfo{Name: filepath.ToSlash(host), Size: fi.Size(), ModTime: fi.ModTime().UnixNano()}, nil
}

// Remove removes a file or an empty directory.
func (s *sandbox) Remove(name string) error {
	host, err := checkName(name)
	if err != nil {
		return err
	}
	if err := s.noLink("remove", host, name); err != nil {
		return err
	}
	if err := s.root.Remove(host); err != nil {
		return rootErr("remove", name, err)
	}
	return nil
}

// List lists the regular files, recursively, sorted by name.
func (s *sandbox) List() ([]proto.FileInfo, error) {
	out := []proto.FileInfo{}
	err := fs.WalkDir(s.root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() || strings.HasSuffix(p, partSuffix) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil // removed meanwhile
		}
		out = append(out, proto.FileInfo{Name: p, Size: info.Size(), ModTime: info.ModTime().UnixNano()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list session directory: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// writerOnly hides a file's ReadFrom, so that io.CopyBuffer writes in the
// large chunks of its buffer rather than 32 KiB ones.
type writerOnly struct{ w io.Writer }

func (w writerOnly) Write(p []byte) (int, error) { return w.w.Write(p) }
