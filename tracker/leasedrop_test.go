package tracker

import (
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestLeaseFreedWhenHolderDrops: as TVM's tracker frees a server whose
// client's connection drops, a lease whose holder's connection closes (a
// killed client) is released at once, long before its TTL, and the device
// goes to the next request in the queue; a lease renewed on another
// connection (a client that reconnected) has moved there and survives the
// first one's close.
func TestLeaseFreedWhenHolderDrops(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	device(t, tr.Addr(), "k", proto.NodeAttrs{})
	request := func(c *proto.Client) *proto.Lease {
		t.Helper()
		var tk proto.LeaseTicket
		check.NoError(t, c.Call(ctx, proto.MethodLeaseRequest, proto.LeaseRequestArgs{Key: "k", TTL: time.Hour, Wait: guard}, &tk))
		check.True(t, tk.Lease != nil, "granted")
		return tk.Lease
	}

	holder, err := rawDial(t, tr.Addr(), "", proto.RoleClient)
	check.NoError(t, err)
	held := request(holder)
	waiter := dialTracker(t, tr.Addr())
	granted := make(chan *client.Lease, 1)
	go func() {
		l, err := waiter.RequestLease(ctx, client.LeaseRequest{Key: "k", NoRenew: true})
		if err != nil {
			t.Error(err)
		}
		granted <- l
	}()
	eventually(t, "second request queued", func() bool { return queueLen(tr.Server, "k") == 1 })

	holder.Close()
	var next *client.Lease
	select {
	case next = <-granted:
	case <-time.After(guard):
		t.Fatal("the queued request was not granted after the holder's connection closed")
	}
	check.True(t, next != nil && next.ID != held.ID, "a new lease")
	check.NoError(t, next.Release(ctx))

	// Renewed on a second connection, the lease no longer ends with the
	// first.
	first, err := rawDial(t, tr.Addr(), "", proto.RoleClient)
	check.NoError(t, err)
	moved := request(first)
	second, err := rawDial(t, tr.Addr(), "", proto.RoleClient)
	check.NoError(t, err)
	check.NoError(t, second.Call(ctx, proto.MethodLeaseRenew, proto.LeaseRenewArgs{ID: moved.ID, Token: moved.Token}, nil))
	// A request queued on the first connection is dropped by the same
	// disconnect that would release its leases: once the queue is empty,
	// the lease's fate is known.
	go func() {
		var tk proto.LeaseTicket
		first.Call(ctx, proto.MethodLeaseRequest, proto.LeaseRequestArgs{Key: "k", Wait: guard}, &tk)
	}()
	eventually(t, "a request queued on the first connection", func() bool { return queueLen(tr.Server, "k") == 1 })
	first.Close()
	eventually(t, "the first connection's request dropped", func() bool { return queueLen(tr.Server, "k") == 0 })
	check.Equal(t, tr.Summary(0).Leases, 1)
	check.NoError(t, second.Call(ctx, proto.MethodLeaseRelease, proto.LeaseRenewArgs{ID: moved.ID, Token: moved.Token}, nil))
}

// TestReplicaKeepsLeaseOfDroppedHolder: on a replicated tracker a lease
// outlives its holder's connection, which a follower forwarded to the
// leader (the follower may have died, the client is failing over): it
// stays granted and renews on the holder's next connection, through
// another replica.
func TestReplicaKeepsLeaseOfDroppedHolder(t *testing.T) {
	rs := startReplicas(t)
	ctx := testCtx(t)
	lead := rs.leader(t, -1)
	follower := rs.reps[(lead+1)%3]
	spare := rs.reps[(lead+2)%3]
	eventually(t, "the followers know the leader", func() bool { return follower.Ready() == nil && spare.Ready() == nil })
	term := rs.reps[lead].rep.currentTerm()
	device(t, spare.Addr(), "k", proto.NodeAttrs{})
	eventually(t, "the device registered", func() bool { return len(term.Summary(0).Devices) > 0 })

	first, err := rawDial(t, follower.Addr(), "", proto.RoleClient)
	check.NoError(t, err)
	var tk proto.LeaseTicket
	check.NoError(t, first.Call(ctx, proto.MethodLeaseRequest, proto.LeaseRequestArgs{Key: "k", TTL: time.Hour, Wait: guard}, &tk))
	check.True(t, tk.Lease != nil, "granted")
	held := tk.Lease
	// A request queued on the same connection is dropped by the
	// disconnect that would release the lease: once the queue is empty,
	// the leader has handled the close.
	go func() {
		var tk proto.LeaseTicket
		first.Call(ctx, proto.MethodLeaseRequest, proto.LeaseRequestArgs{Key: "k", Wait: guard}, &tk)
	}()
	eventually(t, "a request queued on the first connection", func() bool { return queueLen(term, "k") == 1 })
	first.Close()
	eventually(t, "the first connection's request dropped", func() bool { return queueLen(term, "k") == 0 })
	check.Equal(t, term.Summary(0).Leases, 1)

	second, err := rawDial(t, spare.Addr(), "", proto.RoleClient)
	check.NoError(t, err)
	var renewed proto.Lease
	check.NoError(t, second.Call(ctx, proto.MethodLeaseRenew, proto.LeaseRenewArgs{ID: held.ID, Token: held.Token}, &renewed))
	check.True(t, renewed.Expires.After(held.Expires), "renewed", renewed.Expires, held.Expires)
	check.NoError(t, second.Call(ctx, proto.MethodLeaseRelease, proto.LeaseRenewArgs{ID: held.ID, Token: held.Token}, nil))
}
