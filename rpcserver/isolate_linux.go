package rpcserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// An unsandboxed session's writes are capped the way a sandboxed one's
// are: its worker starts in a mount namespace of its own (and, under a
// daemon that is not root, a user namespace that maps the daemon's uid to
// itself, which is what lets it mount), where the session directory is a
// tmpfs of the write cap with the uploads (files/) bound read-only from
// the host. The mounts are made by the daemon's own binary, started as
// the session mounter before the worker's command: it mounts, drops the
// capability it mounted with, and becomes the worker's command. The
// namespace, and its tmpfs, end with the session's last process.

// sessionMountArg, as a binary's first argument, makes any binary that
// links this package the session mounter (see init):
//
//	BINARY sessionMountArg CAP_BYTES DIR -- COMMAND...
const sessionMountArg = "kiln-rpcserver-session-mount"

func init() {
	if len(os.Args) > 5 && os.Args[1] == sessionMountArg && os.Args[4] == "--" {
		os.Exit(sessionMountMain(os.Args[2], os.Args[3], os.Args[5:]))
	}
}

// sessionMountMain mounts the session directory dir as a tmpfs of capArg
// bytes and executes argv; it returns only on failure, having said why.
func sessionMountMain(capArg, dir string, argv []string) int {
	// Package init runs on the main thread, locked to it: the ambient
	// capabilities cleared below are that thread's, and the exec is its.
	runtime.LockOSThread()
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "kiln: cap the session directory: %v\n", err)
		return 125
	}
	capBytes, err := strconv.ParseInt(capArg, 10, 64)
	if err != nil || capBytes <= 0 {
		return fail(fmt.Errorf("bad size %q", capArg))
	}
	if err := mountSessionDir(dir, capBytes); err != nil {
		return fail(err)
	}
	// The working directory (the worker's is dir) is still the host's
	// directory below the tmpfs: it moves onto the tmpfs.
	if err := os.Chdir(dir); err != nil {
		return fail(err)
	}
	// The capability the daemon gave this process to mount with must not
	// reach the worker: without ambient capabilities an exec as a uid
	// other than 0 leaves none.
	if os.Geteuid() != 0 {
		if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
			return fail(fmt.Errorf("drop the capability to mount: %w", err))
		}
	}
	prog, err := exec.LookPath(argv[0])
	if err != nil {
		return fail(err)
	}
	err = syscall.Exec(prog, argv, os.Environ())
	return fail(fmt.Errorf("exec %s: %w", prog, err))
}

// mountSessionDir mounts, in this process's own mount namespace, a tmpfs
// of capBytes over dir, with dir/files (the uploads) bound read-only
// from the host into it and dir/modules made empty.
func mountSessionDir(dir string, capBytes int64) error {
	// Nothing mounted here may reach the daemon's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make the mount namespace private: %w", err)
	}
	files := filepath.Join(dir, "files")
	fd, err := unix.Open(files, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the uploads: %w", err)
	}
	defer unix.Close(fd)
	opts := fmt.Sprintf("size=%d,mode=0700", capBytes)
	if err := unix.Mount("kiln-session", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount a tmpfs of %d bytes: %w", capBytes, err)
	}
	for _, sub := range []string{"files", "modules"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			return err
		}
	}
	// The descriptor names the host's directory, which the tmpfs now
	// covers.
	if err := unix.Mount("/proc/self/fd/"+strconv.Itoa(fd), files, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind the uploads: %w", err)
	}
	// A remount must keep the flags the host's mount has (in a user
	// namespace they are locked); it adds read-only.
	var st unix.Statfs_t
	if err := unix.Statfs(files, &st); err != nil {
		return fmt.Errorf("bind the uploads: %w", err)
	}
	keep := uintptr(st.Flags) & (unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NOATIME | unix.MS_NODIRATIME | unix.MS_RELATIME)
	if err := unix.Mount("", files, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|keep, ""); err != nil {
		return fmt.Errorf("make the uploads read-only: %w", err)
	}
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		return fmt.Errorf("%s is not the tmpfs just mounted (%v)", dir, err)
	}
	return nil
}

// capMountArgs is the session mounter's prefix of a worker's command, which
// caps session directory dir at capBytes.
func capMountArgs(mounter string, capBytes int64, dir string) []string {
	return []string{mounter, sessionMountArg, strconv.FormatInt(capBytes, 10), dir, "--"}
}

// capMountAttr adds to attr the namespaces the session mounter needs: a
// mount namespace, and under a daemon that is not root a user namespace
// mapping the daemon's uid and gid to themselves, in which the mounter
// holds the capability to mount (and drops it before the worker starts).
func capMountAttr(attr *syscall.SysProcAttr) {
	attr.Cloneflags |= syscall.CLONE_NEWNS
	if uid := os.Geteuid(); uid != 0 {
		gid := os.Getegid()
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
		attr.GidMappingsEnableSetgroups = false
		attr.AmbientCaps = []uintptr{unix.CAP_SYS_ADMIN}
	}
}

// probeCapMount checks, in a fresh directory under parent, that the
// session mounter (the binary mounter) caps a session directory here: it
// runs the mounter around a shell that checks it sees a tmpfs with the
// uploads read-only, and that no ambient capability (the one to mount
// with, under a daemon that is not root) reaches it.
func probeCapMount(mounter, parent string) error {
	dir, err := os.MkdirTemp(parent, "probe-mount-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, sub := range []string{"files", "modules"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			return err
		}
	}
	const script = `touch modules/x && ! touch files/x 2>/dev/null && grep -q '^CapAmb:[[:space:]]*0*$' /proc/self/status`
	argv := append(capMountArgs(mounter, 1<<20, dir), "/bin/sh", "-c", script, "probe", dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	capMountAttr(cmd.SysProcAttr)
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if msg == "" {
			msg = "the checks inside failed"
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			// The namespaces could not be made at all.
			msg = err.Error()
			if os.Geteuid() != 0 {
				msg += " (this kernel does not let the daemon's user make a user namespace: kernel.unprivileged_userns_clone, user.max_user_namespaces or an AppArmor or SELinux policy forbids it)"
			}
		}
		return fmt.Errorf("a mount namespace of the worker's own with a tmpfs for its session directory does not work here: %.300s", msg)
	}
	if _, err := os.Stat(filepath.Join(dir, "modules", "x")); err == nil {
		return errors.New("the probe's writes reached the host's directory")
	}
	return nil
}

// tmpfsSpace returns the size and the free bytes of dir's file system
// when it is a tmpfs (a capped session directory).
func tmpfsSpace(dir string) (size, free int64, ok bool) {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil || st.Type != unix.TMPFS_MAGIC {
		return 0, 0, false
	}
	return int64(st.Blocks) * st.Bsize, int64(st.Bavail) * st.Bsize, true
}

// sessionTmpfsUsed returns the bytes in use in the tmpfs that is session
// directory dir in the mount namespace of worker process pid (or of its
// first child, the sandbox's, when pid is bubblewrap), or 0 when it is
// no tmpfs there.
func sessionTmpfsUsed(pid int, dir string) int64 {
	if pid <= 0 {
		return 0
	}
	used := func(p string) (int64, bool) {
		size, free, ok := tmpfsSpace(fmt.Sprintf("/proc/%s/root%s", p, dir))
		return size - free, ok
	}
	if n, ok := used(strconv.Itoa(pid)); ok {
		return n
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if f := strings.Fields(string(b)); len(f) > 0 {
		if n, ok := used(f[0]); ok {
			return n
		}
	}
	return 0
}
