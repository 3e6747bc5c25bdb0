package rpcserver

import (
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// workerSysProcAttr puts a worker in a process group of its own (a Ctrl-C
// at the daemon's terminal reaches the daemon, which ends its sessions in
// order) and kills it if the daemon dies.
func workerSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// closeOnExec marks every descriptor of the daemon's process but stdin,
// stdout and stderr close-on-exec: descriptors the daemon inherited from
// whoever started it, or that C libraries opened without the flag, must
// not reach a worker, which gets only the connections handed to it.
func closeOnExec() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}

// waitThenKillGroup waits until the worker pid has exited without reaping
// it, then kills what is left of its process group (what its kernels
// forked): while the worker is not reaped its pid, and so its group id,
// cannot name another process.
func waitThenKillGroup(pid int) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			break
		}
	}
	syscall.Kill(-pid, syscall.SIGKILL)
}
