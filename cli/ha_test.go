package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// haLeaseTTL is the fault tests' lease TTL: longer than a failover
// (a lease whose tracker cannot be reached for its whole TTL expires).
const haLeaseTTL = 20 * time.Second

// haLedger is what the clients of a fault test saw: the jobs a tracker
// acknowledged, the devices held (a device that arrives in a lease while
// another client holds it was granted twice), and the retryable errors.
type haLedger struct {
	mu        sync.Mutex
	jobs      []string          // acknowledged
	keys      map[string]bool   // every submission's SubmitKey, acknowledged or not
	holder    map[string]string // device address → lease id
	twice     []string
	retryable []error
	cycles    int
}

func (lg *haLedger) take(l *client.Lease) {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	if other, held := lg.holder[l.Addr]; held {
		lg.twice = append(lg.twice, fmt.Sprintf("%s: lease %s granted while %s held it", l.Addr, l.ID, other))
	}
	lg.holder[l.Addr] = l.ID
}

func (lg *haLedger) drop(l *client.Lease) {
	lg.mu.Lock()
	delete(lg.holder, l.Addr)
	lg.mu.Unlock()
}

func (lg *haLedger) done() int {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	return lg.cycles
}

// haCycle is one client's round: build vadd.py on a compiler node, fetch
// the artifact, lease a device, time vadd there, release it.
func haCycle(ctx context.Context, f *procFleet, tc *client.Tracker, lg *haLedger, src string, dir string) error {
	lg.mu.Lock()
	key := fmt.Sprintf("ha-%d", len(lg.keys))
	lg.keys[key] = true
	lg.mu.Unlock()
	job, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "vadd.py", Module: src, Target: "cpu", SubmitKey: key})
	if err != nil {
		return err
	}
	lg.mu.Lock()
	lg.jobs = append(lg.jobs, job.ID)
	lg.mu.Unlock()
	built, err := tc.WaitBuild(ctx, job.ID, nil)
	if err != nil {
		return err
	}
	art, err := os.CreateTemp(dir, "vadd-*.kiln")
	if err != nil {
		return err
	}
	defer art.Close()
	if _, err := tc.DownloadArtifact(ctx, built.Artifact, art); err != nil {
		return err
	}
	l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "cpu", TTL: haLeaseTTL, User: "ha"})
	if err != nil {
		return err
	}
	lg.take(l)
	err = timeVadd(ctx, f, l, art.Name(), 3)
	lg.drop(l)
	return errors.Join(err, l.Release(ctx))
}

// timeVadd opens a session under lease l, loads the artifact at path and
// times vadd rounds times.
func timeVadd(ctx context.Context, f *procFleet, l *client.Lease, path string, rounds int) error {
	s, err := client.Connect(ctx, l.Addr, client.SessionOptions{Token: f.tok, LeaseToken: l.Token})
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.UploadFile(ctx, "vadd.kiln", path); err != nil {
		return err
	}
	mod, err := s.LoadModule(ctx, "vadd.kiln")
	if err != nil {
		return err
	}
	fn, err := mod.GetFunction(ctx, "vadd")
	if err != nil {
		return err
	}
	var args []any
	for range 3 {
		a, err := s.Empty(ctx, ndarray.Shape{1024}, ndarray.Float32, devices.CPUDevice)
		if err != nil {
			return err
		}
		args = append(args, a)
	}
	for range rounds {
		if _, err := s.TimeEvaluator(ctx, fn, client.TimeOptions{Number: 3, Repeat: 1}, args...); err != nil {
			return err
		}
	}
	return nil
}

// haClients runs n clients doing haCycle until ctx ends; a retryable error
// is noted and the client carries on, any other fails the test.
func haClients(t *testing.T, ctx context.Context, f *procFleet, lg *haLedger, n int) *sync.WaitGroup {
	src, err := os.ReadFile("testdata/vadd.py")
	check.NoError(t, err)
	var wg sync.WaitGroup
	for i := range n {
		tc := f.dialTracker(ctx)
		dir := filepath.Join(f.dir, fmt.Sprint("client", i))
		check.NoError(t, os.MkdirAll(dir, 0o700))
		wg.Go(func() {
			for ctx.Err() == nil {
				err := haCycle(ctx, f, tc, lg, string(src), dir)
				switch {
				case err == nil:
					lg.mu.Lock()
					lg.cycles++
					lg.mu.Unlock()
				case ctx.Err() != nil:
				case errors.Is(err, proto.ErrUnavailable):
					lg.mu.Lock()
					lg.retryable = append(lg.retryable, err)
					lg.mu.Unlock()
				default:
					t.Errorf("client %d: %v", i, err)
					return
				}
			}
		})
	}
	return &wg
}

// TestHATrackerKilled runs the fault test on one tracker (bbolt), killed
// with -9 and started again on the same data.
func TestHATrackerKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet of processes through a tracker crash")
	}
	failKernels(t) // skips without a C compiler
	f := newProcFleet(t, 250*time.Millisecond)
	f.startTracker("")
	runHAFaults(t, f, func(lg *haLedger) {
		addr := f.trackerAddr
		f.tracker.kill9(t)
		f.startTracker(addr)
	})
}

// runHAFaults runs a fleet of real processes (two compiler nodes, three
// device daemons, clients building and timing in a loop) on f's trackers
// through faults: a session held across them keeps timing calls, its
// lease keeps renewing, every job a client submitted is built exactly
// once, no device is leased twice, and the clients carry on, seeing at
// most retryable errors.
func runHAFaults(t *testing.T, f *procFleet, faults func(lg *haLedger)) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*procGuard)
	defer cancel()
	for range 3 {
		f.startDevice("cpu")
	}
	f.startCompiler()
	f.startCompiler()
	f.waitFree("cpu", 3)

	// A session held through the faults, under a lease renewed on the
	// trackers that survive them.
	tc := f.dialTracker(ctx)
	held, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "cpu", TTL: haLeaseTTL, User: "held"})
	check.NoError(t, err)
	lg := &haLedger{holder: map[string]string{}, keys: map[string]bool{}}
	lg.take(held)
	s, err := client.Connect(ctx, held.Addr, client.SessionOptions{Token: f.tok, LeaseToken: held.Token})
	check.NoError(t, err)
	defer s.Close()
	check.NoError(t, s.Upload(ctx, "kernels.kiln", failKernels(t)))
	mod, err := s.LoadModule(ctx, "kernels.kiln")
	check.NoError(t, err)
	sleep, err := mod.GetFunction(ctx, "sleep_ms")
	check.NoError(t, err)

	cctx, stopClients := context.WithCancel(ctx)
	defer stopClients()
	wg := haClients(t, cctx, f, lg, 2)
	eventually(t, "two cycles before the faults", func() bool { return lg.done() >= 2 })

	// A call in flight on the held session while the faults happen, and
	// calls on it after each.
	inflight := make(chan error, 1)
	go func() {
		_, err := sleep.Call(ctx, int64(500))
		inflight <- err
	}()
	faults(lg)
	after := time.Now()
	check.NoError(t, <-inflight, "a call in flight to a daemon while a tracker died")
	before := lg.done()
	for i := range 4 {
		_, err := sleep.Call(ctx, int64(100))
		check.NoError(t, err, "held session, call", i)
	}
	eventually(t, "four cycles after the faults", func() bool { return lg.done() >= before+4 })
	eventually(t, "the held lease renewed after the faults", func() bool { return held.Expiry().After(after.Add(haLeaseTTL)) })
	check.NoError(t, held.Err(), "the held lease's renewal")
	stopClients()
	wg.Wait()
	lg.drop(held)
	check.NoError(t, held.Release(ctx))

	// No device was leased twice. Every job on the tracker comes from one
	// submission (one a submission, even those the clients stopped waiting
	// for at the end), every acknowledged one among them, and all are built.
	check.Equal(t, len(lg.twice), 0, lg.twice)
	sum, err := tc.Query(ctx, proto.MaxQueryJobs)
	check.NoError(t, err)
	bySubmission := map[string]int{}
	onTracker := map[string]bool{}
	for _, j := range sum.Jobs {
		check.True(t, lg.keys[j.SubmitKey], "job", j.ID, "has no submission of the clients:", j.SubmitKey)
		bySubmission[j.SubmitKey]++
		check.Equal(t, bySubmission[j.SubmitKey], 1, "jobs of submission", j.SubmitKey)
		onTracker[j.ID] = true
		done, err := tc.WaitBuild(ctx, j.ID, nil)
		check.NoError(t, err, "job", j.ID)
		check.Equal(t, done.State, proto.JobSucceeded)
	}
	for _, id := range lg.jobs {
		check.True(t, onTracker[id], "acknowledged job", id, "is not on the tracker")
	}
	t.Logf("%d cycles, %d jobs, %d retryable errors seen by clients", lg.done(), len(lg.jobs), len(lg.retryable))
}
