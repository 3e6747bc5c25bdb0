package rpcserver

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestIsolationCommand: the argv around a worker, from the outside in: the
// shell that joins the session's cgroups, prlimit's caps, the drop to the
// session's uid, bubblewrap, then the wrapper and the worker.
func TestIsolationCommand(t *testing.T) {
	path, err := os.Executable() // a file that exists, to be bound
	check.NoError(t, err)
	wrapper, args := []string{"taskset", "-c", "1"}, []string{"rpcserver-worker"}
	plain := (&isolation{}).command("/d", nil, -1, wrapper, path, args)
	check.True(t, slices.Equal(plain, []string{"taskset", "-c", "1", path, "rpcserver-worker"}), plain)

	// Unsandboxed with a write cap: the session mounter, then the wrapper.
	capped := (&isolation{capMount: "/bin/kiln", quota: 1 << 20}).command("/d", []string{"/cg/s1/cgroup.procs"}, -1, wrapper, path, args)
	check.True(t, slices.Equal(capped[6:], []string{"/bin/kiln", sessionMountArg, "1048576", "/d", "--", "taskset", "-c", "1", path, "rpcserver-worker"}), capped)

	rl := (&isolation{prlimit: "/usr/bin/prlimit", procs: 64}).command("/d", nil, -1, nil, path, args)
	check.True(t, slices.Equal(rl, []string{"/usr/bin/prlimit", "--nproc=64", "--", path, "rpcserver-worker"}), rl)

	iso := &isolation{bwrap: "/usr/bin/bwrap", setpriv: "/usr/bin/setpriv", memory: 1 << 30}
	argv := iso.command("/srv/s1", []string{"/cg/mem/s1/cgroup.procs", "/cg/pids/s1/cgroup.procs"}, 61001, wrapper, path, args)
	check.Equal(t, argv[0], "/bin/sh")
	check.True(t, slices.Equal(argv[3:7], []string{"kiln-worker", "2", "/cg/mem/s1/cgroup.procs", "/cg/pids/s1/cgroup.procs"}), argv[3:7])
	check.True(t, slices.Equal(argv[7:13], []string{"/usr/bin/setpriv", "--reuid=61001", "--regid=61001", "--clear-groups", "--no-new-privs", "--"}), argv[7:13])
	check.Equal(t, argv[13], "/usr/bin/bwrap")
	rest := strings.Join(argv[14:], " ")
	for _, want := range []string{"--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net", "--die-with-parent",
		"--cap-drop ALL", "--ro-bind /proc/sys /proc/sys",
		"--bind /srv/s1 /srv/s1", "--chdir /srv/s1", "--ro-bind " + path + " " + path, "--proc /proc", "--tmpfs /tmp",
		"-- taskset -c 1 " + path + " rpcserver-worker"} {
		check.True(t, strings.Contains(rest, want), "bubblewrap's arguments lack", want, rest)
	}
	// Nothing else of the machine is writable or bound: no /home, no /etc
	// but the loader's files, no /root.
	for _, not := range []string{"/home", "/root", "--bind / ", "/etc/shadow", "--ro-bind /etc /etc"} {
		check.True(t, !strings.Contains(rest, not), "bubblewrap's arguments hold", not, rest)
	}
}

// TestExitReasonBwrap: bubblewrap reports its worker's death by a signal
// as exit status 128+signal; the daemon reads the signal back.
func TestExitReasonBwrap(t *testing.T) {
	got, crashed := exitReasonCode(139, nil, true)
	check.Equal(t, got, "killed by signal SIGSEGV (segmentation fault)")
	check.True(t, crashed)
	got, _ = exitReasonCode(137, nil, true)
	check.True(t, strings.HasPrefix(got, "killed by signal SIGKILL"), got)
	got, _ = exitReasonCode(139, nil, false)
	check.Equal(t, got, "exited with status 139")
	got, crashed = exitReasonCode(0, nil, true)
	check.Equal(t, got, "exited")
	check.True(t, !crashed)
}

// TestCapsNeedCgroup: a daemon that can make no cgroup for its sessions
// refuses a memory cap, and a process cap shared with its user's other
// processes, with errors that say what to do; rlimits stood in for them
// before, under which one session's children each held the whole memory
// cap and a small cap stopped the Go worker from starting.
func TestCapsNeedCgroup(t *testing.T) {
	old := cgroupFS
	cgroupFS = filepath.Join(t.TempDir(), "no-cgroups")
	defer func() { cgroupFS = old }()
	dir := t.TempDir()
	_, err := New(Config{Listen: "127.0.0.1:0", Dir: dir, Sandbox: SandboxOff, MaxSessionMemory: 1 << 30})
	check.Error(t, err, "--max-session-memory needs a cgroup for each session")
	check.Error(t, err, "Delegate=yes", "it runs as user")
	_, err = New(Config{Listen: "127.0.0.1:0", Dir: dir, Sandbox: SandboxOff, MaxSessionProcs: 64})
	check.Error(t, err, "--max-session-procs needs a cgroup for each session")
	// The default process cap is dropped, not refused: the daemon starts.
	d, err := New(Config{Listen: "127.0.0.1:0", Dir: dir, Sandbox: SandboxOff})
	check.NoError(t, err)
	check.Equal(t, d.iso.capsBy(), "none")
	d.ln.Close()
	d.iso.close()
}
