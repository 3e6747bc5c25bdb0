package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestOpenBeyondLoopback: a device daemon or a tracker bound to every
// address with neither a token nor mutual TLS refuses to start, naming the
// ways out; with --insecure it starts and says so.
func TestOpenBeyondLoopback(t *testing.T) {
	dir := t.TempDir()
	_, _, err := runApp(t, "rpcserver", "--key", "cpu", "--listen", "0.0.0.0:0", "--dir", filepath.Join(dir, "d"))
	check.ErrorIs(t, err, proto.ErrExposed)
	check.True(t, strings.Contains(err.Error(), "--token-file") && strings.Contains(err.Error(), "--insecure"), err)
	_, _, err = runApp(t, "tracker", "--listen", "0.0.0.0:0", "--data", filepath.Join(dir, "t"))
	check.ErrorIs(t, err, proto.ErrExposed)

	p := startProc(t, "insecure daemon", "rpcserver", "--key", "cpu", "--listen", "0.0.0.0:0", "--dir", filepath.Join(dir, "d2"), "--insecure")
	eventually(t, "the insecure daemon listens and warns", func() bool {
		out := p.out.String()
		return strings.Contains(out, "listening on") && strings.Contains(out, "INSECURE")
	})
}

// TestSessionDiskQuota: an upload past --max-session-bytes is refused,
// naming the limit and the flag, and leaves nothing behind.
func TestSessionDiskQuota(t *testing.T) {
	dir := t.TempDir()
	p := startProc(t, "daemon", "rpcserver", "--key", "cpu", "--listen", "127.0.0.1:0", "--dir", filepath.Join(dir, "d"),
		"--max-session-bytes", "4096")
	ctx, cancel := context.WithTimeout(context.Background(), procGuard)
	defer cancel()
	s, err := client.Connect(ctx, p.addr(t), client.SessionOptions{})
	check.NoError(t, err)
	defer s.Close()
	check.NoError(t, s.Upload(ctx, "small.bin", make([]byte, 1000)))
	err = s.Upload(ctx, "big.bin", make([]byte, 8192))
	check.ErrorIs(t, err, proto.ErrQuota)
	check.True(t, strings.Contains(err.Error(), "--max-session-bytes") && strings.Contains(err.Error(), "4096"), err)
	files, err := s.List(ctx)
	check.NoError(t, err)
	check.Equal(t, len(files), 1, "files after the refused upload:", files)
}

// TestWorkerFailsToStart: a worker that cannot start (a wrapper that exits
// at once, a wrapper that does not exist) fails that session with an
// error naming the command; the daemon still serves the next session and
// still stops on SIGTERM.
func TestWorkerFailsToStart(t *testing.T) {
	for _, tc := range []struct{ name, wrapper, want string }{
		{"wrapper exits", "false", "false"},
		{"wrapper missing", "/nonexistent/wrapper --flag", "/nonexistent/wrapper"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := startProc(t, "daemon", "rpcserver", "--key", "cpu", "--listen", "127.0.0.1:0", "--dir", filepath.Join(dir, "d"),
				"--worker-wrapper", tc.wrapper)
			addr := p.addr(t)
			ctx, cancel := context.WithTimeout(context.Background(), procGuard)
			defer cancel()
			for range 2 { // the second session must fail the same way, not hang
				_, err := client.Connect(ctx, addr, client.SessionOptions{})
				check.True(t, err != nil, "a session with a broken worker opened")
				check.True(t, strings.Contains(err.Error(), "start worker") && strings.Contains(err.Error(), tc.want), err)
			}
			p.stop(t)
			check.True(t, !p.alive(), "the daemon did not stop on SIGTERM")
		})
	}
	t.Run("worker for another architecture", func(t *testing.T) {
		cc, err := exec.LookPath("aarch64-linux-gnu-gcc")
		if err != nil || runtime.GOARCH == "arm64" {
			t.Skip("needs aarch64-linux-gnu-gcc on a non-arm64 machine to make a binary this one cannot exec")
		}
		dir := t.TempDir()
		foreign := filepath.Join(dir, "foreign")
		cmd := exec.Command(cc, "-x", "c", "-o", foreign, "-")
		cmd.Stdin = strings.NewReader("int main(void) { return 0; }\n")
		out, err := cmd.CombinedOutput()
		check.NoError(t, err, string(out))
		p := startProc(t, "daemon", "rpcserver", "--key", "cpu", "--listen", "127.0.0.1:0", "--dir", filepath.Join(dir, "d"),
			"--worker-wrapper", foreign)
		ctx, cancel := context.WithTimeout(context.Background(), procGuard)
		defer cancel()
		_, err = client.Connect(ctx, p.addr(t), client.SessionOptions{})
		check.True(t, err != nil && strings.Contains(err.Error(), "exec format error"), err)
		p.stop(t)
		check.True(t, !p.alive(), "the daemon did not stop on SIGTERM")
	})
	t.Run("wrapper runs the worker", func(t *testing.T) {
		dir := t.TempDir()
		p := startProc(t, "daemon", "rpcserver", "--key", "cpu", "--listen", "127.0.0.1:0", "--dir", filepath.Join(dir, "d"),
			"--worker-wrapper", "env KILN_WRAPPED=1")
		ctx, cancel := context.WithTimeout(context.Background(), procGuard)
		defer cancel()
		s, err := client.Connect(ctx, p.addr(t), client.SessionOptions{})
		check.NoError(t, err)
		check.NoError(t, s.Upload(ctx, "x.bin", []byte("x")))
		s.Close()
	})
}

// TestWorkerEnvironment: a session's worker, where uploaded kernels run,
// does not inherit the daemon's secrets: the token file's path and other
// variables stay with the daemon.
func TestWorkerEnvironment(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads the worker's environment from /proc")
	}
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	check.NoError(t, os.WriteFile(tok, []byte("s3cret"), 0o600))
	p := startProcEnv(t, "daemon", []string{"KILN_TOKEN_FILE=" + tok, "AWS_SECRET_ACCESS_KEY=hunter2"},
		"rpcserver", "--key", "cpu", "--listen", "127.0.0.1:0", "--dir", filepath.Join(dir, "d"))
	ctx, cancel := context.WithTimeout(context.Background(), procGuard)
	defer cancel()
	s, err := client.Connect(ctx, p.addr(t), client.SessionOptions{Token: "s3cret"})
	check.NoError(t, err)
	defer s.Close()
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", s.Info().WorkerPID))
	check.NoError(t, err)
	for _, secret := range []string{"KILN_TOKEN_FILE", "hunter2", tok} {
		check.True(t, !strings.Contains(string(env), secret), "the worker's environment holds", secret)
	}
	check.True(t, strings.Contains(string(env), "PATH="), "the worker has no PATH")
}
