package cli

import (
	"path/filepath"
	"strings"
	"testing"

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
