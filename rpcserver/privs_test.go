package rpcserver_test

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver"
)

// TestRootSandboxPrivileges: a daemon run as root without --worker-uids
// (root's default) still sandboxes its workers as an unprivileged uid,
// with no capabilities and no_new_privs, and a kernel cannot write the
// host's sysctls. The kernel writes a sysctl's own value back, so the host
// is unchanged whether or not the write is refused.
func TestRootSandboxPrivileges(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the attack is on a daemon run as root")
	}
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Skip("bubblewrap (bwrap) is not installed; .ci/run installs it (Debian: apt-get install bubblewrap)")
	}
	// The worker binary and the session root where an unprivileged uid
	// reaches them.
	shared, exe := sharedBinary(t)
	cfg := rpcserver.Config{Token: "board-token", Sandbox: rpcserver.SandboxBwrap, Dir: filepath.Join(shared, "sessions")}
	cfg.Worker.Path = exe
	td := startDaemon(t, cfg)
	m := td.metrics(t)
	check.True(t, strings.Contains(m, "kiln_rpcserver_sandboxed 1\n"), m)

	ctx := testCtx(t)
	s := td.connect(t, client.SessionOptions{Token: "board-token"})
	mod := loadKernels(t, s)
	privs, err := mod.GetFunction(ctx, "privs")
	check.NoError(t, err)
	out, err := s.Empty(ctx, ndarray.Shape{4}, ndarray.Int64, devices.CPUDevice)
	check.NoError(t, err)
	_, err = s.Call(ctx, privs, out)
	check.NoError(t, err)
	b, err := out.ReadBytes(ctx)
	check.NoError(t, err)
	var got [4]int64
	for i := range got {
		got[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	t.Logf("kernel: CapEff %#x, NoNewPrivs %d, sysctl write %d, uid 0 maps to %d", got[0], got[1], got[2], got[3])
	check.Equal(t, got[0], int64(0), "the kernel's effective capabilities")
	check.Equal(t, got[1], int64(1), "the kernel's no_new_privs")
	check.True(t, got[2] == -int64(syscall.EACCES) || got[2] == -int64(syscall.EROFS) || got[2] == -int64(syscall.EPERM),
		"the kernel wrote kernel.printk_ratelimit_burst (result", got[2], ")")
	check.True(t, got[3] != 0, "the sandbox's uid 0 is the host's root")
	uids := workerUIDs(t, s)
	check.True(t, len(uids) == 1 && uids[0] != 0, "the worker runs as an unprivileged uid of its own", uids)
}
