package rpcserver_test

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// sandboxedConfig returns cfg for a sandboxed daemon, or skips the test
// saying why this machine cannot sandbox. As root it adds a worker uid
// pool, with the worker binary and the session root where those uids can
// reach them.
func sandboxedConfig(t *testing.T, cfg rpcserver.Config) rpcserver.Config {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Skip("bubblewrap (bwrap) is not installed; .ci/run installs it (Debian: apt-get install bubblewrap)")
	}
	cfg.Sandbox = rpcserver.SandboxBwrap
	if os.Geteuid() == 0 {
		shared, exe := sharedBinary(t)
		cfg.Worker.Path = exe
		cfg.Dir = filepath.Join(shared, "sessions")
		cfg.WorkerUIDs = []int{61001, 61002, 61003}
	}
	probe := cfg
	probe.Listen = "127.0.0.1:0"
	if probe.Dir == "" {
		probe.Dir = t.TempDir()
	}
	d, err := rpcserver.New(probe)
	if err != nil {
		if strings.Contains(err.Error(), "bubblewrap") {
			t.Skipf("this machine cannot sandbox workers: %v", err)
		}
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	check.NoError(t, d.Run(ctx))
	return cfg
}

// sharedBinary makes a directory that every uid can enter, removed when
// the test ends, with a copy of this test binary in it.
func sharedBinary(t *testing.T) (dir, exe string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "kiln-shared-")
	check.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	check.NoError(t, os.Chmod(dir, 0o755))
	exe = filepath.Join(dir, "rpcserver.test")
	copyFile(t, os.Args[0], exe)
	return dir, exe
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	check.NoError(t, err)
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	check.NoError(t, err)
	_, err = io.Copy(out, in)
	check.NoError(t, err)
	check.NoError(t, out.Close())
}

// tenant is one user's session on the shared board.
type tenant struct {
	name string
	s    *client.Session
	mod  *client.Module
	file string // the host path of its secret file
}

// TestTwoTenants: two users share one sandboxed board (two sessions at
// once, without --insecure-shared). Each one's kernel tries to read and
// rewrite the other's uploaded file, to signal the other's worker, and to
// leave a double-forked child behind; none of it succeeds.
func TestTwoTenants(t *testing.T) {
	cfg := sandboxedConfig(t, rpcserver.Config{MaxSessions: 2, Token: "board-token"})
	td := startDaemon(t, cfg)
	m := td.metrics(t)
	check.True(t, strings.Contains(m, "kiln_rpcserver_sandboxed 1\n") && strings.Contains(m, "kiln_rpcserver_insecure_shared 0\n"), m)
	ctx := testCtx(t)

	var ts []*tenant
	for _, name := range []string{"alice", "bob"} {
		s := td.connect(t, client.SessionOptions{Token: "board-token"})
		tn := &tenant{name: name, s: s, mod: loadKernels(t, s)}
		check.NoError(t, s.Upload(ctx, "secret", []byte(name+"'s weights")))
		dirs, err := filepath.Glob(filepath.Join(td.dir, "session-"+s.Info().ID+"-*"))
		check.NoError(t, err)
		check.Equal(t, len(dirs), 1, "session directories of", name)
		tn.file = filepath.Join(dirs[0], "files", "secret")
		ts = append(ts, tn)
	}
	if len(cfg.WorkerUIDs) > 0 {
		ua, ub := workerUIDs(t, ts[0].s), workerUIDs(t, ts[1].s)
		check.True(t, len(ua) == 1 && len(ub) == 1 && ua[0] != ub[0], "each session's worker runs as a uid of its own", ua, ub)
		check.True(t, slices.Contains(cfg.WorkerUIDs, ua[0]) && slices.Contains(cfg.WorkerUIDs, ub[0]), "worker uids come from the pool", ua, ub)
	}

	for i, attacker := range ts {
		victim := ts[1-i]
		intrude, err := attacker.mod.GetFunction(ctx, "intrude")
		check.NoError(t, err)
		vpids := append([]int{victim.s.Info().WorkerPID}, descendants(victim.s.Info().WorkerPID)...)
		check.True(t, len(vpids) >= 2, "the victim's sandbox and worker processes", vpids)
		targets := []string{victim.file, fmt.Sprintf("/proc/%d/root%s", vpids[len(vpids)-1], victim.file)}
		for _, path := range targets {
			for _, pid := range vpids {
				got := callIntrude(t, attacker.s, intrude, path, pid)
				t.Logf("%s's kernel against %s (%s, pid %d): read %d, write %d, kill %d", attacker.name, victim.name, path, pid, got[0], got[1], got[2])
				check.True(t, got[0] < 0, attacker.name+" read the other tenant's file", path, got[0])
				check.True(t, got[1] < 0, attacker.name+" wrote the other tenant's file", path, got[1])
				check.True(t, got[2] < 0, attacker.name+" signalled the other tenant's process", pid, got[2])
			}
		}
		// The victim's file and session are intact.
		b, err := os.ReadFile(victim.file)
		check.NoError(t, err)
		check.Equal(t, string(b), victim.name+"'s weights")
		nop, err := victim.mod.GetFunction(ctx, "nop")
		check.NoError(t, err)
		_, err = nop.Call(ctx)
		check.NoError(t, err, victim.name+"'s session after the attack")
	}

	// Bob leaves a double-forked child behind and ends his session: no
	// process of his outlives it, while Alice's session goes on.
	orphan, err := ts[1].mod.GetFunction(ctx, "orphan")
	check.NoError(t, err)
	out, err := ts[1].s.Empty(ctx, ndarray.Shape{1}, ndarray.Int64, devices.CPUDevice)
	check.NoError(t, err)
	_, err = ts[1].s.Call(ctx, orphan, out, int64(2*guard/time.Millisecond))
	check.NoError(t, err)
	bobPIDs := append([]int{ts[1].s.Info().WorkerPID}, descendants(ts[1].s.Info().WorkerPID)...)
	check.True(t, len(bobPIDs) >= 3, "bob's sandbox, worker and the grandchild", bobPIDs)
	t.Cleanup(func() {
		for _, p := range bobPIDs {
			syscall.Kill(p, syscall.SIGKILL)
		}
	})
	check.NoError(t, ts[1].s.Close())
	eventually(t, "every process of bob's session is gone", func() bool {
		for _, p := range bobPIDs {
			if alive(p) {
				return false
			}
		}
		return true
	})
	nop, err := ts[0].mod.GetFunction(ctx, "nop")
	check.NoError(t, err)
	_, err = nop.Call(ctx)
	check.NoError(t, err, "alice's session after bob left")
}

// callIntrude runs the intrude kernel against path and pid.
func callIntrude(t *testing.T, s *client.Session, f *client.Func, path string, pid int) [3]int64 {
	t.Helper()
	out := callWithPath(t, s, f, path, int64(pid), 3)
	return [3]int64{out[0], out[1], out[2]}
}

// callWithPath calls f(path, arg, out) with path as a NUL-terminated
// uint8 tensor and out an int64 tensor of n elements, which it returns.
func callWithPath(t *testing.T, s *client.Session, f *client.Func, path string, arg int64, n int64) []int64 {
	t.Helper()
	got, err := callWithPathErr(t, s, f, path, arg, n)
	check.NoError(t, err)
	return got
}

// callWithPathErr is callWithPath returning the call's error.
func callWithPathErr(t *testing.T, s *client.Session, f *client.Func, path string, arg int64, n int64) ([]int64, error) {
	t.Helper()
	ctx := testCtx(t)
	p := append([]byte(path), 0)
	pa, err := s.Empty(ctx, ndarray.Shape{int64(len(p))}, ndarray.Uint8, devices.CPUDevice)
	check.NoError(t, err)
	check.NoError(t, pa.CopyFromBytes(ctx, p))
	return callInts(t, s, f, []any{pa, arg}, n)
}

// workerUIDs lists the real uids of a session's processes below its
// sandbox.
func workerUIDs(t *testing.T, s *client.Session) []int {
	var uids []int
	for _, p := range descendants(s.Info().WorkerPID) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
				u, _ := strconv.Atoi(f[1])
				if !slices.Contains(uids, u) {
					uids = append(uids, u)
				}
			}
		}
	}
	return uids
}

// TestSessionMemoryCap: a kernel that takes more memory than
// --max-session-memory allows ends its session (the kernel kills its
// worker), the client is told why, and the board serves the next one.
func TestSessionMemoryCap(t *testing.T) {
	cfg := sandboxedConfig(t, rpcserver.Config{MaxSessionMemory: 512 << 20})
	td := startDaemon(t, cfg)
	if !strings.Contains(td.logs.String(), "caps_by=cgroup") {
		t.Skip("no cgroup for the session caps here (not root, or no delegated cgroup): they are rlimits, which a race-enabled worker cannot run under")
	}
	s := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)
	mod := loadKernels(t, s)
	hog, err := mod.GetFunction(ctx, "hog")
	check.NoError(t, err)
	_, err = hog.Call(ctx, int64(64)) // well under the cap
	check.NoError(t, err)
	_, err = hog.Call(ctx, int64(2048))
	check.ErrorIs(t, err, proto.ErrCrashed)
	check.Error(t, err, "ran out of memory", "--max-session-memory", `function "hog"`)
	s2 := td.connect(t, client.SessionOptions{})
	_, err = s2.List(ctx)
	check.NoError(t, err)
}

// callFill runs the fill kernel: it writes mib MiB to path in the
// session's sandbox and returns the bytes written and -errno of the write
// that was refused.
func callFill(t *testing.T, s *client.Session, f *client.Func, path string, mib int64) (int64, int64) {
	t.Helper()
	out := callWithPath(t, s, f, path, mib, 2)
	return out[0], out[1]
}

// TestKernelWritesCapped: a kernel of a sandboxed session writes 64 MiB
// into its session directory, into a subdirectory and into /tmp, under a
// 20 MB --max-session-bytes: each write stops at the cap (ENOSPC), and
// the host's disk never holds the bytes; the uploads stay read-only to
// the kernel.
func TestKernelWritesCapped(t *testing.T) {
	const quota = 20 << 20
	cfg := sandboxedConfig(t, rpcserver.Config{SessionQuota: quota})
	td := startDaemon(t, cfg)
	s := td.connect(t, client.SessionOptions{})
	mod := loadKernels(t, s)
	checkWritesCapped(t, td, s, mod, quota, "scratch.bin", "modules/more.bin", "/tmp/scratch.bin")
}

// checkWritesCapped has mod's fill kernel write 64 MiB to each path of a
// session capped at quota bytes: each write stops at the cap with
// ENOSPC and the host's disk never holds the bytes. A kernel's file keeps
// an upload out, the uploads are read-only to the kernel, and a kernel
// that fails on a refused write gets an error naming the cap.
func checkWritesCapped(t *testing.T, td *testDaemon, s *client.Session, mod *client.Module, quota int64, paths ...string) {
	t.Helper()
	ctx := testCtx(t)
	fill, err := mod.GetFunction(ctx, "fill")
	check.NoError(t, err)
	for _, path := range paths {
		n, errno := callFill(t, s, fill, path, 64)
		t.Logf("%s: %d bytes written of 64 MiB, then errno %d", path, n, -errno)
		check.True(t, n <= quota, path, "wrote", n, "bytes under a cap of", quota)
		check.Equal(t, errno, -int64(syscall.ENOSPC), path, "the refused write's errno")
		held := hostBytes(t, td.dir)
		check.True(t, held < quota, "the host's session directory holds", held)
		// Truncated, the file frees its space for the next one.
		callFill(t, s, fill, path, 0)
	}
	// A kernel's files count against the uploads' share of the cap.
	callFill(t, s, fill, "scratch.bin", 64)
	check.ErrorIs(t, s.Upload(ctx, "more.bin", make([]byte, 1<<20)), proto.ErrQuota)
	callFill(t, s, fill, "scratch.bin", 0)
	_, errno := callFill(t, s, fill, "files/kernels.kiln", 1)
	check.Equal(t, errno, -int64(syscall.EROFS), "a write over an upload")
	_, err = callWithPathErr(t, s, fill, "scratch.bin", -64, 2)
	t.Logf("the failing kernel's error: %v", err)
	check.Error(t, err, "No space left on device", "--max-session-bytes")
	callFill(t, s, fill, "scratch.bin", 0)
}

// hostBytes sums the sizes of the regular files under dir on the host.
func hostBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	check.NoError(t, filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return err
	}))
	return n
}
