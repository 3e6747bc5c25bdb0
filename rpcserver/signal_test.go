package rpcserver

import (
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

func TestTailMarks(t *testing.T) {
	tl := newTail(3)
	tl.Write([]byte("starting\nfatal error: unexpected signal during runtime execution\n[signal SIGSEGV: segmentation violation code=0x1 addr=0x0 pc=0x7f00]\n"))
	for range 10 {
		tl.Write([]byte("goroutine 1 [running]:\n"))
	}
	tl.Write([]byte("partial"))
	check.Equal(t, tl.Lines(), []string{"goroutine 1 [running]:", "goroutine 1 [running]:", "goroutine 1 [running]:", "partial"})
	check.Equal(t, len(tl.Marks()), 2, tl.Marks())
}

func TestExitReason(t *testing.T) {
	goFatal := []string{"fatal error: unexpected signal during runtime execution", "[signal SIGSEGV: segmentation violation code=0x1 addr=0x0 pc=0x7f00]"}
	tests := []struct {
		name    string
		script  string
		marks   []string
		want    string
		crashed bool
	}{
		{"killed", "kill -KILL $$", nil, "killed by signal SIGKILL (killed)", true},
		{"segv by the kernel", "kill -SEGV $$", nil, "killed by signal SIGSEGV (segmentation fault)", true},
		{"go fatal signal", "exit 2", goFatal, "signal SIGSEGV (segmentation violation)", true},
		{"go async signal", "exit 2", []string{"SIGABRT: abort"}, "signal SIGABRT (abort)", true},
		{"panic", "exit 2", []string{"panic: boom"}, "exited with status 2 (panic: boom)", true},
		{"status", "exit 3", nil, "exited with status 3", true},
		{"clean", "exit 0", nil, "exited", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("/bin/sh", "-c", tc.script)
			cmd.Run()
			got, crashed := exitReason(cmd.ProcessState, tc.marks)
			check.Equal(t, got, tc.want)
			check.Equal(t, crashed, tc.crashed)
		})
	}
	check.True(t, strings.HasPrefix(signalName(syscall.Signal(64)), "signal 64"), signalName(syscall.Signal(64)))
}
