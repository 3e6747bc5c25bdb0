package rpcserver_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver"
)

// unprivilegedEnv marks a run of this test binary that a root test
// started as an unprivileged uid, to run a test as that uid.
const unprivilegedEnv = "KILN_RPCSERVER_TEST_UNPRIVILEGED"

// TestUnsandboxedKernelWritesCapped: on a daemon that does not sandbox
// its sessions, a kernel writes 64 MiB into its session directory and a
// subdirectory under a 20 MB --max-session-bytes: each write stops at
// the cap (ENOSPC), the host's disk never holds the bytes, the uploads
// stay read-only to the kernel, and a kernel that fails on the refused
// write gets a session error naming --max-session-bytes. As root the
// test runs once as root and once as an unprivileged uid (a daemon of
// that user, whose worker mounts in a user namespace of its own).
func TestUnsandboxedKernelWritesCapped(t *testing.T) {
	if os.Getenv(unprivilegedEnv) == "" && os.Geteuid() == 0 {
		t.Run("unprivileged", func(t *testing.T) { runUnprivileged(t, "TestUnsandboxedKernelWritesCapped") })
	}
	const quota = 20 << 20
	cfg := rpcserver.Config{Sandbox: rpcserver.SandboxOff, SessionQuota: quota}
	probe := cfg
	probe.Listen, probe.Dir = "127.0.0.1:0", t.TempDir()
	if _, err := rpcserver.New(probe); err != nil {
		// Where no mount namespace can be made (a container without
		// CAP_SYS_ADMIN, user namespaces forbidden), the cap is refused,
		// saying what it would and would not cap.
		check.Error(t, err, "--max-session-bytes", "cannot cap what kernels write", "would cap only uploads")
		t.Skipf("this machine does not let user %d cap a session directory: %v", os.Geteuid(), err)
	}
	td := startDaemon(t, cfg)
	check.True(t, strings.Contains(td.logs.String(), "session_write_cap="), "the start log says the write cap", td.logs.String())
	check.True(t, strings.Contains(td.metrics(t), "kiln_rpcserver_session_write_cap_bytes 2.097152e+07\n"), "/metrics says the write cap", td.metrics(t))
	s := td.connect(t, client.SessionOptions{})
	mod := loadKernels(t, s)
	checkWritesCapped(t, td, s, mod, quota, "scratch.bin", "modules/more.bin")

	// The daemon's own view is the host's: uploads still land there, and
	// no tmpfs of the session's is mounted in the daemon's namespace.
	check.NoError(t, s.Upload(testCtx(t), "after.bin", []byte("after")))
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	check.NoError(t, err)
	check.True(t, !strings.Contains(string(mounts), td.dir), "the session's tmpfs is not the daemon's", string(mounts))
}

// runUnprivileged runs test of this binary as uid 65534 (nobody), from a
// copy of the binary that uid can run, and passes when that run passes;
// it skips when that run skips, saying why.
func runUnprivileged(t *testing.T, test string) { runUnprivilegedIn(t, test, nil) }

// runUnprivilegedIn is runUnprivileged in the cgroups whose cgroup.procs
// files are procs (delegated to uid 65534), which it joins before it
// drops to that uid.
func runUnprivilegedIn(t *testing.T, test string, procs []string) {
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("the setpriv command (util-linux) is not installed: cannot run the test as an unprivileged uid")
	}
	shared, exe := sharedBinary(t)
	home := filepath.Join(shared, "home")
	check.NoError(t, os.Mkdir(home, 0o700))
	check.NoError(t, os.Chown(home, 65534, 65534))
	argv := []string{setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--",
		exe, "-test.run=^" + test + "$", "-test.v", "-test.count=1"}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "TMPDIR=" + home, unprivilegedEnv + "=1"}
	if len(procs) > 0 {
		const join = `n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done; exec "$@"`
		argv = append(append([]string{"/bin/sh", "-c", join, "join", strconv.Itoa(len(procs))}, procs...), argv...)
		env = append(env, delegatedEnv+"=1")
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = home
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	t.Logf("as uid 65534:\n%s", out)
	switch {
	case strings.Contains(string(out), "--- SKIP: "+test):
		t.Skip("the run as uid 65534 skipped")
	case err != nil:
		t.Fatalf("the run as uid 65534 failed: %v", err)
	}
	check.True(t, strings.Contains(string(out), "--- PASS: "+test), "the run as uid 65534 passed")
}
