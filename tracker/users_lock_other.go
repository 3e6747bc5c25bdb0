//go:build !unix

package tracker

import "sync"

var usersFileMu sync.Mutex

// lockUsersFile serializes the edits of the users file within this
// process; the system offers no advisory file lock here.
func lockUsersFile(path string) (unlock func(), err error) {
	usersFileMu.Lock()
	return usersFileMu.Unlock, nil
}
