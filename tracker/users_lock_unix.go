//go:build unix

package tracker

import (
	"fmt"
	"os"
	"syscall"
)

// lockUsersFile holds an exclusive lock on the users file at path until
// unlock is called, so that edits from several processes (kiln token
// commands run at once) do not overwrite one another. The lock is taken
// on a file beside it, PATH.lock, since an edit replaces the users file
// itself by renaming.
func lockUsersFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("users file lock: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("users file lock %s: %w", f.Name(), err)
	}
	return func() { f.Close() }, nil // closing the file releases the lock
}
