package tracker

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestFailoverAcrossRestart keeps one client connection, one device and
// one compiler node through a tracker restart on the same address (its
// state survives in its data directory): a lease renewing itself keeps
// renewing, a lease request waiting for that device is queued again and
// granted once the lease is released (the device is never leased twice),
// a client waiting for a build job follows the same job to its end, and
// the compiler node registers again and builds the requeued job once.
func TestFailoverAcrossRestart(t *testing.T) {
	cfg := fastConfig(t)
	a := startTracker(t, cfg)
	ctx := testCtx(t)
	opts := client.TrackerOptions{Logger: quietLogger(), FailoverTimeout: guard}
	dev, _ := device(t, a.Addr(), "k", proto.NodeAttrs{})
	cpu, _ := compiler(t, a.Addr(), "cpu")
	tc, err := client.DialTracker(ctx, a.Addr(), opts)
	check.NoError(t, err)
	defer tc.Close()

	held, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "k", TTL: 600 * time.Millisecond})
	check.NoError(t, err)
	type result struct {
		l   *client.Lease
		err error
	}
	waiting := make(chan result, 1)
	go func() {
		l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "k", NoRenew: true})
		waiting <- result{l, err}
	}()
	eventually(t, "second request queued", func() bool { return queueLen(a.Server, "k") == 1 })

	j, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "failover", Module: module, Target: "cpu"})
	check.NoError(t, err)
	taken, err := cpu.TakeJob(ctx, guard)
	check.NoError(t, err)
	check.Equal(t, taken.ID, j.ID)
	built := make(chan error, 1)
	go func() {
		_, err := tc.WaitBuild(ctx, j.ID, nil)
		built <- err
	}()

	stored := []byte("stored before the restart")
	check.NoError(t, tc.UploadArtifact(ctx, sha(stored), int64(len(stored)), bytes.NewReader(stored)))

	a.stop(t)
	cfg.Listen = a.Addr()
	b := startTracker(t, cfg)

	// Artifacts come back through the new connection.
	var back bytes.Buffer
	_, err = tc.DownloadArtifact(ctx, sha(stored), &back)
	check.NoError(t, err)
	check.Equal(t, back.String(), string(stored))

	// The waiting request is queued again on the new tracker; the device
	// stays with the first lease until it is released.
	eventually(t, "request queued again", func() bool { return queueLen(b.Server, "k") == 1 })
	eventually(t, "device registered again", func() bool { return nodeState(b.Server, dev.NodeID()) == proto.StateBusy })
	before := held.Expiry()
	eventually(t, "lease renewed on the new tracker", func() bool { return held.Expiry().After(before) })
	check.NoError(t, held.Err())
	select {
	case r := <-waiting:
		t.Fatalf("second request answered while the device was leased: %v, %v", r.l, r.err)
	default:
	}
	check.NoError(t, held.Release(ctx))
	var r result
	select {
	case r = <-waiting:
	case <-time.After(guard):
		t.Fatal("second request not granted after the release")
	}
	check.NoError(t, r.err)
	check.Equal(t, r.l.NodeID, dev.NodeID())
	check.True(t, r.l.ID != held.ID, r.l.ID, held.ID)

	// The compiler node's old claim is gone with the old process: it
	// takes the requeued job again and completes it once.
	art := []byte("artifact")
	eventually(t, "compiler takes the requeued job", func() bool {
		got, err := cpu.TakeJob(ctx, 100*time.Millisecond)
		return err == nil && got != nil && got.ID == j.ID
	})
	check.NoError(t, cpu.UploadArtifact(ctx, sha(art), int64(len(art)), bytes.NewReader(art)))
	check.NoError(t, cpu.CompleteJob(ctx, j.ID, sha(art), ""))
	select {
	case err := <-built:
		check.NoError(t, err)
	case <-time.After(guard):
		t.Fatal("WaitBuild did not follow the job to its end")
	}
	sum, err := tc.Query(ctx, 0)
	check.NoError(t, err)
	check.Equal(t, len(sum.Jobs), 1)
	check.Equal(t, sum.Jobs[0].State, proto.JobSucceeded)
	check.Equal(t, sum.Jobs[0].Attempt, 2)
}

// TestFailoverDeadFirstAddress: a client, a device and a compiler node
// given two tracker addresses, the first with nothing behind it, reach the
// second.
func TestFailoverDeadFirstAddress(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	list := deadAddr(t) + "," + tr.Addr()
	tc, err := client.DialTracker(ctx, list, client.TrackerOptions{Logger: quietLogger()})
	check.NoError(t, err)
	defer tc.Close()
	check.Equal(t, tc.Addr(), tr.Addr())
	dev, _ := device(t, list, "k", proto.NodeAttrs{})
	cpu, _ := compiler(t, list, "cpu")
	l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "k", NoRenew: true})
	check.NoError(t, err)
	check.Equal(t, l.NodeID, dev.NodeID())
	_, err = dev.VerifyLease(ctx, l.Token)
	check.NoError(t, err)
	j, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: module, Target: "cpu"})
	check.NoError(t, err)
	got, err := cpu.TakeJob(ctx, guard)
	check.NoError(t, err)
	check.Equal(t, got.ID, j.ID)
}

// TestFailoverGivesUp: with every tracker gone, a call fails after the
// failover time with an error that names the addresses tried and wraps
// ErrUnavailable; a Registrar's call between connections does likewise.
func TestFailoverGivesUp(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	opts := client.TrackerOptions{Logger: quietLogger(), FailoverTimeout: 300 * time.Millisecond}
	tc, err := client.DialTracker(ctx, tr.Addr(), opts)
	check.NoError(t, err)
	defer tc.Close()
	r := client.NewRegistrar(tr.Addr(), opts, proto.RegisterArgs{Role: proto.NodeDevice, Key: "k", Addr: "127.0.0.1:1"})
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go r.Run(rctx)
	<-r.Ready()
	tr.stop(t)
	_, err = tc.Query(ctx, 0)
	check.ErrorIs(t, err, proto.ErrUnavailable)
	check.Error(t, err, tr.Addr())
	eventually(t, "registrar notices", func() bool { return r.Connected() != nil })
	_, err = r.VerifyLease(ctx, "x")
	check.ErrorIs(t, err, proto.ErrUnavailable)
}

// TestSubmitKeyOnce: a submission sent again with the same key (a client
// whose connection failed mid-submit) answers the first job, even across
// a restart; another key queues another job.
func TestSubmitKeyOnce(t *testing.T) {
	cfg := fastConfig(t)
	a := startTracker(t, cfg)
	ctx := testCtx(t)
	compiler(t, a.Addr(), "cpu")
	tc := dialTracker(t, a.Addr())
	args := proto.BuildSubmitArgs{Module: module, Target: "cpu", SubmitKey: "k1"}
	j1, err := tc.SubmitBuild(ctx, args)
	check.NoError(t, err)
	again, err := tc.SubmitBuild(ctx, args)
	check.NoError(t, err)
	check.Equal(t, again.ID, j1.ID)
	args.SubmitKey = "k2"
	j2, err := tc.SubmitBuild(ctx, args)
	check.NoError(t, err)
	check.True(t, j2.ID != j1.ID)

	a.stop(t)
	cfg.Listen = a.Addr()
	b := startTracker(t, cfg)
	compiler(t, b.Addr(), "cpu")
	tc = dialTracker(t, b.Addr())
	args.SubmitKey = "k1"
	again, err = tc.SubmitBuild(ctx, args)
	check.NoError(t, err)
	check.Equal(t, again.ID, j1.ID)
}

// TestLeaseRequestKeyOnce: a lease request sent again with its
// RequestKey (its client lost the answer with a tracker that stopped)
// answers the lease granted to it, across a restart too, and never a
// second one; a retry while the first request still waits on another
// connection takes its place.
func TestLeaseRequestKeyOnce(t *testing.T) {
	cfg := fastConfig(t)
	a := startTracker(t, cfg)
	ctx := testCtx(t)
	device(t, a.Addr(), "k", proto.NodeAttrs{})
	request := func(c *proto.Client, key string) (proto.LeaseTicket, error) {
		var tk proto.LeaseTicket
		err := c.Call(ctx, proto.MethodLeaseRequest, proto.LeaseRequestArgs{Key: "k", RequestKey: key, Wait: 50 * time.Millisecond}, &tk)
		return tk, err
	}
	c1, err := rawDial(t, a.Addr(), "", proto.RoleClient)
	check.NoError(t, err)
	first, err := request(c1, "r1")
	check.NoError(t, err)
	check.True(t, first.Lease != nil, "granted")
	again, err := request(c1, "r1")
	check.NoError(t, err)
	check.Equal(t, again.Lease.ID, first.Lease.ID)

	a.stop(t)
	cfg.Listen = a.Addr()
	b := startTracker(t, cfg)
	device(t, b.Addr(), "k", proto.NodeAttrs{}) // another device: a second grant would find it free
	c2, err := rawDial(t, b.Addr(), "", proto.RoleClient)
	check.NoError(t, err)
	again, err = request(c2, "r1")
	check.NoError(t, err)
	check.Equal(t, again.Lease.ID, first.Lease.ID)
	check.Equal(t, b.Summary(0).Leases, 1)

	// The second device is taken; a request for a third waits on c2, and
	// its retry on c3 replaces it.
	_, err = request(c2, "r2")
	check.NoError(t, err)
	waiting, err := request(c2, "r3")
	check.NoError(t, err)
	check.True(t, waiting.Lease == nil && waiting.Ticket != "", "queued")
	c3, err := rawDial(t, b.Addr(), "", proto.RoleClient)
	check.NoError(t, err)
	retried, err := request(c3, "r3")
	check.NoError(t, err)
	err = c2.Call(ctx, proto.MethodLeaseWait, proto.LeaseWaitArgs{Ticket: waiting.Ticket}, nil)
	check.ErrorIs(t, err, proto.ErrNotFound)
	check.Equal(t, queueLen(b.Server, "k"), 1)

	// Released, the first device goes to the retried request, and the
	// first key, asked again, waits for a new lease.
	check.NoError(t, c2.Call(ctx, proto.MethodLeaseRelease, proto.LeaseRenewArgs{ID: first.Lease.ID, Token: first.Lease.Token}, nil))
	var tk proto.LeaseTicket
	check.NoError(t, c3.Call(ctx, proto.MethodLeaseWait, proto.LeaseWaitArgs{Ticket: retried.Ticket}, &tk))
	check.True(t, tk.Lease != nil && tk.Lease.ID != first.Lease.ID, "a new lease for the retried request")
	again, err = request(c2, "r1")
	check.NoError(t, err)
	check.True(t, again.Lease == nil, "the released lease is not answered again")
}
