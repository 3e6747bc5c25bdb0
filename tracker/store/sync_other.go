//go:build !linux

package store

import "os"

// fdatasync flushes f (a full fsync where the system has no fdatasync).
func fdatasync(f *os.File) error { return f.Sync() }
