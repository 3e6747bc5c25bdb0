package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// Reachable reports whether a uid that owns nothing on this machine (a
// sandbox uid of a caller that is root) can run the program at path:
// every directory above it is searchable by others, and the file is
// readable and executable by others.
func Reachable(path string) bool {
	path, err := filepath.Abs(path)
	if err != nil {
		return false
	}
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o005 != 0o005 {
		return false
	}
	for d := filepath.Dir(path); ; d = filepath.Dir(d) {
		di, err := os.Stat(d)
		if err != nil || di.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == filepath.Dir(d) {
			return true
		}
	}
}

// Executable returns a path of the program exe that an unprivileged
// sandbox uid can run: exe itself when it is Reachable, else a copy of it
// in a directory of this (root) process's own under the system's
// temporary directory, named by the program's SHA-256, made once and
// reused by every later caller (a kiln binary under /root, or a test
// binary in Go's private build directory, is not reachable by the uid a
// root daemon's sandbox runs as). A directory of that name that this
// process's user does not own, or that others may write, is refused.
func Executable(exe string) (string, error) {
	if Reachable(exe) {
		return exe, nil
	}
	f, err := os.Open(exe)
	if err != nil {
		return "", fmt.Errorf("sandbox: program %s: %w", exe, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("sandbox: program %s: %w", exe, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	dir := filepath.Join(os.TempDir(), "kiln-exe-"+sum[:24])
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return "", fmt.Errorf("sandbox: a copy of %s the sandbox uid can run: %w", exe, err)
	}
	di, err := os.Lstat(dir)
	if err != nil {
		return "", fmt.Errorf("sandbox: a copy of %s the sandbox uid can run: %w", exe, err)
	}
	st, ok := di.Sys().(*syscall.Stat_t)
	if !di.IsDir() || !ok || int(st.Uid) != os.Geteuid() || di.Mode().Perm()&0o022 != 0 {
		return "", fmt.Errorf("sandbox: %s is not a directory of this user's that only it may write; remove it (it would hold the copy of %s that sandboxed uids run)", dir, exe)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", fmt.Errorf("sandbox: %w", err)
	}
	dst := filepath.Join(dir, filepath.Base(exe))
	if same, _ := digestIs(dst, sum); same {
		return dst, nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", fmt.Errorf("sandbox: program %s: %w", exe, err)
	}
	tmp, err := os.CreateTemp(dir, ".copy-")
	if err != nil {
		return "", fmt.Errorf("sandbox: copy %s: %w", exe, err)
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, f)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o755)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		return "", fmt.Errorf("sandbox: copy %s to %s: %w", exe, dst, err)
	}
	if !Reachable(dst) {
		return "", fmt.Errorf("sandbox: the copy %s of %s cannot be run by other uids (is every directory above %s searchable?)", dst, exe, os.TempDir())
	}
	return dst, nil
}

// digestIs reports whether the file at path has the SHA-256 sum (hex).
func digestIs(path, sum string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return false, err
	}
	return hex.EncodeToString(h.Sum(nil)) == sum, nil
}
