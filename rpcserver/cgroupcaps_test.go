package rpcserver_test

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler/toolchain"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

//go:embed testdata/caps.c
var capsC string

// delegatedEnv, in a run that runUnprivileged started, says the test
// put it in a cgroup delegated to its uid: the caps must hold there.
const delegatedEnv = "KILN_RPCSERVER_TEST_DELEGATED"

// The caps of TestSessionCapsCountEveryProcess: twelve children of
// memChild each, more than memCap together, and a process cap far below
// the forks tried. The memory cap is under 1 GiB, which the Go worker
// must start within.
const (
	memCap    = 512 << 20
	memChild  = 64
	children  = 12
	procsCap  = 64
	forksWant = 3000
)

// TestSessionCapsCountEveryProcess: on an unsandboxed daemon with
// --max-session-memory 512 MiB and --max-session-procs 64, a kernel
// forks twelve children that each take 64 MiB (768 MiB together): they
// are not all let hold it; and a kernel that tries 3,000 forks is stopped
// before the cap. Both count all of the session's processes, which
// per-process rlimits would not. As root it runs again as an unprivileged
// uid in a cgroup delegated to it (cgroup v2 where it has the memory and
// pids controllers, else v1), as a daemon started by systemd with
// Delegate=yes would be; it skips, saying why, where there is neither.
func TestSessionCapsCountEveryProcess(t *testing.T) {
	if os.Getenv(unprivilegedEnv) == "" && os.Geteuid() == 0 {
		t.Run("delegated", func(t *testing.T) {
			procs, why := delegateCgroup(t, 65534)
			if procs == nil {
				t.Skip(why)
			}
			runUnprivilegedIn(t, "TestSessionCapsCountEveryProcess", procs)
		})
	}
	cfg := rpcserver.Config{Sandbox: rpcserver.SandboxOff, MaxSessionMemory: memCap, MaxSessionProcs: procsCap}
	probe := cfg
	probe.Listen, probe.Dir = "127.0.0.1:0", t.TempDir()
	d, err := rpcserver.New(probe)
	if err != nil && os.Getenv(delegatedEnv) == "" && strings.Contains(err.Error(), "needs a cgroup") {
		t.Skipf("no cgroup for the session caps here: %v", err)
	}
	check.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	check.NoError(t, d.Run(ctx))

	td := startDaemon(t, cfg)
	check.True(t, strings.Contains(td.logs.String(), "caps_by=cgroup"), "the caps are a cgroup", td.logs.String())
	s := td.connect(t, client.SessionOptions{})
	mod := loadCaps(t, s)
	hold, err := mod.GetFunction(testCtx(t), "hold_children")
	check.NoError(t, err)
	out, err := callInts(t, s, hold, []any{int64(children), int64(memChild)}, 2)
	if err != nil {
		// The kernel's OOM killer may take the worker itself.
		check.ErrorIs(t, err, proto.ErrCrashed)
		check.Error(t, err, "ran out of memory", "--max-session-memory")
		s = td.connect(t, client.SessionOptions{})
		mod = loadCaps(t, s)
	} else {
		t.Logf("children that held %d MiB: %d; killed first: %d", memChild, out[0], out[1])
		check.True(t, out[0] < children && out[1] > 0, "the children held more than the cap together", out)
	}

	forks, err := mod.GetFunction(testCtx(t), "fork_many")
	check.NoError(t, err)
	out, err = callInts(t, s, forks, []any{int64(forksWant)}, 2)
	check.NoError(t, err)
	t.Logf("forks before one was refused: %d (errno %d)", out[0], -out[1])
	check.True(t, out[0] < procsCap, "forks under a process cap of", procsCap, "got", out[0])
	check.Equal(t, out[1], -int64(syscall.EAGAIN), "the refused fork's errno")

	// The session goes on after both.
	out, err = callInts(t, s, forks, []any{int64(1)}, 2)
	check.NoError(t, err)
	check.Equal(t, out[0], int64(1), "forks after the cap was hit")
}

// loadCaps builds testdata/caps.c and loads it into s.
func loadCaps(t *testing.T, s *client.Session) *client.Module {
	t.Helper()
	kernels(t) // skips where there is no C toolchain
	ctx := testCtx(t)
	tc, err := toolchain.Find(ctx, toolchain.Options{Flags: []string{"-O1"}})
	check.NoError(t, err)
	so := filepath.Join(t.TempDir(), "caps.so")
	check.NoError(t, tc.BuildShared(ctx, []toolchain.Source{{Name: "caps.c", Text: capsC}}, so, ""))
	lib, err := os.ReadFile(so)
	check.NoError(t, err)
	a := artifact.New("c", tc.Identity())
	check.NoError(t, a.Add(artifact.HostLib, lib))
	b, err := a.Bytes()
	check.NoError(t, err)
	check.NoError(t, s.Upload(ctx, "caps.kiln", b))
	mod, err := s.LoadModule(ctx, "caps.kiln")
	check.NoError(t, err)
	return mod
}

// callInts calls f(args..., out) with out an int64 tensor of n elements,
// which it returns.
func callInts(t *testing.T, s *client.Session, f *client.Func, args []any, n int64) ([]int64, error) {
	t.Helper()
	ctx := testCtx(t)
	out, err := s.Empty(ctx, ndarray.Shape{n}, ndarray.Int64, devices.CPUDevice)
	check.NoError(t, err)
	if _, err := s.Call(ctx, f, append(args, out)...); err != nil {
		return nil, err
	}
	b, err := out.ReadBytes(ctx)
	check.NoError(t, err)
	got := make([]int64, n)
	for i := range got {
		got[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return got, nil
}

// delegateCgroup makes cgroups for uid's processes, delegated to it as
// systemd's Delegate=yes does: in cgroup v2 one with the memory and pids
// controllers, its directory and its cgroup.procs, cgroup.threads and
// cgroup.subtree_control files the uid's; else one per v1 hierarchy
// (memory, pids), given to the uid. It returns their cgroup.procs files,
// removed with what the uid made below them when the test ends, or nil
// and why it cannot.
func delegateCgroup(t *testing.T, uid int) ([]string, string) {
	const fs = "/sys/fs/cgroup"
	name := fmt.Sprintf("kiln-test-delegated-%d", os.Getpid())
	own := func(dir string, files ...string) error {
		if err := os.Chown(dir, uid, uid); err != nil {
			return err
		}
		for _, f := range files {
			if err := os.Chown(filepath.Join(dir, f), uid, uid); err != nil {
				return err
			}
		}
		return nil
	}
	var why []string
	// cgroup v2: the unified hierarchy at /sys/fs/cgroup.
	if b, err := os.ReadFile(filepath.Join(fs, "cgroup.controllers")); err != nil {
		why = append(why, "no cgroup v2 hierarchy at "+fs)
	} else if ctl := strings.Fields(string(b)); !slices.Contains(ctl, "memory") || !slices.Contains(ctl, "pids") {
		why = append(why, fmt.Sprintf("cgroup v2 at %s has the controllers %v, not memory and pids", fs, ctl))
	} else if err := os.WriteFile(filepath.Join(fs, "cgroup.subtree_control"), []byte("+memory +pids"), 0); err != nil {
		why = append(why, fmt.Sprintf("cannot enable memory and pids for %s's children: %v", fs, err))
	} else {
		dir := filepath.Join(fs, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			why = append(why, fmt.Sprintf("cannot make a cgroup v2 to delegate: %v", err))
		} else {
			t.Cleanup(func() { removeCgroupTree(dir) })
			if err := own(dir, "cgroup.procs", "cgroup.threads", "cgroup.subtree_control"); err != nil {
				t.Fatalf("delegate %s to uid %d: %v", dir, uid, err)
			}
			return []string{filepath.Join(dir, "cgroup.procs")}, ""
		}
	}
	// cgroup v1: one hierarchy per controller, below the test's own
	// cgroup in each.
	mine := map[string]string{}
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if f := strings.SplitN(line, ":", 3); len(f) == 3 {
				for _, c := range strings.Split(f[1], ",") {
					mine[c] = f[2]
				}
			}
		}
	}
	var procs []string
	for _, ctl := range []string{"memory", "pids"} {
		base := filepath.Join(fs, ctl, mine[ctl])
		if _, err := os.Stat(filepath.Join(base, "cgroup.procs")); err != nil {
			why = append(why, "no cgroup v1 "+ctl+" hierarchy at "+base)
			return nil, strings.Join(why, "; ")
		}
		dir := filepath.Join(base, name)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			why = append(why, fmt.Sprintf("cannot make a cgroup v1 %s cgroup to delegate: %v", ctl, err))
			return nil, strings.Join(why, "; ")
		}
		t.Cleanup(func() { removeCgroupTree(dir) })
		if err := own(dir, "cgroup.procs", "tasks"); err != nil {
			t.Fatalf("delegate %s to uid %d: %v", dir, uid, err)
		}
		procs = append(procs, filepath.Join(dir, "cgroup.procs"))
	}
	t.Logf("delegated cgroup v1 memory and pids cgroups (%s)", strings.Join(why, "; "))
	return procs, ""
}

// removeCgroupTree removes the cgroup dir and those below it, deepest
// first (their processes are gone by then).
func removeCgroupTree(dir string) {
	var dirs []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		syscall.Rmdir(dirs[i])
	}
}
