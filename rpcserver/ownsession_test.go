package rpcserver_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver"
)

// TestWorkerOwnSession: a worker leads a process group of its own, and
// with WorkerSpec.OwnSession a session of its own too (where Linux's
// autogroup shares the CPU by session, a pinned worker then competes as
// a daemon started on its own would); without it, it stays in the
// daemon's session.
func TestWorkerOwnSession(t *testing.T) {
	for _, own := range []bool{false, true} {
		t.Run(fmt.Sprint("own=", own), func(t *testing.T) {
			before := childProcs(t)
			td := startDaemon(t, rpcserver.Config{Sandbox: rpcserver.SandboxOff, Worker: rpcserver.WorkerSpec{OwnSession: own}})
			s := td.connect(t, client.SessionOptions{})
			_, err := s.DeviceAttrs(testCtx(t)) // the worker serves
			check.NoError(t, err)
			var pid int
			for p := range childProcs(t) {
				if !before[p] {
					pid = p
				}
			}
			check.True(t, pid > 0, "no worker process found")
			pgid, err := unix.Getpgid(pid)
			check.NoError(t, err)
			check.Equal(t, pgid, pid)
			sid, err := unix.Getsid(pid)
			check.NoError(t, err)
			mine, err := unix.Getsid(0)
			check.NoError(t, err)
			if own {
				check.Equal(t, sid, pid)
			} else {
				check.Equal(t, sid, mine)
			}
			check.NoError(t, s.Close())
		})
	}
}

// childProcs returns the running child processes of this test process.
func childProcs(t *testing.T) map[int]bool {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	check.NoError(t, err)
	out := map[int]bool{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(os.Getpid()) && f[0] != "Z" {
			out[pid] = true
		}
	}
	return out
}
