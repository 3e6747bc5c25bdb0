package tracker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// compiler registers a compiler node building targets.
func compiler(t testing.TB, addr string, targets ...string) (*client.Registrar, context.CancelFunc) {
	t.Helper()
	return compilerWith(t, addr, proto.NodeAttrs{Targets: targets, Compiler: "gcc 12"})
}

func sha(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

const module = "@I.ir_module\nclass Module:\n    pass\n"

func TestBuildJobLifecycle(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	tc := dialTracker(t, tr.Addr())
	cuda, _ := compiler(t, tr.Addr(), "cuda")
	cpu, _ := compiler(t, tr.Addr(), "cpu", "c -mtriple=aarch64-linux-gnu")

	j, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "mm.py", Module: module, Target: "cpu -mcpu=native"})
	check.NoError(t, err)
	check.Equal(t, j.State, proto.JobQueued)

	// The cuda node finds nothing; the cpu node takes it.
	none, err := cuda.TakeJob(ctx, 50*time.Millisecond)
	check.NoError(t, err)
	check.True(t, none == nil, "cuda node took a cpu job")
	got, err := cpu.TakeJob(ctx, time.Second)
	check.NoError(t, err)
	check.Equal(t, got.ID, j.ID)
	check.Equal(t, got.Module, module)
	check.Equal(t, got.State, proto.JobRunning)
	check.Equal(t, nodeState(tr.Server, cpu.NodeID()), proto.StateBusy)

	var seen []string
	waitErr := make(chan error, 1)
	var final proto.BuildJob
	go func() {
		var err error
		final, err = tc.WaitBuild(ctx, j.ID, func(j proto.BuildJob) { seen = append(seen, string(j.State)+" "+j.Message) })
		waitErr <- err
	}()
	check.NoError(t, cpu.JobProgress(ctx, j.ID, 0.5, "lowering"))
	art := bytes.Repeat([]byte("kiln"), 1000)
	// A wrong hash is refused; the right one is stored.
	err = cpu.UploadArtifact(ctx, sha([]byte("other")), int64(len(art)), bytes.NewReader(art))
	check.ErrorIs(t, err, proto.ErrBadRequest)
	err = cpu.CompleteJob(ctx, j.ID, sha([]byte("other")), "")
	check.ErrorIs(t, err, proto.ErrNotFound)
	check.NoError(t, cpu.UploadArtifact(ctx, sha(art), int64(len(art)), bytes.NewReader(art)))
	check.NoError(t, cpu.CompleteJob(ctx, j.ID, sha(art), "built in 1s"))
	check.NoError(t, <-waitErr)
	check.Equal(t, final.State, proto.JobSucceeded)
	check.Equal(t, final.Artifact, sha(art))
	check.Equal(t, final.ArtifactSize, int64(len(art)))
	check.True(t, len(seen) >= 1 && strings.HasPrefix(seen[len(seen)-1], "succeeded"), seen)

	var buf bytes.Buffer
	n, err := tc.DownloadArtifact(ctx, final.Artifact, &buf)
	check.NoError(t, err)
	check.Equal(t, n, int64(len(art)))
	check.True(t, bytes.Equal(buf.Bytes(), art), "artifact bytes")
	_, err = tc.DownloadArtifact(ctx, sha([]byte("missing")), &buf)
	check.ErrorIs(t, err, proto.ErrNotFound)
	_, err = tc.DownloadArtifact(ctx, "../../etc/passwd", &buf)
	check.ErrorIs(t, err, proto.ErrBadRequest)

	t.Run("failure carries the compiler's message", func(t *testing.T) {
		j, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: module, Target: "cpu"})
		check.NoError(t, err)
		got, err := cpu.TakeJob(ctx, time.Second)
		check.NoError(t, err)
		check.NoError(t, cpu.FailJob(ctx, got.ID, "matmul.c:3: error: expected ';'", "cc output"))
		final, err := tc.WaitBuild(ctx, j.ID, nil)
		check.ErrorIs(t, err, client.ErrBuildFailed)
		check.Error(t, err, "expected ';'")
		check.Equal(t, final.State, proto.JobFailed)
	})

	t.Run("cancel", func(t *testing.T) {
		j, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: module, Target: "cpu"})
		check.NoError(t, err)
		got, err := cpu.TakeJob(ctx, time.Second)
		check.NoError(t, err)
		c, err := tc.CancelBuild(ctx, j.ID)
		check.NoError(t, err)
		check.Equal(t, c.State, proto.JobCancelled)
		check.ErrorIs(t, cpu.JobProgress(ctx, got.ID, 0.9, ""), proto.ErrCancelled)
		_, err = tc.WaitBuild(ctx, j.ID, nil)
		check.ErrorIs(t, err, client.ErrBuildFailed)
	})

	t.Run("bad submissions", func(t *testing.T) {
		tests := []struct {
			name string
			args proto.BuildSubmitArgs
			want error
		}{
			{"empty module", proto.BuildSubmitArgs{Target: "cpu"}, proto.ErrBadRequest},
			{"no target", proto.BuildSubmitArgs{Module: module}, proto.ErrBadRequest},
			{"format", proto.BuildSubmitArgs{Module: module, Target: "cpu", Format: "pickle"}, proto.ErrBadRequest},
		}
		for _, tc2 := range tests {
			t.Run(tc2.name, func(t *testing.T) {
				_, err := tc.SubmitBuild(ctx, tc2.args)
				check.ErrorIs(t, err, tc2.want)
			})
		}
		_, err := tc.BuildStatus(ctx, "j-nope")
		check.ErrorIs(t, err, proto.ErrNotFound)
	})
}

func TestBuildJobLimits(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	tc := dialTracker(t, tr.Addr())

	t.Run("queue limit", func(t *testing.T) {
		j, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: module, Target: "rocm", QueueTimeout: 100 * time.Millisecond, RunTimeout: time.Hour})
		check.NoError(t, err)
		_, err = tc.WaitBuild(ctx, j.ID, nil)
		check.Error(t, err, "in the queue, over its queue limit of 100ms", `target "rocm"`)
	})
	t.Run("run limit", func(t *testing.T) {
		cpu, _ := compiler(t, tr.Addr(), "cpu")
		j, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: module, Target: "cpu", QueueTimeout: time.Hour, RunTimeout: 100 * time.Millisecond})
		check.NoError(t, err)
		_, err = cpu.TakeJob(ctx, time.Second)
		check.NoError(t, err)
		_, err = tc.WaitBuild(ctx, j.ID, nil)
		check.Error(t, err, "over its run limit of 100ms")
		check.ErrorIs(t, cpu.CompleteJob(ctx, j.ID, sha(nil), ""), proto.ErrNotFound)
	})
	t.Run("lost compiler requeues", func(t *testing.T) {
		cpu, stop := compiler(t, tr.Addr(), "cpu")
		j, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: module, Target: "cpu"})
		check.NoError(t, err)
		got, err := cpu.TakeJob(ctx, time.Second)
		check.NoError(t, err)
		check.Equal(t, got.ID, j.ID)
		stop()
		eventually(t, "requeue", func() bool {
			s, err := tc.BuildStatus(ctx, j.ID)
			return err == nil && s.State == proto.JobQueued
		})
		other, _ := compiler(t, tr.Addr(), "cpu")
		got, err = other.TakeJob(ctx, time.Second)
		check.NoError(t, err)
		check.Equal(t, got.ID, j.ID)
		check.Equal(t, got.Attempt, 2)
	})
}

// TestJobRetention: a finished job is forgotten once --job-retention has
// passed since it ended (in memory and in tracker.db: a restart does not
// bring it back), while a job still queued is kept however old.
func TestJobRetention(t *testing.T) {
	cfg := fastConfig(t)
	cfg.JobRetention = 300 * time.Millisecond
	a := startTracker(t, cfg)
	ctx := testCtx(t)
	tc := dialTracker(t, a.Addr())
	done, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "done", Module: module, Target: "cpu"})
	check.NoError(t, err)
	_, err = tc.CancelBuild(ctx, done.ID)
	check.NoError(t, err)
	queued, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "queued", Module: module + "# 2\n", Target: "cpu"})
	check.NoError(t, err)

	// Still there right after it ended.
	got, err := tc.BuildStatus(ctx, done.ID)
	check.NoError(t, err)
	check.Equal(t, got.State, proto.JobCancelled)
	eventually(t, "the finished job is forgotten", func() bool {
		_, err := tc.BuildStatus(ctx, done.ID)
		return errors.Is(err, proto.ErrNotFound)
	})
	_, err = tc.BuildStatus(ctx, done.ID)
	check.Error(t, err, done.ID, "--job-retention")
	got, err = tc.BuildStatus(ctx, queued.ID)
	check.NoError(t, err)
	check.Equal(t, got.State, proto.JobQueued)

	a.stop(t)
	cfg.Listen = a.Addr()
	b := startTracker(t, cfg)
	tc = dialTracker(t, b.Addr())
	_, err = tc.BuildStatus(ctx, done.ID)
	check.ErrorIs(t, err, proto.ErrNotFound)
	got, err = tc.BuildStatus(ctx, queued.ID)
	check.NoError(t, err)
	check.Equal(t, got.State, proto.JobQueued)
}

// TestQueryPages lists the jobs a page at a time, newest first, and refuses
// a page over the limit naming it and the flag.
func TestQueryPages(t *testing.T) {
	a := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	tc := dialTracker(t, a.Addr())
	var ids []string
	for i := range 5 {
		j, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: fmt.Sprint("j", i), Module: module + fmt.Sprintf("# %d\n", i), Target: "cpu"})
		check.NoError(t, err)
		ids = append(ids, j.ID)
	}
	var got []string
	args := proto.QueryArgs{Jobs: 2}
	for pages := 0; ; pages++ {
		check.True(t, pages < 5, "paging does not end")
		sum, err := tc.QueryPage(ctx, args)
		check.NoError(t, err)
		check.True(t, len(sum.Jobs) <= 2, len(sum.Jobs))
		check.Equal(t, sum.JobCounts[proto.JobQueued], 5)
		for _, j := range sum.Jobs {
			got = append(got, j.ID)
		}
		if sum.MoreJobsBefore == "" {
			break
		}
		args.JobsBefore = sum.MoreJobsBefore
	}
	slices.Reverse(ids)
	check.Equal(t, got, ids)

	_, err := tc.QueryPage(ctx, proto.QueryArgs{Jobs: proto.MaxQueryJobs + 1})
	check.ErrorIs(t, err, proto.ErrBadRequest)
	check.Error(t, err, "1001 jobs", "limit of 1000", "--jobs", "--jobs-before")
}
