package tracker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

func TestLeasePriorityFIFO(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	device(t, tr.Addr(), "k", proto.NodeAttrs{})
	tc := dialTracker(t, tr.Addr())
	first, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "k"})
	check.NoError(t, err)

	// Queue requests one by one so arrival order is known.
	reqs := []struct {
		name     string
		priority int
	}{{"a", 0}, {"b", 0}, {"c", 5}, {"d", 0}, {"e", 5}}
	var wg sync.WaitGroup
	got := make(chan *client.Lease, len(reqs))
	names := map[string]string{} // lease id → request name
	var mu sync.Mutex
	for i, r := range reqs {
		wg.Go(func() {
			l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "k", Priority: r.priority, User: r.name})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			names[l.ID] = r.name
			mu.Unlock()
			got <- l
		})
		eventually(t, "request queued", func() bool { return queueLen(tr.Server, "k") == i+1 })
	}
	// The summary lists them in grant order.
	var order []string
	for _, w := range tr.Summary(0).Queues[0].Waiting {
		order = append(order, w.User)
	}
	check.Equal(t, order, []string{"c", "e", "a", "b", "d"})

	check.NoError(t, first.Release(ctx))
	var granted []string
	for range reqs {
		l := <-got
		mu.Lock()
		granted = append(granted, names[l.ID])
		mu.Unlock()
		check.NoError(t, l.Release(ctx))
	}
	wg.Wait()
	check.Equal(t, granted, []string{"c", "e", "a", "b", "d"})
}

func TestLeaseSelector(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	old, _ := device(t, tr.Addr(), "gpu", proto.NodeAttrs{DeviceTypes: []string{"cuda"}, CUDACompute: "7.5"})
	ampere, _ := device(t, tr.Addr(), "gpu", proto.NodeAttrs{DeviceTypes: []string{"cuda"}, CUDACompute: "8.6", CPUFeatures: []string{"avx512f"}})
	tc := dialTracker(t, tr.Addr())
	tests := []struct {
		name, key, sel string
		want           string
	}{
		{"compute", "gpu", "cuda.compute>=8.0", ampere.NodeID()},
		{"compute below", "", "cuda.compute<8", old.NodeID()},
		{"avx512 any key", "", "cpu.avx512=true", ampere.NodeID()},
		{"key attribute", "", "key=gpu,cuda.compute=7.5", old.NodeID()},
	}
	for _, tc2 := range tests {
		t.Run(tc2.name, func(t *testing.T) {
			l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: tc2.key, Selector: tc2.sel})
			check.NoError(t, err)
			check.Equal(t, l.NodeID, tc2.want)
			check.NoError(t, l.Release(ctx))
		})
	}
	t.Run("parse error", func(t *testing.T) {
		_, err := tc.RequestLease(ctx, client.LeaseRequest{Selector: "cuda.compute>="})
		check.ErrorIs(t, err, proto.ErrBadRequest)
		check.Error(t, err, `parse selector "cuda.compute>="`, "missing value")
	})
	t.Run("selector nobody matches", func(t *testing.T) {
		short, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
		defer cancel()
		_, err := tc.RequestLease(short, client.LeaseRequest{Selector: "cuda.compute>=9.0"})
		check.ErrorIs(t, err, proto.ErrDeadline)
		check.Error(t, err, `selector "cuda.compute>=9.0"`, "no live device serves it")
	})
}

// TestLeaseUnserved: a request no registered device could serve is
// refused at once, naming what it asked for: with FailUnserved when no
// device matches its key and selector, and always when every one that
// does is of another architecture than its artifact. A device of the
// artifact's architecture, or of none registered, is granted.
func TestLeaseUnserved(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	x86, _ := device(t, tr.Addr(), "cpu", proto.NodeAttrs{Triple: "x86_64-linux-gnu", CPUCores: 4})
	board, _ := device(t, tr.Addr(), "rpi", proto.NodeAttrs{Triple: "aarch64-linux-gnu", CPUCores: 4})
	anon, _ := device(t, tr.Addr(), "anon", proto.NodeAttrs{CPUCores: 2})
	tc := dialTracker(t, tr.Addr())
	for _, tt := range []struct {
		name string
		req  client.LeaseRequest
		want []string
		is   error
	}{
		{"selector", client.LeaseRequest{Selector: "cores>=64", FailUnserved: true},
			[]string{`no registered device that matches selector "cores>=64"`}, proto.ErrNotFound},
		{"key and selector", client.LeaseRequest{Key: "cpu", Selector: "cpu.avx512", FailUnserved: true},
			[]string{`no device registered under key "cpu" that matches selector "cpu.avx512"`}, proto.ErrNotFound},
		{"key", client.LeaseRequest{Key: "tpu", FailUnserved: true},
			[]string{`no device registered under key "tpu"`}, proto.ErrNotFound},
		{"arch", client.LeaseRequest{Key: "cpu", Arch: "arm64"},
			[]string{"the artifact is built for arm64", `every device registered under key "cpu" is amd64`}, proto.ErrBadRequest},
		{"arch and selector", client.LeaseRequest{Selector: "cores>=4", Arch: "riscv64", FailUnserved: true},
			[]string{"the artifact is built for riscv64", `every registered device that matches selector "cores>=4" is amd64 or arm64`}, proto.ErrBadRequest},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The test's context has no short deadline: only an
			// answer at once passes.
			_, err := tc.RequestLease(ctx, tt.req)
			check.ErrorIs(t, err, tt.is)
			check.Error(t, err, tt.want...)
		})
	}
	for _, tt := range []struct {
		name string
		req  client.LeaseRequest
		want string
	}{
		{"arch of the device", client.LeaseRequest{Selector: "cores>=4", Arch: "arm64", FailUnserved: true}, board.NodeID()},
		{"no arch registered", client.LeaseRequest{Key: "anon", Arch: "arm64", FailUnserved: true}, anon.NodeID()},
		{"no arch asked", client.LeaseRequest{Key: "cpu", FailUnserved: true}, x86.NodeID()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, err := tc.RequestLease(ctx, tt.req)
			check.NoError(t, err)
			check.Equal(t, l.NodeID, tt.want)
			check.NoError(t, l.Release(ctx))
		})
	}
}

func TestLeaseExpiry(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	dev, _ := device(t, tr.Addr(), "k", proto.NodeAttrs{})
	tc := dialTracker(t, tr.Addr())

	l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "k", TTL: 150 * time.Millisecond, NoRenew: true, SessionTimeout: time.Minute})
	check.NoError(t, err)
	info, err := dev.VerifyLease(ctx, l.Token)
	check.NoError(t, err)
	check.Equal(t, info.ID, l.ID)
	check.Equal(t, info.SessionTimeout, time.Minute)
	check.Equal(t, nodeState(tr.Server, dev.NodeID()), proto.StateBusy)

	eventually(t, "lease expiry", func() bool { return nodeState(tr.Server, dev.NodeID()) == proto.StateFree })
	_, err = dev.VerifyLease(ctx, l.Token)
	check.ErrorIs(t, err, proto.ErrNotFound)
	check.ErrorIs(t, l.Renew(ctx), proto.ErrSessionExpired)

	t.Run("renewed lease outlives its TTL", func(t *testing.T) {
		l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "k", TTL: 500 * time.Millisecond})
		check.NoError(t, err)
		time.Sleep(1100 * time.Millisecond) // more than two TTLs: renewals (every TTL/3) keep it
		check.NoError(t, l.Err())
		_, err = dev.VerifyLease(ctx, l.Token)
		check.NoError(t, err)
		check.NoError(t, l.Release(ctx))
		_, err = dev.VerifyLease(ctx, l.Token)
		check.ErrorIs(t, err, proto.ErrNotFound)
	})

	t.Run("token for another node", func(t *testing.T) {
		other, _ := device(t, tr.Addr(), "other", proto.NodeAttrs{})
		l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "k"})
		check.NoError(t, err)
		defer l.Release(ctx)
		_, err = other.VerifyLease(ctx, l.Token)
		check.ErrorIs(t, err, proto.ErrBadRequest)
	})
}

func TestLeaseQueuePositionAndDeadline(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	tc := dialTracker(t, tr.Addr())
	var positions []int
	short, cancel := context.WithTimeout(ctx, 400*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := tc.RequestLease(short, client.LeaseRequest{Key: "nobody", OnPosition: func(p int, q string) { positions = append(positions, p) }})
		done <- err
	}()
	eventually(t, "queued", func() bool { return queueLen(tr.Server, "nobody") == 1 })
	sum := tr.Summary(0)
	check.Equal(t, sum.Keys, []proto.KeySummary{{Key: "nobody", Pending: 1}})
	check.Equal(t, sum.Queues[0].Waiting[0].Position, 1)
	err := <-done
	check.ErrorIs(t, err, proto.ErrDeadline)
	// The client's message or the tracker's, whichever came first.
	check.Error(t, err, `key "nobody"`, "gave up at", "queue position 1", "no live device serves it")
	check.Equal(t, positions, []int{1})
	eventually(t, "queue emptied", func() bool { return queueLen(tr.Server, "nobody") == 0 })

	t.Run("tracker-side deadline", func(t *testing.T) {
		c, err := proto.Dial(ctx, tr.Addr(), proto.DialOptions{Logger: quietLogger()})
		check.NoError(t, err)
		defer c.Close()
		var tk proto.LeaseTicket
		args := proto.LeaseRequestArgs{Key: "nobody", Deadline: time.Now().Add(150 * time.Millisecond), Wait: time.Second}
		err = c.Call(ctx, proto.MethodLeaseRequest, args, &tk)
		for err == nil && tk.Lease == nil {
			err = c.Call(ctx, proto.MethodLeaseWait, proto.LeaseWaitArgs{Ticket: tk.Ticket}, &tk)
		}
		check.ErrorIs(t, err, proto.ErrDeadline)
		check.Error(t, err, `lease request for key "nobody": gave up at its deadline`, "no live device serves it")
	})

	t.Run("dropped connection drops its requests", func(t *testing.T) {
		c, err := proto.Dial(ctx, tr.Addr(), proto.DialOptions{Logger: quietLogger()})
		check.NoError(t, err)
		var tk proto.LeaseTicket
		check.NoError(t, c.Call(ctx, proto.MethodLeaseRequest, proto.LeaseRequestArgs{Key: "nobody", Wait: time.Millisecond}, &tk))
		check.Equal(t, queueLen(tr.Server, "nobody"), 1)
		c.Close()
		eventually(t, "queue emptied", func() bool { return queueLen(tr.Server, "nobody") == 0 })
	})
}
