package tracker

import (
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestLeaseEndedHeartbeat: a device serving a lease that was released, or
// that expired, hears so in its next heartbeat reply.
func TestLeaseEndedHeartbeat(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	dev, _ := device(t, tr.Addr(), "k", proto.NodeAttrs{})
	ended := make(chan string, 4)
	dev.WatchLeases(func(id string) { ended <- id })
	tc := dialTracker(t, tr.Addr())

	for _, how := range []string{"released", "expired"} {
		l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "k", TTL: 300 * time.Millisecond, NoRenew: how == "expired"})
		check.NoError(t, err)
		info, err := dev.VerifyLease(ctx, l.Token)
		check.NoError(t, err)
		dev.SetActiveLease(info.ID)
		// Heartbeats while the lease is held say nothing of it.
		time.Sleep(150 * time.Millisecond)
		select {
		case id := <-ended:
			t.Fatalf("lease %s reported ended while held", id)
		default:
		}
		if how == "released" {
			check.NoError(t, l.Release(ctx))
		}
		select {
		case id := <-ended:
			check.Equal(t, id, info.ID, how)
		case <-ctx.Done():
			t.Fatalf("no heartbeat reported the %s lease", how)
		}
		dev.SetActiveLease("")
		eventually(t, "device free", func() bool { return nodeState(tr.Server, dev.NodeID()) == proto.StateFree })
	}
}
