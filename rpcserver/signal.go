package rpcserver

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
)

// signalNames names the signals a crashing kernel or an operator sends.
var signalNames = map[syscall.Signal]string{
	syscall.SIGABRT: "SIGABRT",
	syscall.SIGBUS:  "SIGBUS",
	syscall.SIGFPE:  "SIGFPE",
	syscall.SIGILL:  "SIGILL",
	syscall.SIGINT:  "SIGINT",
	syscall.SIGKILL: "SIGKILL",
	syscall.SIGPIPE: "SIGPIPE",
	syscall.SIGQUIT: "SIGQUIT",
	syscall.SIGSEGV: "SIGSEGV",
	syscall.SIGSYS:  "SIGSYS",
	syscall.SIGTERM: "SIGTERM",
	syscall.SIGTRAP: "SIGTRAP",
}

// signalName returns "SIGSEGV (segmentation fault)".
func signalName(sig syscall.Signal) string {
	name, ok := signalNames[sig]
	if !ok {
		name = fmt.Sprintf("signal %d", int(sig))
	}
	return name + " (" + sig.String() + ")"
}

// Go's runtime catches a fatal signal in C code, prints it and exits with
// status 2; these lines say which signal it was:
//
//	[signal SIGSEGV: segmentation violation code=0x1 addr=0x0 pc=0x7f…]
//	SIGABRT: abort
var (
	reSyncSignal  = regexp.MustCompile(`^\[signal (SIG[A-Z0-9]+): ([^\]]*?)(?: code=|\])`)
	reAsyncSignal = regexp.MustCompile(`^(SIG[A-Z0-9]+): (.+)$`)
)

// exitReason describes how a worker process ended, from its wait status
// and the tail of its stderr: "killed by signal SIGKILL (killed)",
// "signal SIGSEGV (segmentation violation)", "exited with status 3".
// crashed reports whether a signal ended it.
func exitReason(st *os.ProcessState, stderr []string) (reason string, crashed bool) {
	if st == nil {
		return "ended", true
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "killed by signal " + signalName(ws.Signal()), true
	}
	return exitReasonCode(st.ExitCode(), stderr, false)
}

// exitReasonCode is exitReason from an exit code. With shellStyle, a code
// above 128 says the process ran by a supervisor (bubblewrap) was killed by
// signal code-128.
func exitReasonCode(code int, stderr []string, shellStyle bool) (reason string, crashed bool) {
	for i := len(stderr) - 1; i >= 0; i-- {
		line := strings.TrimSpace(stderr[i])
		if m := reSyncSignal.FindStringSubmatch(line); m != nil {
			return "signal " + m[1] + " (" + m[2] + ")", true
		}
	}
	for i := len(stderr) - 1; i >= 0; i-- {
		line := strings.TrimSpace(stderr[i])
		if m := reAsyncSignal.FindStringSubmatch(line); m != nil {
			return "signal " + m[1] + " (" + m[2] + ")", true
		}
	}
	if code == 0 {
		return "exited", false
	}
	if shellStyle && code > 128 && code < 128+65 {
		return "killed by signal " + signalName(syscall.Signal(code-128)), true
	}
	for i := len(stderr) - 1; i >= 0; i-- {
		if line := strings.TrimSpace(stderr[i]); strings.HasPrefix(line, "fatal error: ") || strings.HasPrefix(line, "panic: ") {
			return fmt.Sprintf("exited with status %d (%s)", code, line), true
		}
	}
	return fmt.Sprintf("exited with status %d", code), true
}

// tail keeps the last lines written to it (a worker's stderr), and the
// first few lines that tell how a process died (Go's fatal signal and
// error lines), however long the traceback after them.
type tail struct {
	mu    sync.Mutex
	max   int
	lines []string
	marks []string
	part  []byte
}

func newTail(max int) *tail { return &tail{max: max} }

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.part = append(t.part, p...)
	for {
		i := strings.IndexByte(string(t.part), '\n')
		if i < 0 {
			break
		}
		t.add(string(t.part[:i]))
		t.part = t.part[i+1:]
	}
	if len(t.part) > 64<<10 {
		t.add(string(t.part))
		t.part = nil
	}
	return len(p), nil
}

func (t *tail) add(line string) {
	if len(t.marks) < 8 {
		l := strings.TrimSpace(line)
		if strings.HasPrefix(l, "[signal ") || strings.HasPrefix(l, "fatal error: ") ||
			strings.HasPrefix(l, "panic: ") || reAsyncSignal.MatchString(l) {
			t.marks = append(t.marks, l)
		}
	}
	t.lines = append(t.lines, line)
	if len(t.lines) > t.max {
		t.lines = t.lines[len(t.lines)-t.max:]
	}
}

// Marks returns the lines that tell how the process died.
func (t *tail) Marks() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.marks...)
}

// Lines returns the kept lines, with an unfinished last line.
func (t *tail) Lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := append([]string(nil), t.lines...)
	if len(t.part) > 0 {
		out = append(out, string(t.part))
	}
	return out
}
