package cli

import (
	"context"
	"path/filepath"
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
