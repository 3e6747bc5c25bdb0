package cli

import (
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestRPCServerThreads: --threads takes a positive thread count.
func TestRPCServerThreads(t *testing.T) {
	dir := t.TempDir()
	_, _, err := runApp(t, "rpcserver", "--key", "cpu", "--listen", "127.0.0.1:0", "--dir", dir, "--threads", "-2")
	check.Error(t, err, "--threads -2: want a thread count of at least 1")
}
