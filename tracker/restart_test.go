package tracker

import (
	"context"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestRestart stops a tracker and starts another on the same address and
// DataDir: queued jobs survive, a running one is requeued, nodes register
// again by themselves, and the outstanding lease is neither lost nor
// handed out a second time.
func TestRestart(t *testing.T) {
	cfg := fastConfig(t)
	a := startTracker(t, cfg)
	ctx := testCtx(t)
	dev, _ := device(t, a.Addr(), "k", proto.NodeAttrs{})
	cpu, _ := compiler(t, a.Addr(), "cpu")

	tc := dialTracker(t, a.Addr())
	j1, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "one", Module: module, Target: "cpu"})
	check.NoError(t, err)
	j2, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "two", Module: module + "# 2\n", Target: "cpu"})
	check.NoError(t, err)
	got, err := cpu.TakeJob(ctx, time.Second)
	check.NoError(t, err)
	check.Equal(t, got.ID, j1.ID)
	lease, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "k", NoRenew: true, TTL: time.Minute})
	check.NoError(t, err)

	// The client goes with the tracker: a client that closed its
	// connection first would have released the lease it held on it.
	a.stop(t)
	tc.Close()
	cfg.Listen = a.Addr()
	b := startTracker(t, cfg)

	// Jobs: j1 requeued (it was running), j2 still queued, in order.
	tc = dialTracker(t, b.Addr())
	s1, err := tc.BuildStatus(ctx, j1.ID)
	check.NoError(t, err)
	check.Equal(t, s1.State, proto.JobQueued)
	check.Equal(t, s1.Attempt, 1)
	check.Error(t, errorString(s1.Message), "tracker restarted")
	s2, err := tc.BuildStatus(ctx, j2.ID)
	check.NoError(t, err)
	check.Equal(t, s2.State, proto.JobQueued)

	// Nodes come back by themselves.
	eventually(t, "device re-registers", func() bool { return nodeState(b.Server, dev.NodeID()) != "" })
	eventually(t, "compiler re-registers", func() bool { return nodeState(b.Server, cpu.NodeID()) != "" })
	check.Equal(t, nodeState(b.Server, dev.NodeID()), proto.StateBusy)

	// The old lease is still valid, and the device is not leased twice.
	eventually(t, "registrar reconnected", func() bool {
		_, err := dev.VerifyLease(ctx, lease.Token)
		return err == nil
	})
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = tc.RequestLease(short, client.LeaseRequest{Key: "k"})
	cancel()
	check.ErrorIs(t, err, proto.ErrDeadline)

	// The compiler takes the requeued job first, with its module.
	eventually(t, "compiler reconnected", func() bool {
		got, err = cpu.TakeJob(ctx, 100*time.Millisecond)
		return err == nil && got != nil
	})
	check.Equal(t, got.ID, j1.ID)
	check.Equal(t, got.Module, module)
	check.Equal(t, got.Attempt, 2)

	// A new job gets a fresh id after the restored ones.
	j3, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: module, Target: "cpu"})
	check.NoError(t, err)
	check.True(t, j3.ID > j2.ID, j3.ID, j2.ID)
}

type errorString string

func (e errorString) Error() string { return string(e) }
