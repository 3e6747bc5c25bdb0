package tracker

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestBuildQueueClasses: interactive jobs are handed out before bulk
// ones, within a class by priority then age; each queued job reports its
// position, and once a job has been built an ETA that grows with the
// position; query lists the queue in that order; an unknown class is
// refused.
func TestBuildQueueClasses(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	tc := dialTracker(t, tr.Addr())
	cpu, _ := compiler(t, tr.Addr(), "cpu")

	_, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: module, Target: "cpu", Class: "urgent"})
	check.ErrorIs(t, err, proto.ErrBadRequest)
	check.Error(t, err, `unknown job class "urgent"`)

	// One job built first: the ETA's build time.
	first, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "first", Module: module, Target: "cpu"})
	check.NoError(t, err)
	check.Equal(t, first.Position, 1)
	got, err := cpu.TakeJob(ctx, time.Second)
	check.NoError(t, err)
	check.Equal(t, got.ID, first.ID)
	check.NoError(t, cpu.FailJob(ctx, got.ID, "does not compile", ""))

	submit := func(name string, class proto.JobClass, prio int) string {
		j, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: name, Module: module, Target: "cpu", Class: class, Priority: prio})
		check.NoError(t, err)
		check.Equal(t, j.State, proto.JobQueued)
		return j.ID
	}
	ids := map[string]string{
		"bulk-old":    submit("bulk-old", proto.JobBulk, 0),
		"bulk-high":   submit("bulk-high", proto.JobBulk, 5),
		"interactive": submit("interactive", "", 0),
		"low":         submit("low", proto.JobInteractive, -1),
		"bulk-new":    submit("bulk-new", proto.JobBulk, 0),
	}
	want := []string{"interactive", "low", "bulk-high", "bulk-old", "bulk-new"}
	var lastETA time.Duration
	for i, name := range want {
		j, err := tc.BuildStatus(ctx, ids[name])
		check.NoError(t, err)
		check.Equal(t, j.Position, i+1, name)
		check.True(t, j.ETA > 0 && j.ETA >= lastETA, name, j.ETA, lastETA)
		lastETA = j.ETA
	}
	sum, err := tc.Query(ctx, 0)
	check.NoError(t, err)
	check.Equal(t, len(sum.BuildQueue), len(want))
	for i, name := range want {
		check.Equal(t, sum.BuildQueue[i].Name, name)
		check.Equal(t, sum.BuildQueue[i].Position, i+1)
	}
	check.Equal(t, sum.BuildQueue[2].Class, proto.JobBulk)
	for _, name := range want {
		j, err := cpu.TakeJob(ctx, time.Second)
		check.NoError(t, err)
		check.Equal(t, j.Name, name)
		check.Equal(t, j.Position, 0)
	}
}

// TestBuildWaitPosition: a client waiting for a queued job hears its
// position when it starts waiting and whenever it changes.
func TestBuildWaitPosition(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	tc := dialTracker(t, tr.Addr())
	compiler(t, tr.Addr(), "cpu")
	a, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: module, Target: "cpu"})
	check.NoError(t, err)
	b, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: module, Target: "cpu"})
	check.NoError(t, err)
	var mu sync.Mutex
	var seen []int
	done := make(chan error, 1)
	go func() {
		_, err := tc.WaitBuild(ctx, b.ID, func(j proto.BuildJob) {
			mu.Lock()
			seen = append(seen, j.Position)
			mu.Unlock()
		})
		done <- err
	}()
	positions := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return append([]int(nil), seen...)
	}
	eventually(t, "the first position", func() bool { return len(positions()) == 1 })
	check.Equal(t, positions()[0], 2)
	_, err = tc.CancelBuild(ctx, a.ID)
	check.NoError(t, err)
	eventually(t, "the new position", func() bool { return len(positions()) == 2 })
	check.Equal(t, positions()[1], 1)
	_, err = tc.CancelBuild(ctx, b.ID)
	check.NoError(t, err)
	check.ErrorIs(t, <-done, client.ErrBuildFailed)
}

// TestBuildCancelOnDisconnect: the queued jobs a client submitted with
// CancelOnDisconnect are cancelled once its connection is gone for the
// grace period; its other jobs, and another client's, stay queued.
func TestBuildCancelOnDisconnect(t *testing.T) {
	cfg := fastConfig(t)
	cfg.JobOrphanGrace = 20 * time.Millisecond
	tr := startTracker(t, cfg)
	ctx := testCtx(t)
	compiler(t, tr.Addr(), "cpu")
	other := dialTracker(t, tr.Addr())
	gone, err := client.DialTracker(ctx, tr.Addr(), client.TrackerOptions{Logger: quietLogger()})
	check.NoError(t, err)
	tied, err := gone.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: module, Target: "cpu", Class: proto.JobBulk, CancelOnDisconnect: true})
	check.NoError(t, err)
	kept, err := gone.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: module, Target: "cpu"})
	check.NoError(t, err)
	theirs, err := other.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: module, Target: "cpu", CancelOnDisconnect: true})
	check.NoError(t, err)
	check.NoError(t, gone.Close())
	eventually(t, "the orphaned job cancelled", func() bool {
		j, err := other.BuildStatus(ctx, tied.ID)
		return err == nil && j.State == proto.JobCancelled
	})
	j, err := other.BuildStatus(ctx, tied.ID)
	check.NoError(t, err)
	check.True(t, strings.Contains(j.Error, "disconnected") && strings.Contains(j.Error, "--job-orphan-grace"), j.Error)
	for _, id := range []string{kept.ID, theirs.ID} {
		j, err := other.BuildStatus(ctx, id)
		check.NoError(t, err)
		check.Equal(t, j.State, proto.JobQueued, id)
	}
}

// TestBuildOrphanAdopted: a cancel-on-disconnect job whose client comes
// back on a new connection and waits for it again is no longer in its
// grace period.
func TestBuildOrphanAdopted(t *testing.T) {
	cfg := fastConfig(t)
	cfg.JobOrphanGrace = time.Hour
	tr := startTracker(t, cfg)
	ctx := testCtx(t)
	compiler(t, tr.Addr(), "cpu")
	first, err := client.DialTracker(ctx, tr.Addr(), client.TrackerOptions{Logger: quietLogger()})
	check.NoError(t, err)
	j, err := first.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: module, Target: "cpu", CancelOnDisconnect: true})
	check.NoError(t, err)
	check.NoError(t, first.Close())
	orphaned := func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return !tr.jobs[j.ID].orphaned.IsZero()
	}
	eventually(t, "the job orphaned", orphaned)
	again := dialTracker(t, tr.Addr())
	heard := make(chan proto.BuildJob, 4)
	done := make(chan error, 1)
	go func() {
		_, err := again.WaitBuild(ctx, j.ID, func(j proto.BuildJob) { heard <- j })
		done <- err
	}()
	w := <-heard
	check.Equal(t, w.Position, 1)
	check.True(t, !orphaned(), "the job is still orphaned after its client waited again")
	_, err = again.CancelBuild(ctx, j.ID)
	check.NoError(t, err)
	check.ErrorIs(t, <-done, client.ErrBuildFailed)
}
