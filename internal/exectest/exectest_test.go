package exectest

import (
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestRunTimesOut: a command past its limit is killed with what it
// started, and the error says it timed out, after how long and the limit.
func TestRunTimesOut(t *testing.T) {
	out, err := CombinedOutput(t, 300*time.Millisecond, exec.Command("sh", "-c", "sleep 60 & echo $!; wait"))
	check.Error(t, err, "sh -c sleep 60", "timed out after ", "(limit 300ms)")
	check.True(t, errors.Is(err, ErrTimedOut), err)
	pid, perr := strconv.Atoi(strings.TrimSpace(string(out)))
	check.NoError(t, perr, "the child's pid:", string(out))
	gone := false
	for i := 0; i < 200 && !gone; i++ {
		gone = syscall.Kill(pid, 0) == syscall.ESRCH
		if !gone {
			time.Sleep(50 * time.Millisecond)
		}
	}
	check.True(t, gone, "the command's child", pid, "was killed with it")
}

// TestRunFails: a command that fails by itself keeps its own error.
func TestRunFails(t *testing.T) {
	out, err := CombinedOutput(t, time.Minute, exec.Command("sh", "-c", "echo no; exit 3"))
	check.Error(t, err, "exit status 3")
	check.True(t, !errors.Is(err, ErrTimedOut), err)
	check.Equal(t, string(out), "no\n")
	check.NoError(t, Run(t, time.Minute, exec.Command("true")))
}
