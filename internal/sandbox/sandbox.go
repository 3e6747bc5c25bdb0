// Package sandbox confines a program run on a client's behalf with
// bubblewrap: the device daemon's session workers and the compiler node's
// build jobs run in it. It owns the bubblewrap arguments, the drop to an
// unprivileged uid when the caller is root, and the probe that checks, on
// this machine, that the sandbox holds before anything is run in it. It
// imports nothing of kiln.
//
// What a sandboxed program gets: new user, PID, mount, IPC, network, UTS
// and cgroup namespaces; no capabilities (--cap-drop ALL, also when the
// caller is root); no_new_privs; the system's programs and libraries, its
// own binary and the paths its caller names, read-only; /proc with
// /proc/sys read-only, and /sys only read-only where CUDA needs it; one
// writable directory and a private /tmp (with CappedArgs both tmpfs
// mounts of a given size, the caller's files for it bound read-only into
// the directory). A caller that runs as root runs
// the sandbox as a uid of its own (DropArgs), so that the sandbox's uid 0
// is never the host's root.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// AutoUIDBase is the first uid of the automatic range that a caller
// running as root takes its sandbox uids from when it is given none: far
// above the ids distributions and subordinate-id ranges hand out.
const AutoUIDBase = 1879048192 // 0x70000000

// AutoUIDs returns n uids of the automatic range, from its first.
func AutoUIDs(n int) []int { return AutoUIDsFrom(0, n) }

// AutoUIDsFrom returns n uids of the automatic range from its offset'th:
// callers of different kinds on one machine (device daemons, compiler
// nodes) take different parts of it.
func AutoUIDsFrom(offset, n int) []int {
	u := make([]int, max(n, 1))
	for i := range u {
		u[i] = AutoUIDBase + offset + i
	}
	return u
}

// Find returns the bubblewrap executable, or an error saying how to
// install it.
func Find() (string, error) {
	p, err := exec.LookPath("bwrap")
	if err != nil {
		return "", errors.New("bubblewrap (bwrap) is not installed; on Debian: apt-get install bubblewrap")
	}
	return p, nil
}

// FindSetpriv returns the setpriv executable, which drops a root caller's
// sandbox to its uid.
func FindSetpriv() (string, error) {
	p, err := exec.LookPath("setpriv")
	if err != nil {
		return "", errors.New("the setpriv command (util-linux) is not installed; it runs the sandbox of a caller that is root as an unprivileged uid")
	}
	return p, nil
}

// Args are bubblewrap's arguments, up to and including the "--" before
// the command, for a program exe whose one writable directory is dir (also
// its working directory and HOME). ro are more paths bound read-only (a
// wrapper's program, a toolchain's directory) where they exist outside
// /usr. The caller's descriptors pass through.
func Args(dir, exe string, ro []string) []string {
	return args(dir, exe, ro, 0, nil)
}

// CappedArgs are Args for a program whose writes are capped: its
// directory dir is a tmpfs of capBytes (as is its /tmp), empty but for
// the subdirectories of dir named in shared, bound read-only from the
// host (files the caller put there for it), and those named in made,
// made empty. Whatever it writes (its caller's copies, a kernel's files)
// lives in those tmpfs mounts, in memory, which a write past capBytes
// finds full (ENOSPC); the memory counts against the program's memory
// cgroup, where it has one. capBytes of 0 or less is Args.
func CappedArgs(dir, exe string, ro []string, capBytes int64, shared, made []string) []string {
	if capBytes <= 0 {
		return Args(dir, exe, ro)
	}
	return args(dir, exe, ro, capBytes, &capped{shared: shared, made: made})
}

// capped are CappedArgs' directories.
type capped struct{ shared, made []string }

func args(dir, exe string, ro []string, capBytes int64, c *capped) []string {
	size := func(a []string) []string {
		if c == nil {
			return a
		}
		return append(a, "--size", strconv.FormatInt(capBytes, 10))
	}
	args := []string{"--die-with-parent"}
	if HasControllingTTY() {
		// A sandboxed program must not push input into the terminal the
		// caller was started from (TIOCSTI): it gets a session of its
		// own. Only then, because a new session is a new scheduling
		// autogroup on most kernels, which costs each call's wakeups tens
		// of microseconds on a busy machine.
		args = append(args, "--new-session")
	}
	args = append(args,
		"--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
		"--hostname", "kiln-sandbox",
		// Without it bubblewrap started by root keeps every capability
		// in the sandbox.
		"--cap-drop", "ALL",
		"--ro-bind", "/usr", "/usr",
	)
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			if target, err := os.Readlink(d); err == nil {
				args = append(args, "--symlink", target, d)
			}
		default:
			args = append(args, "--ro-bind", d, d)
		}
	}
	// What the dynamic loader, OpenMP and BLAS alternatives read in /etc;
	// nothing else of it (keys, tokens, configuration).
	for _, f := range []string{"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
		"/etc/localtime", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group"} {
		args = append(args, "--ro-bind-try", f, f)
	}
	// /proc/sys read-only: the host's sysctls (kernel.core_pattern among
	// them) are not the sandbox's to set.
	args = append(args, "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev")
	args = append(size(args), "--tmpfs", "/tmp")
	if nodes, _ := filepath.Glob("/dev/nvidia*"); len(nodes) > 0 {
		// A CUDA board: the driver's device nodes, and /sys (read-only),
		// where the driver library looks the GPUs up.
		for _, n := range nodes {
			args = append(args, "--dev-bind-try", n, n)
		}
		args = append(args, "--ro-bind-try", "/sys", "/sys")
	}
	bound := map[string]bool{}
	for _, p := range append([]string{exe}, ro...) {
		if !filepath.IsAbs(p) || bound[p] || p == "/usr" || strings.HasPrefix(p, "/usr/") {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			args = append(args, "--ro-bind", p, p)
			bound[p] = true
		}
	}
	if c == nil {
		args = append(args, "--bind", dir, dir)
	} else {
		args = append(size(args), "--tmpfs", dir)
		for _, d := range c.shared {
			args = append(args, "--ro-bind", d, d)
		}
		for _, d := range c.made {
			args = append(args, "--dir", d)
		}
	}
	args = append(args, "--chdir", dir,
		"--setenv", "HOME", dir, "--setenv", "TMPDIR", "/tmp", "--")
	return args
}

// DropArgs is the setpriv prefix that runs what follows as uid (its own
// group, no supplementary groups, no_new_privs), for a caller that is root.
func DropArgs(setpriv string, uid int) []string {
	u := strconv.Itoa(uid)
	return []string{setpriv, "--reuid=" + u, "--regid=" + u, "--clear-groups", "--no-new-privs", "--"}
}

// probeScript fails, saying which, unless the sandbox it runs in has no
// capabilities, has no_new_privs set and cannot write the host's sysctls.
const probeScript = `s=/proc/self/status
grep -q '^CapEff:[[:space:]]*0*$' $s || { echo "the sandbox keeps capabilities: $(grep CapEff $s)"; exit 1; }
grep -q '^NoNewPrivs:[[:space:]]*1$' $s || { echo "the sandbox does not set no_new_privs"; exit 1; }
for f in /proc/sys/kernel/core_pattern /proc/sys/kernel/printk_ratelimit_burst; do
  if [ -e $f ] && [ -w $f ]; then echo "the sandbox can write $f"; exit 1; fi
done`

// Probe runs the sandbox a program would get around a check of it, as
// uid when uid > 0 (through setpriv, for a caller that is root), in a
// fresh directory under parent: it fails when bubblewrap cannot sandbox
// here (user namespaces not allowed…) or when the sandbox would not hold.
func Probe(ctx context.Context, bwrap, setpriv, parent string, uid int) error {
	sh, err := exec.LookPath("sh")
	if err != nil {
		return fmt.Errorf("probe bubblewrap: %w", err)
	}
	dir, err := os.MkdirTemp(parent, "probe-")
	if err != nil {
		return fmt.Errorf("probe bubblewrap: %w", err)
	}
	defer os.RemoveAll(dir)
	argv := append(append([]string{bwrap}, Args(dir, sh, nil)...), sh, "-c", probeScript)
	if uid > 0 {
		if err := os.Chown(dir, uid, uid); err != nil {
			return fmt.Errorf("probe bubblewrap: %w", err)
		}
		argv = append(DropArgs(setpriv, uid), argv...)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
			msg = msg[i+1:]
		}
		return fmt.Errorf("bubblewrap cannot sandbox here: %v: %.200s", err, msg)
	}
	return nil
}

// HasControllingTTY reports whether this process has a controlling
// terminal, which sandboxed programs would share.
func HasControllingTTY() bool {
	ttyOnce.Do(func() {
		f, err := os.OpenFile("/dev/tty", os.O_RDONLY|syscall.O_NOCTTY, 0)
		if err == nil {
			f.Close()
			hasTTY = true
		}
	})
	return hasTTY
}

var (
	ttyOnce sync.Once
	hasTTY  bool
)
