package tunefleet

import (
	"math"
	"strings"
	"testing"
	"time"

	must "github.com/kiln-ml/kiln/internal/check"
)

func TestStagesShares(t *testing.T) {
	var c stageClock
	c.add(StageCompile, 3*time.Second)
	c.add(StageCompile, 3*time.Second)
	c.add(StageTime, 3*time.Second)
	c.add(StageUpload, 500*time.Millisecond)
	c.add(StageLoad, 250*time.Millisecond)
	c.add(StageCheck, 250*time.Millisecond)
	c.add(StageQueue, time.Hour) // a wait: no share
	c.add(StageWait, time.Hour)
	s := c.s
	sh := s.Shares()
	sum := 0.0
	for _, v := range sh {
		sum += v
	}
	must.True(t, math.Abs(sum-1) < 1e-9, "shares add up to", sum)
	must.Equal(t, sh["compile"], 0.6)
	must.Equal(t, sh["time"], 0.3)
	_, ok := sh["queue"]
	must.True(t, !ok, "queue has a share")
	m := s.Map()
	for _, name := range []string{"compile", "queue", "upload", "load", "check", "time", "wait"} {
		_, ok := m[name]
		must.True(t, ok, "no mean for", name, m)
	}
	must.Equal(t, m["compile"], 3000.0)
	line := s.String()
	must.True(t, strings.HasPrefix(line, "compile 60% (3s each), time 30% (3s each)"), line)
	must.Equal(t, len(Stages{}.Shares()), 0)
}
