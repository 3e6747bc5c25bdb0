package tracker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// capacityDevice registers a device with max_sessions and sandboxed.
func capacityDevice(t *testing.T, addr, key string, maxSessions int, sandboxed bool) *client.Registrar {
	t.Helper()
	r := client.NewRegistrar(addr, client.TrackerOptions{Logger: quietLogger()}, proto.RegisterArgs{
		Role: proto.NodeDevice, Key: key, Addr: "127.0.0.1:1", MaxSessions: maxSessions, Sandboxed: sandboxed,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	select {
	case <-r.Ready():
	case <-time.After(guard):
		t.Fatal("device did not register")
	}
	return r
}

// TestLeaseCapacity: a sandboxed device that serves two sessions gets two
// concurrent leases and never a third; a device that is not sandboxed gets
// one whatever max_sessions it declares. A released lease makes room, and
// a heartbeat names exactly the served leases that ended.
func TestLeaseCapacity(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	shared := capacityDevice(t, tr.Addr(), "shared", 2, true)
	capacityDevice(t, tr.Addr(), "plain", 2, false)
	tc := dialTracker(t, tr.Addr())

	lease := func(key string) (*client.Lease, error) {
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		return tc.RequestLease(wctx, client.LeaseRequest{Key: key})
	}
	a, err := lease("shared")
	check.NoError(t, err)
	check.Equal(t, nodeState(tr.Server, shared.NodeID()), proto.StateFree, "one of two leases out")
	b, err := lease("shared")
	check.NoError(t, err)
	check.True(t, a.ID != b.ID && a.Token != b.Token, "two distinct leases")
	check.Equal(t, nodeState(tr.Server, shared.NodeID()), proto.StateBusy, "both leases out")
	_, err = lease("shared")
	check.True(t, errors.Is(err, proto.ErrDeadline), "a third lease on a two-session device: %v", err)

	p, err := lease("plain")
	check.NoError(t, err)
	_, err = lease("plain")
	check.True(t, errors.Is(err, proto.ErrDeadline), "a second lease on an unsandboxed device: %v", err)
	check.NoError(t, p.Release(ctx))

	// The daemon serves both; the tracker verifies each for this device.
	for _, l := range []*client.Lease{a, b} {
		_, err := shared.VerifyLease(ctx, l.Token)
		check.NoError(t, err)
	}
	ended := make(chan string, 4)
	shared.WatchLeases(func(id string) { ended <- id })
	shared.SetActiveLeases([]string{a.ID, b.ID})
	check.NoError(t, a.Release(ctx))
	select {
	case id := <-ended:
		check.Equal(t, id, a.ID, "the released lease")
	case <-ctx.Done():
		t.Fatal("no heartbeat reported the released lease")
	}
	shared.SetActiveLeases([]string{b.ID})
	eventually(t, "room for one more lease", func() bool { return nodeState(tr.Server, shared.NodeID()) == proto.StateFree })
	c, err := lease("shared")
	check.NoError(t, err)
	select {
	case id := <-ended:
		t.Fatalf("lease %s reported ended while held", id)
	default:
	}
	check.NoError(t, b.Release(ctx))
	check.NoError(t, c.Release(ctx))
}
