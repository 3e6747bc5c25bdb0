package rpcserver

import "syscall"

// workerSysProcAttr puts a worker in a process group of its own (a Ctrl-C
// at the daemon's terminal reaches the daemon, which ends its sessions in
// order) and kills it if the daemon dies.
func workerSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
