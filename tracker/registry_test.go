package tracker

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

func TestRegisterHeartbeatLost(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)

	t.Run("registrar", func(t *testing.T) {
		r, stop := device(t, tr.Addr(), "k1", proto.NodeAttrs{CPUModel: "test"})
		check.Equal(t, nodeState(tr.Server, r.NodeID()), proto.StateFree)
		sum := tr.Summary(0)
		check.Equal(t, sum.Keys, []proto.KeySummary{{Key: "k1", Free: 1}})
		check.Equal(t, sum.Devices[0].Addr, "127.0.0.1:1")
		stop() // deregisters
		eventually(t, "deregistration", func() bool { return nodeState(tr.Server, r.NodeID()) == "" })
	})

	t.Run("silent node is lost, then back", func(t *testing.T) {
		c, err := proto.Dial(ctx, tr.Addr(), proto.DialOptions{Role: proto.RoleDevice, Logger: quietLogger()})
		check.NoError(t, err)
		defer c.Close()
		var rep proto.RegisterReply
		check.NoError(t, c.Call(ctx, proto.MethodTrackerRegister, proto.RegisterArgs{Role: proto.NodeDevice, Key: "k2", Addr: ":9"}, &rep))
		check.Equal(t, rep.HeartbeatInterval, 50*time.Millisecond)
		check.Equal(t, rep.Addr, "127.0.0.1:9", "empty host filled in")
		eventually(t, "lost", func() bool { return nodeState(tr.Server, rep.NodeID) == proto.StateLost })
		check.Equal(t, tr.Summary(0).Keys[0].Lost, 1)
		var hb proto.HeartbeatReply
		check.NoError(t, c.Call(ctx, proto.MethodTrackerHeartbeat, proto.HeartbeatArgs{NodeID: rep.NodeID}, &hb))
		check.Equal(t, hb.State, proto.StateFree)
	})

	t.Run("unknown node heartbeat is not_found", func(t *testing.T) {
		c, err := proto.Dial(ctx, tr.Addr(), proto.DialOptions{Role: proto.RoleDevice, Logger: quietLogger()})
		check.NoError(t, err)
		defer c.Close()
		err = c.Call(ctx, proto.MethodTrackerHeartbeat, proto.HeartbeatArgs{NodeID: "nope"}, nil)
		check.ErrorIs(t, err, proto.ErrNotFound)
	})

	t.Run("dropped connection marks lost", func(t *testing.T) {
		c, err := proto.Dial(ctx, tr.Addr(), proto.DialOptions{Role: proto.RoleDevice, Logger: quietLogger()})
		check.NoError(t, err)
		var rep proto.RegisterReply
		check.NoError(t, c.Call(ctx, proto.MethodTrackerRegister, proto.RegisterArgs{Role: proto.NodeDevice, Key: "k3", Addr: ":9"}, &rep))
		c.Close()
		eventually(t, "lost", func() bool { return nodeState(tr.Server, rep.NodeID) == proto.StateLost })
	})

	t.Run("bad registrations", func(t *testing.T) {
		tests := []struct {
			name string
			role proto.Role
			args proto.RegisterArgs
			want string
		}{
			{"client role", proto.RoleClient, proto.RegisterArgs{Role: proto.NodeDevice, Key: "k", Addr: ":1"}, "want device on a device connection"},
			{"no key", proto.RoleDevice, proto.RegisterArgs{Role: proto.NodeDevice, Addr: ":1"}, "needs a key"},
			{"bad addr", proto.RoleDevice, proto.RegisterArgs{Role: proto.NodeDevice, Key: "k", Addr: "nohost"}, "listen address"},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				c, err := proto.Dial(ctx, tr.Addr(), proto.DialOptions{Role: tc.role, Logger: quietLogger()})
				check.NoError(t, err)
				defer c.Close()
				err = c.Call(ctx, proto.MethodTrackerRegister, tc.args, nil)
				check.ErrorIs(t, err, proto.ErrBadRequest)
				check.Error(t, err, tc.want)
			})
		}
	})
}

func TestWrongToken(t *testing.T) {
	cfg := fastConfig(t)
	cfg.Token = "s3cret"
	tr := startTracker(t, cfg)
	_, err := client.DialTracker(testCtx(t), tr.Addr(), client.TrackerOptions{Token: "wrong", Logger: quietLogger()})
	check.ErrorIs(t, err, proto.ErrUnauthorized)
	r := client.NewRegistrar(tr.Addr(), client.TrackerOptions{Token: "wrong", Logger: quietLogger()},
		proto.RegisterArgs{Role: proto.NodeDevice, Key: "k", Addr: ":1"})
	err = r.Run(testCtx(t))
	check.ErrorIs(t, err, proto.ErrUnauthorized)
	tc, err := client.DialTracker(testCtx(t), tr.Addr(), client.TrackerOptions{Token: "s3cret", Logger: quietLogger()})
	check.NoError(t, err)
	tc.Close()
}

func TestQuarantine(t *testing.T) {
	cfg := fastConfig(t)
	cfg.QuarantineAfter = 2
	tr := startTracker(t, cfg)
	ctx := testCtx(t)
	healthy := make(chan bool, 1)
	healthy <- false
	r, _ := device(t, tr.Addr(), "q", proto.NodeAttrs{}, func(r *client.Registrar) {
		r.OnHealthCheck = func(ctx context.Context) error {
			ok := <-healthy
			healthy <- ok
			if !ok {
				return context.DeadlineExceeded
			}
			return nil
		}
	})
	tc := dialTracker(t, tr.Addr())
	for i := range 2 {
		l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "q"})
		check.NoError(t, err)
		check.NoError(t, l.ReportFailure(ctx, "kernel crashed"), i)
		check.NoError(t, l.Release(ctx))
	}
	check.Equal(t, nodeState(tr.Server, r.NodeID()), proto.StateQuarantined)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := tc.RequestLease(short, client.LeaseRequest{Key: "q"})
	cancel()
	check.ErrorIs(t, err, proto.ErrDeadline)
	check.Error(t, err, "every matching device stayed busy")
	// A failing health check keeps it quarantined; a passing one lifts it.
	eventually(t, "a failed health check", func() bool {
		for _, d := range tr.Summary(0).Devices {
			if d.NodeID == r.NodeID() && d.LastError != "" && d.LastError != "kernel crashed" {
				return true
			}
		}
		return false
	})
	check.Equal(t, nodeState(tr.Server, r.NodeID()), proto.StateQuarantined)
	<-healthy
	healthy <- true
	eventually(t, "quarantine lifted", func() bool { return nodeState(tr.Server, r.NodeID()) == proto.StateFree })
	l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "q"})
	check.NoError(t, err)
	check.NoError(t, l.Release(ctx))
}

// TestNodeIDKept: a Registrar with a NodeIDFile keeps the id the tracker
// gave it there, and a restarted node registers under the same id.
func TestNodeIDKept(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	file := filepath.Join(t.TempDir(), "node-id")
	start := func() (*client.Registrar, func()) {
		r := client.NewRegistrar(tr.Addr(), client.TrackerOptions{Logger: quietLogger(), NodeIDFile: file}, proto.RegisterArgs{
			Role: proto.NodeDevice, Key: "cpu", Addr: "127.0.0.1:1",
		})
		return r, runRegistrar(t, r)
	}
	first, stop := start()
	id := first.NodeID()
	check.True(t, id != "", "no node id")
	b, err := os.ReadFile(file)
	check.NoError(t, err)
	check.Equal(t, strings.TrimSpace(string(b)), id)
	stop()
	eventually(t, "deregistration", func() bool { return nodeState(tr.Server, id) == "" })

	again, _ := start()
	check.Equal(t, again.NodeID(), id)
	check.Equal(t, nodeState(tr.Server, id), proto.StateFree)
	check.Equal(t, len(tr.Summary(0).Devices), 1)

	// A file that holds no id is passed over: the tracker chooses one.
	check.NoError(t, os.WriteFile(file, []byte("two words\n"), 0o600))
	r := client.NewRegistrar(tr.Addr(), client.TrackerOptions{Logger: quietLogger(), NodeIDFile: file}, proto.RegisterArgs{Role: proto.NodeDevice, Key: "cpu", Addr: "127.0.0.1:1"})
	check.Equal(t, r.NodeID(), "")
}
