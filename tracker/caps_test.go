package tracker

import (
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestJobCaps performs the attacks of a client on the build queue: a job
// name of megabytes (which broke query for everyone), a queue timeout of a
// century, and more queued jobs or module bytes than the tracker should
// hold. Each is refused naming the limit and its flag; query still works.
func TestJobCaps(t *testing.T) {
	cfg := fastConfig(t)
	cfg.MaxQueuedJobs = 2
	cfg.MaxQueuedBytes = 1 << 20
	tr := startTracker(t, cfg)
	ctx := testCtx(t)
	tc := dialTracker(t, tr.Addr())
	submit := func(a proto.BuildSubmitArgs) error {
		if a.Module == "" {
			a.Module = module
		}
		if a.Target == "" {
			a.Target = "cpu"
		}
		_, err := tc.SubmitBuild(ctx, a)
		return err
	}
	err := submit(proto.BuildSubmitArgs{Name: strings.Repeat("n", 40<<10)})
	check.ErrorIs(t, err, proto.ErrTooLarge)
	check.Error(t, err, "job name")
	err = submit(proto.BuildSubmitArgs{Options: map[string]string{"cflags": strings.Repeat("-O2 ", 1000)}})
	check.ErrorIs(t, err, proto.ErrTooLarge)
	err = submit(proto.BuildSubmitArgs{QueueTimeout: 100 * 365 * 24 * time.Hour})
	check.ErrorIs(t, err, proto.ErrBadRequest)
	check.Error(t, err, "--max-job-queue-timeout")
	err = submit(proto.BuildSubmitArgs{RunTimeout: 1000 * time.Hour})
	check.Error(t, err, "--max-job-run-timeout")

	big := "# " + strings.Repeat("x", 700<<10) + "\n" + module
	check.NoError(t, submit(proto.BuildSubmitArgs{Module: big}))
	err = submit(proto.BuildSubmitArgs{Module: big})
	check.ErrorIs(t, err, proto.ErrBusy)
	check.Error(t, err, "--max-queued-bytes")
	check.NoError(t, submit(proto.BuildSubmitArgs{}))
	err = submit(proto.BuildSubmitArgs{})
	check.ErrorIs(t, err, proto.ErrBusy)
	check.Error(t, err, "--max-queued-jobs")

	sum, err := tc.Query(ctx, 10)
	check.NoError(t, err)
	check.Equal(t, sum.JobCounts[proto.JobQueued], 2)
}
