package rpcserver_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestSessionRoot: the daemon refuses a session directory that is a
// symbolic link or belongs to another user, and makes its own private.
func TestSessionRoot(t *testing.T) {
	base := t.TempDir()
	target := filepath.Join(base, "target")
	check.NoError(t, os.Mkdir(target, 0o700))
	link := filepath.Join(base, "link")
	check.NoError(t, os.Symlink(target, link))
	_, err := rpcserver.New(rpcserver.Config{Listen: "127.0.0.1:0", Dir: link})
	check.Error(t, err, "is not a directory")

	open := filepath.Join(base, "open")
	check.NoError(t, os.Mkdir(open, 0o777))
	check.NoError(t, os.Chmod(open, 0o777)) // past the umask
	startDaemon(t, rpcserver.Config{Dir: open})
	fi, err := os.Stat(open)
	check.NoError(t, err)
	check.Equal(t, fi.Mode().Perm(), fs.FileMode(0o700))

	if os.Geteuid() != 0 {
		t.Skip("giving a directory to another user needs root")
	}
	theirs := filepath.Join(base, "theirs")
	check.NoError(t, os.Mkdir(theirs, 0o700))
	check.NoError(t, os.Chown(theirs, 65534, 65534))
	_, err = rpcserver.New(rpcserver.Config{Listen: "127.0.0.1:0", Dir: theirs})
	check.Error(t, err, "belongs to user 65534")
}

// TestModuleCopies: the worker's private copy of a loaded module counts
// against the session's disk quota, and a load that fails leaves no copy.
func TestModuleCopies(t *testing.T) {
	so := kernels(t)
	quota := int64(len(so))*5/2 + 1024
	td := startDaemon(t, rpcserver.Config{SessionQuota: quota})
	s := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)

	// An ELF header with nothing behind it: the load fails.
	check.NoError(t, s.Upload(ctx, "broken.so", []byte("\x7fELF not a library")))
	_, err := s.LoadModule(ctx, "broken.so")
	check.ErrorIs(t, err, proto.ErrBadRequest)
	check.Equal(t, moduleCopies(t, sessionView(t, td, s)), 0, "copies after a failed load")
	check.NoError(t, s.Remove(ctx, "broken.so"))

	check.NoError(t, s.Upload(ctx, "kernels.so", so))
	_, err = s.LoadModule(ctx, "kernels.so")
	check.NoError(t, err)
	check.Equal(t, moduleCopies(t, sessionView(t, td, s)), 1, "copies after a load")

	// The file and its copy take two of the two and a half shares.
	_, err = s.LoadModule(ctx, "kernels.so")
	check.ErrorIs(t, err, proto.ErrQuota)
	check.Error(t, err, "--max-session-bytes")
	check.Equal(t, moduleCopies(t, sessionView(t, td, s)), 1, "copies after a refused load")
	err = s.Upload(ctx, "more.bin", bytes.Repeat([]byte{1}, len(so)))
	check.ErrorIs(t, err, proto.ErrQuota)
}

// sessionView is session s's directory as its worker sees it (through
// /proc/PID/root): a capped session's directory is a tmpfs in the
// worker's own mount namespace, where its module copies are.
func sessionView(t *testing.T, td *testDaemon, s *client.Session) string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(td.dir, "session-"+s.Info().ID+"-*"))
	check.NoError(t, err)
	check.Equal(t, len(dirs), 1, "session directories")
	pid := s.Info().WorkerPID
	if inner := descendants(pid); len(inner) > 0 {
		pid = inner[0] // a sandboxed worker: any process inside bubblewrap
	}
	return fmt.Sprintf("/proc/%d/root%s", pid, dirs[0])
}

// moduleCopies counts the loaded modules' copies under a session
// directory (or a daemon's directory of sessions).
func moduleCopies(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	check.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && strings.Contains(filepath.ToSlash(p), "/modules/") {
			n++
		}
		return err
	}))
	return n
}

// TestLoadCPUGlobal: runtime.module.load_cpu loads the session's own
// files only: a path on the machine outside the session is refused.
func TestLoadCPUGlobal(t *testing.T) {
	so := kernels(t)
	outside := filepath.Join(t.TempDir(), "outside.so")
	check.NoError(t, os.WriteFile(outside, so, 0o600))
	td := startDaemon(t, rpcserver.Config{})
	s := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)
	check.NoError(t, s.Upload(ctx, "lib/k.so", so))
	load, err := s.GetGlobal(ctx, "runtime.module.load_cpu")
	check.NoError(t, err)

	got, err := s.Call(ctx, load, "lib/k.so")
	check.NoError(t, err)
	mod, ok := got.(*client.Module)
	check.True(t, ok, "load_cpu returned", got)
	nop, err := mod.GetFunction(ctx, "nop")
	check.NoError(t, err)
	_, err = s.Call(ctx, nop)
	check.NoError(t, err)

	for _, path := range []string{outside, "../" + filepath.Base(outside), "lib/../../k.so", "missing.so"} {
		_, err := s.Call(ctx, load, path)
		check.True(t, err != nil, "load_cpu loaded", path)
		check.True(t, errors.Is(err, proto.ErrBadRequest) || errors.Is(err, proto.ErrNotFound), path, err)
	}
	_, err = s.Call(ctx, load)
	check.ErrorIs(t, err, proto.ErrBadRequest)
}

// TestWorkerInheritsNoDescriptors: a descriptor the daemon's process holds
// without close-on-exec (inherited from whoever started it) does not reach
// a session's worker.
func TestWorkerInheritsNoDescriptors(t *testing.T) {
	if _, err := os.Stat("/proc/self/fd"); err != nil {
		t.Skip("no /proc/self/fd to list a process's descriptors")
	}
	leak, err := os.Create(filepath.Join(t.TempDir(), "daemon-secret"))
	check.NoError(t, err)
	defer leak.Close()
	_, _, errno := syscall.Syscall(syscall.SYS_FCNTL, leak.Fd(), syscall.F_SETFD, 0)
	check.True(t, errno == 0, "clear close-on-exec:", errno)

	for _, mode := range []string{rpcserver.SandboxOff, rpcserver.SandboxAuto} {
		td := startDaemon(t, rpcserver.Config{Sandbox: mode})
		s := td.connect(t, client.SessionOptions{})
		pid := s.Info().WorkerPID
		check.True(t, pid > 0, "worker pid", pid)
		// A sandboxed worker runs under bubblewrap: look at every process.
		for _, p := range append([]int{pid}, descendants(pid)...) {
			dir := fmt.Sprintf("/proc/%d/fd", p)
			ents, err := os.ReadDir(dir)
			check.NoError(t, err)
			for _, e := range ents {
				target, _ := os.Readlink(filepath.Join(dir, e.Name()))
				check.True(t, target != leak.Name(), "the worker holds the daemon's descriptor as its fd", e.Name(), mode)
			}
		}
		check.NoError(t, s.Close())
	}
}

// descendants lists the processes below pid.
func descendants(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 {
			pp, _ := strconv.Atoi(f[1])
			parent[p] = pp
		}
	}
	var out []int
	for p := range parent {
		for q := parent[p]; q > 1; q = parent[q] {
			if q == pid {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// TestSessionOutlivedByNone: a process a kernel double-forks does not
// outlive its session, even unsandboxed (its worker's process group is
// killed; a sandboxed one's PID namespace ends with it, see
// TestTwoTenants).
func TestSessionOutlivedByNone(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{Sandbox: rpcserver.SandboxOff})
	s := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)
	mod := loadKernels(t, s)
	orphan, err := mod.GetFunction(ctx, "orphan")
	check.NoError(t, err)
	out, err := s.Empty(ctx, ndarray.Shape{1}, ndarray.Int64, devices.CPUDevice)
	check.NoError(t, err)
	_, err = s.Call(ctx, orphan, out, int64(2*guard/time.Millisecond)) // past the wait below
	check.NoError(t, err)
	host, err := s.CopyTo(ctx, out)
	check.NoError(t, err)
	pids, err := ndarray.ToSlice[int64](host)
	check.NoError(t, err)
	pid := int(pids[0])
	check.True(t, pid > 0, "the kernel's grandchild pid", pid)
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	check.True(t, alive(pid), "the grandchild is not running")

	check.NoError(t, s.Close())
	eventually(t, "the session's grandchild is gone", func() bool { return !alive(pid) })
}

// alive says whether process pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

// TestSharedNeedsConsent: unsandboxed sessions are served one at a time
// unless the operator says otherwise, and /metrics says which.
func TestSharedNeedsConsent(t *testing.T) {
	_, err := rpcserver.New(rpcserver.Config{Listen: "127.0.0.1:0", Dir: t.TempDir(), MaxSessions: 2, Sandbox: rpcserver.SandboxOff})
	check.Error(t, err, "--max-sessions 2", "--insecure-shared", "--sandbox off")
	td := startDaemon(t, rpcserver.Config{MaxSessions: 2, InsecureShared: true, Sandbox: rpcserver.SandboxOff})
	m := td.metrics(t)
	check.True(t, strings.Contains(m, "kiln_rpcserver_insecure_shared 1\n") && strings.Contains(m, "kiln_rpcserver_sandboxed 0\n"), m)
	check.True(t, strings.Contains(td.logs.String(), "not sandboxed from each other"), td.logs.String())
	one := startDaemon(t, rpcserver.Config{Sandbox: rpcserver.SandboxOff})
	check.True(t, strings.Contains(one.metrics(t), "kiln_rpcserver_insecure_shared 0\n"), one.metrics(t))
}

// TestModuleCopyNoSymlink: the worker writes module copies through its
// session directory's os.Root: where someone on the board has replaced the
// directory of the next copy with a symbolic link to elsewhere, the load
// is refused and nothing is written there.
func TestModuleCopyNoSymlink(t *testing.T) {
	so := kernels(t)
	td := startDaemon(t, rpcserver.Config{Sandbox: rpcserver.SandboxOff})
	s := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)
	check.NoError(t, s.Upload(ctx, "kernels.so", so))
	elsewhere := t.TempDir()
	check.NoError(t, os.Symlink(elsewhere, filepath.Join(sessionView(t, td, s), "modules", "1")))
	_, err := s.LoadModule(ctx, "kernels.so")
	check.True(t, err != nil, "a load through a symbolic link")
	t.Logf("the client sees: %v", err)
	ents, err := os.ReadDir(elsewhere)
	check.NoError(t, err)
	check.Equal(t, len(ents), 0, "files written through the link")
	// The next copy goes to a directory of its own, and loads.
	_, err = s.LoadModule(ctx, "kernels.so")
	check.NoError(t, err)
}

// TestArtifactInflateBounded: an artifact of a few hundred KiB whose
// manifest declares entries beyond the session's disk quota is refused at
// load before anything is inflated into the worker, with an error that
// names the quota; a session whose quota holds them loads it.
func TestArtifactInflateBounded(t *testing.T) {
	a := artifact.New("c", kernelsTC)
	check.NoError(t, a.Add(artifact.HostLib, kernels(t)))
	check.NoError(t, a.Add("params/one.bin", make([]byte, 24<<20)))
	check.NoError(t, a.Add("params/two.bin", make([]byte, 24<<20)))
	b, err := a.Bytes()
	check.NoError(t, err)
	check.True(t, len(b) < 1<<20, "the artifact is small on the wire", len(b))

	td := startDaemon(t, rpcserver.Config{SessionQuota: 16 << 20})
	s := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)
	check.NoError(t, s.Upload(ctx, "bomb.kiln", b))
	_, err = s.LoadModule(ctx, "bomb.kiln")
	check.ErrorIs(t, err, proto.ErrQuota)
	check.Error(t, err, "over the reader's limit of 16777216")
	check.Error(t, err, "--max-session-bytes")
	check.Equal(t, moduleCopies(t, sessionView(t, td, s)), 0, "copies after a refused load")

	roomy := startDaemon(t, rpcserver.Config{SessionQuota: 128 << 20})
	s2 := roomy.connect(t, client.SessionOptions{})
	check.NoError(t, s2.Upload(ctx, "big.kiln", b))
	_, err = s2.LoadModule(ctx, "big.kiln")
	check.NoError(t, err)
}

// TestErrorsNameNoDaemonPath: errors a client gets (a module that fails to
// load, a file that is not there) name the session's files relative to the
// session directory, never by the daemon's absolute paths.
func TestErrorsNameNoDaemonPath(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{})
	s := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)
	check.NoError(t, s.Upload(ctx, "sub/broken.so", []byte("\x7fELF not a library")))
	_, err := s.LoadModule(ctx, "sub/broken.so")
	check.ErrorIs(t, err, proto.ErrBadRequest)
	check.Error(t, err, `"sub/broken.so"`)
	check.Error(t, err, "modules/")
	first := err
	_, err = s.LoadModule(ctx, "missing.so")
	check.ErrorIs(t, err, proto.ErrNotFound)
	_, derr := s.Download(ctx, "missing.bin", io.Discard)
	check.ErrorIs(t, derr, proto.ErrNotFound)
	for _, e := range []error{first, err, derr} {
		check.True(t, !strings.Contains(e.Error(), td.dir), "an error names the daemon's directory:", e)
		check.True(t, !strings.Contains(e.Error(), "/session-"), "an error names the session directory's path:", e)
	}
}
