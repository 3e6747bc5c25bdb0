package cpu

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
)

// onceEach checks that every iteration ran exactly once.
func onceEach(t *testing.T, c poolCheck) {
	t.Helper()
	for i, n := range c.counts {
		if n != 1 {
			t.Fatalf("iteration %d ran %d times", i, n)
		}
	}
}

func TestPoolRunsEveryIterationOnce(t *testing.T) {
	for _, threads := range []int{1, 2, 3, 8} {
		for _, n := range []int64{0, 1, 2, 7, 8, 33, 1000, 100003} {
			for _, spin := range []time.Duration{0, 50 * time.Microsecond} {
				t.Run(fmt.Sprintf("threads=%d/n=%d/spin=%s", threads, n, spin), func(t *testing.T) {
					c, err := poolCheckRun(threads, spin, n, checkCount, -1, false)
					check.NoError(t, err)
					check.Equal(t, c.rc, int32(0))
					check.Equal(t, c.workers, threads-1)
					check.Equal(t, int64(len(c.counts)), n)
					onceEach(t, c)
					if n > 0 {
						check.Equal(t, c.callerChunks+c.workerChunks > 0, true)
					}
				})
			}
		}
	}
}

// TestPoolCallerTakesPart runs a loop whose chunks on worker threads wait
// until the caller has run one: it finishes only if the caller claims
// chunks too.
func TestPoolCallerTakesPart(t *testing.T) {
	c, err := poolCheckRun(4, 0, 64, checkWaitCaller, -1, false)
	check.NoError(t, err)
	check.Equal(t, c.timedOut, false, "a worker waited for the caller in vain")
	check.True(t, c.callerChunks > 0, "the caller ran no chunk")
	onceEach(t, c)
}

// TestPoolStalledThread stalls one worker in its first chunk, as if the OS
// had descheduled it, until every other iteration is done: with chunks
// claimed dynamically the other threads take its share, and the stalled
// thread runs only the chunk it holds.
func TestPoolStalledThread(t *testing.T) {
	for attempt := 0; ; attempt++ {
		c, err := poolCheckRun(4, 50*time.Microsecond, 32, checkStall, -1, false)
		check.NoError(t, err)
		check.Equal(t, c.timedOut, false, "the stalled thread's share was left to it")
		onceEach(t, c)
		if c.stallerChunks > 0 {
			check.Equal(t, c.stallerChunks, 1, "chunks run by the stalled thread")
			return
		}
		// The caller ran everything before a worker woke: try again.
		if attempt == 20 {
			t.Fatal("no worker thread took a chunk in 20 runs")
		}
	}
}

// TestPoolOnFewerCPUs runs a pool of 8 threads confined to one CPU: the
// threads share it, each descheduled most of the time, and the loop still
// completes with every iteration run once.
func TestPoolOnFewerCPUs(t *testing.T) {
	for _, spin := range []time.Duration{0, 50 * time.Microsecond} {
		c, err := poolCheckRun(8, spin, 10000, checkCount, -1, true)
		check.NoError(t, err)
		check.Equal(t, c.rc, int32(0))
		onceEach(t, c)
	}
}

func TestPoolErrorPropagates(t *testing.T) {
	for _, failAt := range []int64{0, 500, 999} {
		c, err := poolCheckRun(4, 0, 1000, checkFail, failAt, false)
		check.NoError(t, err)
		check.Equal(t, c.rc, int32(7), "launch's return")
		check.Equal(t, c.counts[failAt], uint32(0), "the failed chunk's iteration")
		for i, n := range c.counts {
			check.True(t, n <= 1, "iteration", i, "ran", n, "times")
		}
	}
}

func TestPoolNestedLaunchIsSerial(t *testing.T) {
	c, err := poolCheckRun(4, 0, 40, checkNested, -1, false)
	check.NoError(t, err)
	check.Equal(t, c.rc, int32(0))
	check.Equal(t, c.badNested, false, "an inner launch was not run at once on its caller")
	onceEach(t, c)
}

func TestPoolConfig(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	cfg, err := poolConfig(env(), 6)
	check.NoError(t, err)
	check.Equal(t, cfg, PoolConfig{Threads: 6, Spin: DefaultSpin})
	cfg, err = poolConfig(env(EnvThreads, "3", EnvSpin, "0"), 6)
	check.NoError(t, err)
	check.Equal(t, cfg, PoolConfig{Threads: 3, Spin: 0})
	cfg, err = poolConfig(env(EnvThreads, " 12 "), 2)
	check.NoError(t, err)
	check.Equal(t, cfg.Threads, 12, "an override above the CPUs")
	for _, bad := range []string{"0", "-1", "two", "100000"} {
		_, err = poolConfig(env(EnvThreads, bad), 2)
		check.Error(t, err, EnvThreads)
	}
	_, err = poolConfig(env(EnvSpin, "-5"), 2)
	check.Error(t, err, EnvSpin)
}

func TestCgroupQuota(t *testing.T) {
	root := t.TempDir()
	write := func(rel, text string) {
		p := filepath.Join(root, rel)
		check.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		check.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	}
	write("a/cpu.max", "250000 100000\n")
	write("a/b/cpu.max", "max 100000\n")
	write("a/b/c/cpu.max", "400000 100000\n")
	write("x/cpu.max", "max 100000\n")

	q, ok := cgroupQuota(root, "0::/a/b/c\n")
	check.True(t, ok)
	check.Equal(t, q, 2.5, "the smallest quota on the path")
	q, ok = cgroupQuota(root, "12:cpu:/old\n0::/a/b\n")
	check.True(t, ok)
	check.Equal(t, q, 2.5)
	_, ok = cgroupQuota(root, "0::/x\n")
	check.Equal(t, ok, false, "no quota")
	_, ok = cgroupQuota(root, "4:cpu,cpuacct:/v1only\n")
	check.Equal(t, ok, false, "cgroup v1 only")
	_, ok = cgroupQuota(root, "0::/../../etc\n")
	check.Equal(t, ok, false, "a path that climbs out of the root")
}
