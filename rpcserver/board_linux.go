package rpcserver

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// newBoard makes a call board in a memfd: the daemon's mapping and the
// file to pass to the worker.
func newBoard() (*board, *os.File, error) {
	fd, err := unix.MemfdCreate("kiln-call-board", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, nil, fmt.Errorf("call board: %w", err)
	}
	f := os.NewFile(uintptr(fd), "call-board")
	if err := f.Truncate(boardSize); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("call board: %w", err)
	}
	b, err := mapBoard(f)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return b, f, nil
}

// mapBoard maps a call board file shared.
func mapBoard(f *os.File) (*board, error) {
	mem, err := unix.Mmap(int(f.Fd()), 0, boardSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map call board: %w", err)
	}
	return &board{mem: mem}, nil
}

// unmap releases the daemon's mapping.
func (b *board) unmap() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.gone {
		b.gone = true
		unix.Munmap(b.mem)
	}
}
