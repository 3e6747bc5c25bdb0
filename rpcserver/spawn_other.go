//go:build !linux

package rpcserver

import "syscall"

// workerSysProcAttr puts a worker in a process group of its own.
func workerSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// closeOnExec does nothing here: Go opens every descriptor close-on-exec.
func closeOnExec() {}

// waitThenKillGroup does nothing here: the worker's exit is seen by Wait.
func waitThenKillGroup(pid int) {}
