package refusal

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
)

// syncBuffer is a log sink safe for the Log's timer.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLog: of five refusals in an interval the first is logged in full
// and the other four in one summary line when the interval ends.
func TestLog(t *testing.T) {
	var out syncBuffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	l := &Log{Interval: 50 * time.Millisecond}
	defer l.Close()
	for i := range 5 {
		l.Note(log, []string{"10.0.0.1", "10.0.0.2"}[i%2], "refused", "n", i)
	}
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(out.String(), "summary") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	check.Equal(t, len(lines), 2, out.String())
	check.True(t, strings.Contains(lines[0], "n=0") && strings.Contains(lines[0], "peer=10.0.0.1"), lines[0])
	check.True(t, strings.Contains(lines[1], "refused=4 peers=2"), lines[1])
}

// TestLimiter: a peer is turned away after Burst failures, others are
// not, and it is let in again once its interval has passed.
func TestLimiter(t *testing.T) {
	l := &Limiter{Burst: 2, Interval: 50 * time.Millisecond}
	l.Fail("a")
	blocked, _ := l.Blocked("a")
	check.True(t, !blocked, "blocked after one failure")
	l.Fail("a")
	blocked, left := l.Blocked("a")
	check.True(t, blocked && left > 0, "not blocked after two failures")
	blocked, _ = l.Blocked("b")
	check.True(t, !blocked, "another peer is blocked")
	deadline := time.Now().Add(time.Minute)
	for blocked && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		blocked, _ = l.Blocked("a")
	}
	check.True(t, !blocked, "still blocked after its interval")
}
