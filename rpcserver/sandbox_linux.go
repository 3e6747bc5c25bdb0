package rpcserver

import (
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// replace moves the finished upload tmp to host, atomically for readers:
// host names the old file or the new one, never nothing.
//
// Where host already is a regular file, the two names are exchanged
// (renameat2 with RENAME_EXCHANGE) and the old file, now under tmp, is
// unlinked. A plain rename over an existing file would do the same, but
// ext4 (auto_da_alloc) and btrfs take such a rename for an editor saving a
// file and start writing the new file to disk inside the rename: for a 64
// MiB upload that took as long as the upload itself. Session files live
// no longer than their session, so they need not reach the disk before the
// daemon answers; they are complete in the directory (the page cache)
// either way. Where the exchange is not supported, or host is missing or
// not a regular file, replace renames as before.
func (s *sandbox) replace(tmp, host string) error {
	fi, err := s.root.Lstat(host)
	if err != nil || !fi.Mode().IsRegular() {
		return s.root.Rename(tmp, host)
	}
	d, err := s.root.Open(filepath.Dir(host))
	if err != nil {
		return s.root.Rename(tmp, host)
	}
	defer d.Close()
	rc, err := d.SyscallConn()
	if err != nil {
		return s.root.Rename(tmp, host)
	}
	tb, hb := filepath.Base(tmp), filepath.Base(host)
	var xerr, uerr error
	if cerr := rc.Control(func(fd uintptr) {
		dfd := int(fd)
		if xerr = unix.Renameat2(dfd, tb, dfd, hb, unix.RENAME_EXCHANGE); xerr != nil {
			return
		}
		// Unlinkat without AT_REMOVEDIR refuses a directory: should host
		// have become one since the Lstat, swap it back and fail.
		if uerr = unix.Unlinkat(dfd, tb, 0); uerr != nil {
			unix.Renameat2(dfd, tb, dfd, hb, unix.RENAME_EXCHANGE)
		}
	}); cerr != nil {
		return s.root.Rename(tmp, host)
	}
	switch {
	case uerr != nil:
		return fmt.Errorf("replace the old file: %w", uerr)
	case errors.Is(xerr, unix.ENOENT):
		// host went away since the Lstat: nothing to exchange with.
		return s.root.Rename(tmp, host)
	case errors.Is(xerr, unix.EINVAL), errors.Is(xerr, unix.ENOSYS), errors.Is(xerr, unix.EOPNOTSUPP):
		// A file system without exchange.
		return s.root.Rename(tmp, host)
	case xerr != nil:
		return fmt.Errorf("exchange with the old file: %w", xerr)
	}
	return nil
}
