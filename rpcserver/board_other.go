//go:build !linux

package rpcserver

import (
	"errors"
	"os"
)

// newBoard: call boards need memfd (Linux); elsewhere the daemon stays on
// the call path and describes crashed calls itself.
func newBoard() (*board, *os.File, error) {
	return nil, nil, errors.New("call board: not supported on this system")
}

func mapBoard(*os.File) (*board, error) {
	return nil, errors.New("call board: not supported on this system")
}

func (b *board) unmap() {}
