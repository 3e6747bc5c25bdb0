package proto

import (
	"fmt"
	"log/slog"
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

// streamWindow is yamux's per-stream receive window: large enough that a
// bulk stream keeps loopback and LAN links full.
var streamWindow uint32 = 16 << 20

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
