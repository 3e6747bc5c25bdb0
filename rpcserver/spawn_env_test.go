package rpcserver

import (
	"slices"
	"testing"

	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestWorkerEnvironKeepsPool: a worker inherits the thread pool's settings
// from the daemon, and not the daemon's other variables.
func TestWorkerEnvironKeepsPool(t *testing.T) {
	got := workerEnviron([]string{cpu.EnvThreads + "=3", cpu.EnvSpin + "=0", "KILN_TOKEN_FILE=/secret", "PATH=/bin"})
	slices.Sort(got)
	check.Equal(t, got, []string{cpu.EnvThreads + "=3", cpu.EnvSpin + "=0", "PATH=/bin"})
}
