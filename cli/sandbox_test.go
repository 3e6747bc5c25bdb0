package cli

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler/toolchain"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/tracker"
)

// TestSharedBoardTwoUsers: `kiln rpcserver --max-sessions 2` on one board,
// sandboxed (no --insecure-shared needed), with a uid per session where the
// test runs as root. Two users' kernels each try to read the other's
// uploaded file and the daemon's token file, to rewrite the other's file,
// to kill the other's processes, and to leave a process behind when their
// session ends; none of it succeeds.
//
// In "leased", the board is registered with a tracker that holds a users
// file with alice and bob: each gets their own lease on the board with
// their own tracker token (the tracker grants the sandboxed board's two
// sessions at once) and opens their session with that lease alone, never
// the board's token.
func TestSharedBoardTwoUsers(t *testing.T) {
	t.Run("token", func(t *testing.T) { sharedBoardTwoUsers(t, false) })
	t.Run("leased", func(t *testing.T) { sharedBoardTwoUsers(t, true) })
}

func sharedBoardTwoUsers(t *testing.T, leased bool) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Skip("bubblewrap (bwrap) is not installed; .ci/run installs it (Debian: apt-get install bubblewrap)")
	}
	art := attackKernels(t)
	// The daemon's binary and session root where worker uids can reach them.
	shared, err := os.MkdirTemp("", "kiln-board-")
	check.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(shared) })
	check.NoError(t, os.Chmod(shared, 0o755))
	exe, err := os.Executable()
	check.NoError(t, err)
	kiln := filepath.Join(shared, "kiln")
	copyExecutable(t, exe, kiln)
	secret := t.TempDir()
	tokFile := filepath.Join(secret, "token")
	check.NoError(t, os.WriteFile(tokFile, []byte("shared-board-token\n"), 0o600))

	args := []string{"rpcserver", "--key", "cpu", "--listen", "127.0.0.1:0", "--dir", filepath.Join(shared, "sessions"),
		"--token-file", tokFile, "--max-sessions", "2", "--sandbox", "bwrap", "--max-session-memory", "2GiB"}
	if os.Geteuid() == 0 {
		args = append(args, "--worker-uids", "61201-61202")
	}
	userToken := map[string]string{}
	var trackerAddr string
	if leased {
		users := filepath.Join(secret, "users")
		for _, name := range []string{"alice", "bob"} {
			userToken[name], err = tracker.CreateUserToken(users, name, "client")
			check.NoError(t, err)
		}
		tr := startProcPath(t, "tracker", kiln, nil, "tracker", "--listen", "127.0.0.1:0", "--data", filepath.Join(secret, "tracker"),
			"--token-file", tokFile, "--users-file", users)
		trackerAddr = tr.addr(t)
		args = append(args, "--tracker", trackerAddr)
	}
	p := startProcPath(t, "daemon", kiln, nil, args...)
	addr := p.addr(t)
	check.True(t, strings.Contains(p.out.String(), "sessions are sandboxed with bubblewrap"), p.out.String())

	ctx, cancel := context.WithTimeout(context.Background(), procGuard)
	defer cancel()
	type user struct {
		name string
		s    *client.Session
		mod  *client.Module
		file string
		pids []int
	}
	var users []*user
	for _, name := range []string{"alice", "bob"} {
		opts := client.SessionOptions{Token: "shared-board-token"}
		if leased {
			// The user's own tracker token gets a lease; the lease alone
			// opens the session.
			tc, err := client.DialTracker(ctx, trackerAddr, client.TrackerOptions{Token: userToken[name]})
			check.NoError(t, err, name)
			t.Cleanup(func() { tc.Close() })
			l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "cpu"})
			check.NoError(t, err, name)
			check.Equal(t, l.Addr, addr)
			opts = client.SessionOptions{LeaseToken: l.Token}
		}
		s, err := client.Connect(ctx, addr, opts)
		check.NoError(t, err, name)
		t.Cleanup(func() { s.Close() })
		check.NoError(t, s.Upload(ctx, "attack.kiln", art))
		mod, err := s.LoadModule(ctx, "attack.kiln")
		check.NoError(t, err)
		check.NoError(t, s.Upload(ctx, "secret", []byte(name+"'s weights")))
		dirs, err := filepath.Glob(filepath.Join(shared, "sessions", "session-"+s.Info().ID+"-*"))
		check.NoError(t, err)
		check.Equal(t, len(dirs), 1)
		pid := s.Info().WorkerPID
		users = append(users, &user{name: name, s: s, mod: mod, file: filepath.Join(dirs[0], "files", "secret"),
			pids: append([]int{pid}, processesBelow(pid)...)})
	}
	for i, u := range users {
		other := users[1-i]
		intrude, err := u.mod.GetFunction(ctx, "intrude")
		check.NoError(t, err)
		for _, path := range []string{other.file, tokFile} {
			for _, pid := range other.pids {
				got := intrudeCall(t, ctx, u.s, intrude, path, pid)
				check.True(t, got[0] < 0 && got[1] < 0 && got[2] < 0,
					fmt.Sprintf("%s's kernel against %s (read %d, write %d, kill %d)", u.name, path, got[0], got[1], got[2]))
			}
		}
		b, err := os.ReadFile(other.file)
		check.NoError(t, err)
		check.Equal(t, string(b), other.name+"'s weights")
	}

	// Bob leaves a double-forked child and goes: nothing of his stays.
	bob := users[1]
	orphan, err := bob.mod.GetFunction(ctx, "orphan")
	check.NoError(t, err)
	out, err := bob.s.Empty(ctx, ndarray.Shape{1}, ndarray.Int64, devices.CPUDevice)
	check.NoError(t, err)
	_, err = bob.s.Call(ctx, orphan, out, int64(10*procGuard/time.Millisecond))
	check.NoError(t, err)
	left := append([]int{bob.s.Info().WorkerPID}, processesBelow(bob.s.Info().WorkerPID)...)
	check.True(t, len(left) >= 3, "bob's sandbox, worker and grandchild", left)
	t.Cleanup(func() {
		for _, q := range left {
			syscall.Kill(q, syscall.SIGKILL)
		}
	})
	check.NoError(t, bob.s.Close())
	eventually(t, "every process of bob's session is gone", func() bool {
		for _, q := range left {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d/status", q)); err == nil && !zombie(q) {
				return false
			}
		}
		return true
	})
	nop, err := users[0].mod.GetFunction(ctx, "nop")
	check.NoError(t, err)
	_, err = nop.Call(ctx)
	check.NoError(t, err, "alice's session after bob left")
	if leased {
		// The board's log names each session's user, from their lease.
		for _, name := range []string{"alice", "bob"} {
			check.True(t, strings.Contains(p.out.String(), "user="+name), "the daemon's log does not name "+name+":\n"+p.out.String())
		}
	}
}

// attackKernels builds the device daemon's test kernels (they include
// intrude and orphan) into a .kiln artifact.
func attackKernels(t *testing.T) []byte {
	t.Helper()
	src, err := os.ReadFile("../rpcserver/testdata/kernels.c")
	check.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), procGuard)
	defer cancel()
	tc, err := toolchain.Find(ctx, toolchain.Options{Flags: []string{"-O1"}})
	if err != nil {
		t.Skipf("no C toolchain to build the test kernels: %v", err)
	}
	so := filepath.Join(t.TempDir(), "kernels.so")
	check.NoError(t, tc.BuildShared(ctx, []toolchain.Source{{Name: "kernels.c", Text: string(src)}}, so, ""))
	b, err := os.ReadFile(so)
	check.NoError(t, err)
	a := artifact.New("c", tc.Identity())
	check.NoError(t, a.Add(artifact.HostLib, b))
	art, err := a.Bytes()
	check.NoError(t, err)
	return art
}

func copyExecutable(t *testing.T, from, to string) {
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

// intrudeCall runs the intrude kernel against path and pid: bytes read,
// bytes written and the signal's result, each -errno when refused.
func intrudeCall(t *testing.T, ctx context.Context, s *client.Session, f *client.Func, path string, pid int) [3]int64 {
	t.Helper()
	p := append([]byte(path), 0)
	pa, err := s.Empty(ctx, ndarray.Shape{int64(len(p))}, ndarray.Uint8, devices.CPUDevice)
	check.NoError(t, err)
	check.NoError(t, pa.CopyFromBytes(ctx, p))
	out, err := s.Empty(ctx, ndarray.Shape{3}, ndarray.Int64, devices.CPUDevice)
	check.NoError(t, err)
	_, err = s.Call(ctx, f, pa, int64(pid), out)
	check.NoError(t, err)
	b, err := out.ReadBytes(ctx)
	check.NoError(t, err)
	var got [3]int64
	for i := range got {
		got[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return got
}

// processesBelow lists the processes descending from pid.
func processesBelow(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	for _, e := range ents {
		q, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", q))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 {
			parent[q], _ = strconv.Atoi(f[1])
		}
	}
	var out []int
	for q := range parent {
		for r := parent[q]; r > 1; r = parent[r] {
			if r == pid {
				out = append(out, q)
				break
			}
		}
	}
	return out
}

// zombie says whether process pid has exited and waits to be reaped.
func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}
