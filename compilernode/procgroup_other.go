//go:build !unix

package compilernode

import "os/exec"

// ownGroup leaves cmd as it is: without process groups only the job
// process itself is killed at its time limit.
func ownGroup(cmd *exec.Cmd) {}
