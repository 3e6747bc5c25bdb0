//go:build !linux

package rpcserver

// replace moves the finished upload tmp to host, atomically for readers.
func (s *sandbox) replace(tmp, host string) error { return s.root.Rename(tmp, host) }
