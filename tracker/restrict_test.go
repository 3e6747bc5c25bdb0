package tracker

import (
	"bytes"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestNodeRestriction performs the attacks of a fleet member that holds
// the token against another node: re-registering its id with another
// address, heartbeating, deregistering and reporting failures in its name,
// and completing a compiler node's running job with its own artifact. Each
// is refused and the victim is untouched.
func TestNodeRestriction(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	victim, _ := device(t, tr.Addr(), "cpu", proto.NodeAttrs{})
	id := victim.NodeID()

	attacker, err := proto.Dial(ctx, tr.Addr(), proto.DialOptions{Role: proto.RoleDevice, Logger: quietLogger()})
	check.NoError(t, err)
	defer attacker.Close()

	t.Run("re-register a live node's id", func(t *testing.T) {
		err := attacker.Call(ctx, proto.MethodTrackerRegister, proto.RegisterArgs{
			Role: proto.NodeDevice, NodeID: id, Key: "cpu", Addr: "127.0.0.1:6666"}, nil)
		check.ErrorIs(t, err, proto.ErrBusy)
		for _, n := range tr.Summary(0).Devices {
			if n.NodeID == id {
				check.Equal(t, n.Addr, "127.0.0.1:1")
			}
		}
	})
	t.Run("heartbeat, deregister, report for another node", func(t *testing.T) {
		err := attacker.Call(ctx, proto.MethodTrackerHeartbeat, proto.HeartbeatArgs{NodeID: id}, nil)
		check.ErrorIs(t, err, proto.ErrNotFound)
		err = attacker.Call(ctx, proto.MethodTrackerDeregister, proto.DeregisterArgs{NodeID: id}, nil)
		check.ErrorIs(t, err, proto.ErrNotFound)
		for range 5 {
			err = attacker.Call(ctx, proto.MethodTrackerReport, proto.ReportArgs{NodeID: id, Kind: proto.ReportFailure, Message: "fake"}, nil)
			check.ErrorIs(t, err, proto.ErrNotFound)
		}
		check.Equal(t, nodeState(tr.Server, id), proto.StateFree)
	})
	t.Run("a lost node is not heartbeated back to life", func(t *testing.T) {
		// A device whose connection dies without deregistering is lost.
		dead, err := proto.Dial(ctx, tr.Addr(), proto.DialOptions{Role: proto.RoleDevice, Logger: quietLogger()})
		check.NoError(t, err)
		var rep proto.RegisterReply
		check.NoError(t, dead.Call(ctx, proto.MethodTrackerRegister, proto.RegisterArgs{Role: proto.NodeDevice, Key: "spare", Addr: "127.0.0.1:2"}, &rep))
		dead.Close()
		eventually(t, "the device is lost", func() bool { return nodeState(tr.Server, rep.NodeID) == proto.StateLost })
		err = attacker.Call(ctx, proto.MethodTrackerHeartbeat, proto.HeartbeatArgs{NodeID: rep.NodeID}, nil)
		check.ErrorIs(t, err, proto.ErrNotFound)
		check.Equal(t, nodeState(tr.Server, rep.NodeID), proto.StateLost)
	})
	t.Run("complete another node's job", func(t *testing.T) {
		tc := dialTracker(t, tr.Addr())
		cpu, _ := compiler(t, tr.Addr(), "cpu")
		j, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "mm.py", Module: module, Target: "cpu"})
		check.NoError(t, err)
		got, err := cpu.TakeJob(ctx, time.Second)
		check.NoError(t, err)
		check.Equal(t, got.ID, j.ID)

		evil, err := proto.Dial(ctx, tr.Addr(), proto.DialOptions{Role: proto.RoleCompiler, Logger: quietLogger()})
		check.NoError(t, err)
		defer evil.Close()
		art := bytes.Repeat([]byte("evil"), 100)
		err = evil.Call(ctx, proto.MethodBuildComplete, proto.BuildCompleteArgs{ID: j.ID, NodeID: cpu.NodeID(), Artifact: sha(art)}, nil)
		check.ErrorIs(t, err, proto.ErrNotFound)
		err = evil.Call(ctx, proto.MethodBuildFail, proto.BuildFailArgs{ID: j.ID, NodeID: cpu.NodeID(), Message: "sabotage"}, nil)
		check.ErrorIs(t, err, proto.ErrNotFound)
		st, err := tc.BuildStatus(ctx, j.ID)
		check.NoError(t, err)
		check.Equal(t, st.State, proto.JobRunning)
		// The node that claimed it still completes it.
		good := bytes.Repeat([]byte("good"), 100)
		check.NoError(t, cpu.UploadArtifact(ctx, sha(good), int64(len(good)), bytes.NewReader(good)))
		check.NoError(t, cpu.CompleteJob(ctx, j.ID, sha(good), ""))
	})
}
