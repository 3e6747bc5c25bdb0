// Package refusal bounds what refused peers cost a daemon: a Log says the
// first refusal of an interval in full and the others in one summary line,
// and a Limiter turns away, for a while, a peer that keeps failing to
// authenticate, before its hello costs a token check. It imports nothing
// of kiln.
package refusal

import (
	"log/slog"
	"sync"
	"time"
)

// DefaultInterval is a Log's and a Limiter's interval when given 0.
const DefaultInterval = 10 * time.Second

// maxPeers bounds the peers a Log or a Limiter remembers.
const maxPeers = 4096

// Log logs refusals of one kind (one message): the first of each interval
// in full, at Warn; those that follow within the interval are counted and
// said in one line when it ends. The zero value uses DefaultInterval.
type Log struct {
	// Interval is the length of an interval (DefaultInterval when 0).
	Interval time.Duration

	mu     sync.Mutex
	start  time.Time // of the current interval; zero before the first
	more   int       // refusals counted, not logged, in the interval
	peers  map[string]bool
	timer  *time.Timer
	log    *slog.Logger
	msg    string
	closed bool
}

// Note records one refusal of peer: it logs msg with args and peer when
// it is the interval's first.
func (l *Log) Note(log *slog.Logger, peer, msg string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	iv := l.interval()
	if l.start.IsZero() || now.Sub(l.start) >= iv {
		l.flushLocked()
		l.start, l.log, l.msg = now, log, msg
		log.Warn(msg, append(args, "peer", peer, "others_summarized_every", iv)...)
		return
	}
	l.more++
	if l.peers == nil {
		l.peers = map[string]bool{}
	}
	if len(l.peers) < maxPeers {
		l.peers[peer] = true
	}
	if l.timer == nil && !l.closed {
		l.timer = time.AfterFunc(iv-now.Sub(l.start), func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.timer = nil
			l.flushLocked()
			l.start = time.Time{}
		})
	}
}

func (l *Log) interval() time.Duration {
	if l.Interval > 0 {
		return l.Interval
	}
	return DefaultInterval
}

// flushLocked logs the summary of the interval's counted refusals.
func (l *Log) flushLocked() {
	if l.more > 0 && l.log != nil {
		l.log.Warn(l.msg+" (summary)", "refused", l.more, "peers", len(l.peers), "interval", l.interval())
	}
	l.more, l.peers = 0, nil
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
}

// Close logs what is counted and stops the Log's timer.
func (l *Log) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.flushLocked()
}

// Limiter counts each peer's failed authentications: a peer that fails
// Burst times within an interval is turned away until the interval ends.
// The zero value allows DefaultBurst failures per DefaultInterval.
type Limiter struct {
	// Burst is the failures a peer may have in an interval (DefaultBurst
	// when 0).
	Burst int
	// Interval is the length of an interval (DefaultInterval when 0).
	Interval time.Duration

	mu    sync.Mutex
	peers map[string]*peerFailures
}

// DefaultBurst is a Limiter's Burst when 0: enough for a client that
// retries a mistyped token by hand, far fewer than a guesser needs.
const DefaultBurst = 10

type peerFailures struct {
	start time.Time
	n     int
}

// Blocked reports whether peer is turned away now, and for how long yet.
func (l *Limiter) Blocked(peer string) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.peers[peer]
	if f == nil {
		return false, 0
	}
	left := l.interval() - time.Since(f.start)
	if left <= 0 {
		delete(l.peers, peer)
		return false, 0
	}
	return f.n >= l.burst(), left
}

// Fail records a failed authentication of peer.
func (l *Limiter) Fail(peer string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.peers == nil {
		l.peers = map[string]*peerFailures{}
	}
	f := l.peers[peer]
	if f == nil || now.Sub(f.start) >= l.interval() {
		if f == nil && len(l.peers) >= maxPeers {
			l.pruneLocked(now)
		}
		f = &peerFailures{start: now}
		l.peers[peer] = f
	}
	f.n++
}

// pruneLocked forgets peers whose interval has ended; if none has, the
// oldest, so that the map stays bounded.
func (l *Limiter) pruneLocked(now time.Time) {
	var oldest string
	for p, f := range l.peers {
		if now.Sub(f.start) >= l.interval() {
			delete(l.peers, p)
		} else if oldest == "" || f.start.Before(l.peers[oldest].start) {
			oldest = p
		}
	}
	if len(l.peers) >= maxPeers && oldest != "" {
		delete(l.peers, oldest)
	}
}

func (l *Limiter) interval() time.Duration {
	if l.Interval > 0 {
		return l.Interval
	}
	return DefaultInterval
}

func (l *Limiter) burst() int {
	if l.Burst > 0 {
		return l.Burst
	}
	return DefaultBurst
}
