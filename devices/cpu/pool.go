package cpu

/*
#cgo CFLAGS: -I${SRCDIR}/../../abi
#cgo LDFLAGS: -lpthread
#include "pool.h"
*/
import "C"

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// EnvThreads names the variable that sets how many threads (the caller
// included) the process's pool runs parallel loops on, in place of the CPUs
// the process may use.
const EnvThreads = "KILN_NUM_THREADS"

// EnvSpin names the variable that sets, in microseconds, how long an idle
// pool thread spins waiting for the next parallel loop before it sleeps
// (DefaultSpin when unset; 0 sleeps at once).
const EnvSpin = "KILN_POOL_SPIN_US"

// DefaultSpin is how long idle pool threads spin before they sleep: long
// enough to bridge the gap between the kernels of one model, short enough
// that a process waiting for its next request gives the CPUs back.
const DefaultSpin = 50 * time.Microsecond

// PoolConfig is the size of the process's thread pool.
type PoolConfig struct {
	// Threads run a parallel loop, the caller included.
	Threads int
	// Spin is how long an idle thread spins before it sleeps.
	Spin time.Duration
}

var pool struct {
	once sync.Once
	cfg  PoolConfig
	err  error
}

// Pool returns the configuration of the thread pool that runs the parallel
// loops of every module this process loads: EnvThreads, else the CPUs the
// process may use (its affinity mask, bounded by its cgroup's CPU quota).
// The pool starts with the first parallel loop and lives as long as the
// process.
func Pool() (PoolConfig, error) {
	pool.once.Do(func() {
		pool.cfg, pool.err = poolConfig(os.Getenv, availableCPUs())
		if pool.err == nil {
			C.kiln_pool_configure(C.int(pool.cfg.Threads), C.int64_t(pool.cfg.Spin.Nanoseconds()))
		}
	})
	return pool.cfg, pool.err
}

// maxThreads bounds EnvThreads.
const maxThreads = 1024

// poolConfig reads the pool's configuration from the environment, with cpus
// the CPUs the process may use.
func poolConfig(getenv func(string) string, cpus int) (PoolConfig, error) {
	cfg := PoolConfig{Threads: max(cpus, 1), Spin: DefaultSpin}
	if s := strings.TrimSpace(getenv(EnvThreads)); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxThreads {
			return PoolConfig{}, fmt.Errorf("%s=%q: want a thread count from 1 to %d", EnvThreads, s, maxThreads)
		}
		cfg.Threads = n
	}
	if s := strings.TrimSpace(getenv(EnvSpin)); s != "" {
		us, err := strconv.Atoi(s)
		if err != nil || us < 0 || us > 1_000_000 {
			return PoolConfig{}, fmt.Errorf("%s=%q: want microseconds from 0 to 1000000", EnvSpin, s)
		}
		cfg.Spin = time.Duration(us) * time.Microsecond
	}
	return cfg, nil
}

// availableCPUs is the number of CPUs this process may run on: those of its
// affinity mask, bounded by the CPU quota of its cgroup (v2) and the
// cgroup's ancestors.
func availableCPUs() int {
	n := 0
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) == nil {
		n = set.Count()
	}
	if n < 1 {
		n = 1
	}
	if data, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		if q, ok := cgroupQuota("/sys/fs/cgroup", string(data)); ok {
			n = min(n, max(int(math.Ceil(q)), 1))
		}
	}
	return n
}

// cgroupQuota returns the smallest CPU quota (in CPUs) of the cgroup v2
// named in procCgroup (the text of /proc/self/cgroup) and its ancestors
// under root, or ok=false when none sets one.
func cgroupQuota(root, procCgroup string) (cpus float64, ok bool) {
	var rel string
	found := false
	sc := bufio.NewScanner(strings.NewReader(procCgroup))
	for sc.Scan() {
		if p, isV2 := strings.CutPrefix(sc.Text(), "0::"); isV2 {
			rel, found = p, true
		}
	}
	if !found {
		return 0, false
	}
	dir := filepath.Join(root, filepath.Clean("/"+rel))
	for {
		if q, isSet := readCPUMax(filepath.Join(dir, "cpu.max")); isSet && (!ok || q < cpus) {
			cpus, ok = q, true
		}
		if dir == root || len(dir) < len(root) {
			return cpus, ok
		}
		dir = filepath.Dir(dir)
	}
}

// readCPUMax parses a cpu.max file ("QUOTA PERIOD" or "max PERIOD").
func readCPUMax(path string) (float64, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(data))
	if len(f) != 2 || f[0] == "max" {
		return 0, false
	}
	quota, err1 := strconv.ParseFloat(f[0], 64)
	period, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || quota <= 0 || period <= 0 {
		return 0, false
	}
	return quota / period, true
}

// attachPool points a module's kiln_parallel_launch variable (slot) at the
// process's pool.
func attachPool(slot unsafe.Pointer) error {
	if _, err := Pool(); err != nil {
		return fmt.Errorf("thread pool: %w", err)
	}
	C.kiln_pool_set_launch(slot)
	return nil
}
