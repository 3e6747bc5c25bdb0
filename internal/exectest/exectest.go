// Package exectest runs commands for tests under a time limit, and says
// so when the limit, not the command, ended one: "timed out after 10m0.4s
// (limit 10m0s)" rather than the "signal: killed" of a command killed by
// its context. It imports only the standard library.
package exectest

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// deadlineMargin is what a limit cut to the test binary's deadline leaves
// before it: time for the test to fail with its own message and clean up,
// rather than be ended by go test's panic.
const deadlineMargin = 30 * time.Second

// ErrTimedOut is wrapped by the error of a command that ran out of time.
var ErrTimedOut = errors.New("timed out")

// Run runs cmd (not started yet) until it exits or limit passes, and
// returns its error. The command runs in a process group of its own, and
// at the limit the whole group is killed, so that what it started (a
// compiler under a script) does not keep its output open; the error then
// wraps ErrTimedOut and says how long the command ran and the limit. A
// limit that would end after the test binary's deadline (go test
// -timeout) is cut to end before it, and the error says so.
func Run(t testing.TB, limit time.Duration, cmd *exec.Cmd) error {
	t.Helper()
	limit, why := cut(t, limit)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if cmd.WaitDelay == 0 {
		// A program that left the group (a daemon) may still hold the
		// output open after the group is gone.
		cmd.WaitDelay = 10 * time.Second
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", name(cmd), err)
	}
	var timedOut atomic.Bool
	timer := time.AfterFunc(limit, func() {
		timedOut.Store(true)
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	})
	err := cmd.Wait()
	timer.Stop()
	if timedOut.Load() {
		return fmt.Errorf("%s: %w after %s (limit %s%s)", name(cmd), ErrTimedOut, time.Since(start).Round(100*time.Millisecond), limit, why)
	}
	if err != nil {
		return fmt.Errorf("%s: %w (after %s)", name(cmd), err, time.Since(start).Round(100*time.Millisecond))
	}
	return nil
}

// CombinedOutput is Run with the command's standard output and error
// collected into one buffer, returned also when it fails.
func CombinedOutput(t testing.TB, limit time.Duration, cmd *exec.Cmd) ([]byte, error) {
	t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := Run(t, limit, cmd)
	return out.Bytes(), err
}

// cut shortens limit to end deadlineMargin before the test's deadline,
// saying why when it does.
func cut(t testing.TB, limit time.Duration) (time.Duration, string) {
	d, ok := t.(interface{ Deadline() (time.Time, bool) })
	if !ok {
		return limit, ""
	}
	end, ok := d.Deadline()
	if !ok {
		return limit, ""
	}
	if left := time.Until(end) - deadlineMargin; left < limit {
		return max(left, time.Second), ", cut to end before the test binary's -timeout"
	}
	return limit, ""
}

// name is the command as a test log shows it: its arguments, shortened.
func name(cmd *exec.Cmd) string {
	s := strings.Join(cmd.Args, " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}
