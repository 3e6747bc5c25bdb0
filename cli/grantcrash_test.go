package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestFailTrackerKilledMidGrants kills -9 a real `kiln tracker` process while
// eight clients request leases as fast as they can. After a restart on the
// same data, every lease a client was told it holds is known to the tracker
// (the device verifies it), and none of those devices is granted again: a
// grant is answered only once it is durable.
func TestFailTrackerKilledMidGrants(t *testing.T) {
	ctx := failCtx(t)
	f := newProcFleet(t, 250*time.Millisecond)
	f.startTracker("")

	// Simulated devices: registrars in this process, each on its own
	// connection, which register again by themselves after the restart.
	const devices, clients, killAfter = 60, 8, 20
	regs := map[string]*client.Registrar{}
	rctx, stopRegs := context.WithCancel(context.Background())
	var rwg sync.WaitGroup
	t.Cleanup(func() { stopRegs(); rwg.Wait() })
	for i := range devices {
		addr := fmt.Sprintf("127.0.0.1:%d", 20000+i)
		r := client.NewRegistrar(f.trackerAddr, client.TrackerOptions{Token: f.tok, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
			proto.RegisterArgs{Role: proto.NodeDevice, Key: "burst", Addr: addr})
		regs[addr] = r
		rwg.Go(func() { r.Run(rctx) })
	}
	f.waitFree("burst", devices)

	// The burst: each client asks for a lease, again and again, until a
	// request fails (the tracker is gone) or every device is taken.
	var mu sync.Mutex
	var received []*client.Lease
	enough := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for range clients {
		tc := f.dialTracker(ctx)
		wg.Go(func() {
			for {
				short, cancel := context.WithTimeout(ctx, 2*time.Second)
				l, err := tc.RequestLease(short, client.LeaseRequest{Key: "burst", NoRenew: true, TTL: time.Hour, User: "burst"})
				cancel()
				if err != nil {
					return
				}
				mu.Lock()
				received = append(received, l)
				if len(received) >= killAfter {
					once.Do(func() { close(enough) })
				}
				mu.Unlock()
			}
		})
	}
	select {
	case <-enough:
	case <-ctx.Done():
		t.Fatal("the burst did not get going")
	}
	addr := f.trackerAddr
	f.tracker.kill9(t)
	wg.Wait()
	mu.Lock()
	held := append([]*client.Lease(nil), received...)
	mu.Unlock()
	check.True(t, len(held) >= killAfter && len(held) < devices, "grants received before the kill:", len(held))
	seen := map[string]bool{}
	for _, l := range held {
		check.True(t, !seen[l.Addr], "device granted twice before the kill:", l.Addr)
		seen[l.Addr] = true
	}

	f.startTracker(addr)
	eventually(t, "every device registers again", func() bool {
		for _, k := range f.query().Keys {
			if k.Key == "burst" {
				return k.Free+k.Busy == devices
			}
		}
		return false
	})

	// Every received grant is there: its device verifies it with the new
	// tracker process.
	for _, l := range held {
		info, err := regs[l.Addr].VerifyLease(ctx, l.Token)
		check.NoError(t, err, "lease", l.ID, "on", l.Addr, "lost in the crash")
		check.Equal(t, info.ID, l.ID)
	}

	// And none of their devices is granted again: lease everything that
	// is left.
	tc := f.dialTracker(ctx)
	for {
		short, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		l, err := tc.RequestLease(short, client.LeaseRequest{Key: "burst", NoRenew: true, TTL: time.Hour, User: "after"})
		cancel()
		if errors.Is(err, proto.ErrDeadline) {
			break
		}
		check.NoError(t, err)
		check.True(t, !seen[l.Addr], "device granted a second time after the restart:", l.Addr)
		seen[l.Addr] = true
	}
}
