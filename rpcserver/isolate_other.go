//go:build !linux

package rpcserver

import (
	"errors"
	"syscall"
)

// capMountArgs is nothing here: there is no session mounter.
func capMountArgs(mounter string, capBytes int64, dir string) []string { return nil }

// capMountAttr does nothing here.
func capMountAttr(attr *syscall.SysProcAttr) {}

// probeCapMount fails here: mount namespaces are Linux's.
func probeCapMount(mounter, parent string) error {
	return errors.New("a mount namespace of the worker's own needs Linux")
}

// tmpfsSpace says no here: session directories are capped on Linux only.
func tmpfsSpace(dir string) (size, free int64, ok bool) { return 0, 0, false }

// sessionTmpfsUsed is 0 here: there are no capped session directories.
func sessionTmpfsUsed(pid int, dir string) int64 { return 0 }
