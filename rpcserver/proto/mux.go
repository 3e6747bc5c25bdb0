package proto

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/hashicorp/yamux"
)

// DefaultHandshakeTimeout bounds a hello exchange (and the opening of the
// control stream) unless configured otherwise.
const DefaultHandshakeTimeout = 10 * time.Second

// DefaultKeepAlive is how often yamux pings an idle peer, so that a peer that
// vanished without closing its socket is noticed.
const DefaultKeepAlive = 15 * time.Second

// streamWindow is yamux's per-stream receive window. It is small on
// purpose: yamux buffers a stream's unread data in a bytes.Buffer of its
// own that grows (allocating and faulting in fresh memory) up to about
// twice the window, anew for every stream, and on loopback that costs more
// than the window gains. 64 MiB uploads to a device daemon on loopback (go
// run ./bench upload, 2 shared cores at load 2-3) moved 0.72-0.98 GB/s
// with 512 KiB, 0.72-0.79 with 1 MiB and 0.38-0.57 with 16 MiB (5.4 MB
// allocated per upload at 1 MiB). 512 KiB still keeps a LAN full (10 Gb/s
// at 0.4 ms round trip); over a WAN it caps a stream at window/RTT
// (26 MB/s at 20 ms).
var streamWindow uint32 = 512 << 10

// copyBufSize is the buffer size for bulk copies.
const copyBufSize = 1 << 20

// muxConfig returns the yamux configuration both ends use.
func muxConfig(keepAlive time.Duration, log *slog.Logger) *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.MaxStreamWindowSize = streamWindow
	cfg.EnableKeepAlive = keepAlive > 0
	if keepAlive > 0 {
		cfg.KeepAliveInterval = keepAlive
	}
	cfg.LogOutput = nil
	cfg.Logger = yamuxLogger{log}
	return cfg
}

// yamuxLogger sends yamux's log lines to slog at debug level: yamux reports
// every ordinary disconnect as an error.
type yamuxLogger struct{ log *slog.Logger }

func (l yamuxLogger) Print(v ...any) { l.emit(fmt.Sprint(v...)) }

func (l yamuxLogger) Printf(format string, v ...any) { l.emit(fmt.Sprintf(format, v...)) }

func (l yamuxLogger) Println(v ...any) { l.emit(fmt.Sprintln(v...)) }

func (l yamuxLogger) emit(msg string) {
	l.log.Debug("yamux", "msg", strings.TrimSpace(msg))
}

// yamuxHeaderSize is the size of a yamux frame header: version, type,
// flags (2), stream id (4), length (4).
const yamuxHeaderSize = 12

// coalesceMax bounds the data frames coalescedConn coalesces: calls' small
// frames gain from one write; bulk data, whose frames are large, goes out
// as yamux writes it.
const coalesceMax = 4 << 10

// coalescedConn is the connection under a yamux session. yamux's send loop
// writes each data frame as two writes, header then body: two system calls
// and, on TCP, often two segments. For a small data frame coalescedConn
// holds the header and sends it with the body in one write (on 2 shared
// cores it cut the empty remote call's median by about 15%). The bytes on
// the wire are the same. Only yamux's send loop writes to it, so it needs
// no lock.
type coalescedConn struct {
	net.Conn
	hdr  [yamuxHeaderSize]byte
	held bool
	buf  []byte
}

// coalesce wraps nc for a yamux session.
func coalesce(nc net.Conn) net.Conn { return &coalescedConn{Conn: nc} }

func (c *coalescedConn) Write(p []byte) (int, error) {
	if c.held {
		c.held = false
		c.buf = append(append(c.buf[:0], c.hdr[:]...), p...)
		n, err := c.Conn.Write(c.buf)
		return max(n-yamuxHeaderSize, 0), err
	}
	// A small data frame (version 0, type 0): its body comes next.
	if len(p) == yamuxHeaderSize && p[0] == 0 && p[1] == 0 {
		if n := binary.BigEndian.Uint32(p[8:]); n > 0 && n <= coalesceMax {
			copy(c.hdr[:], p)
			c.held = true
			return len(p), nil
		}
	}
	return c.Conn.Write(p)
}
