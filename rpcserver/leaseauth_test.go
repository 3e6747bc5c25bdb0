package rpcserver_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// leasedFleet is a real tracker with a users file (alice) and two device
// daemons, keys "a" and "b", registered with it under the fleet token.
type leasedFleet struct {
	tracker string
	alice   string
	users   string // the users file
	a, b    *testDaemon
}

func startLeasedFleet(t *testing.T) *leasedFleet {
	t.Helper()
	users := filepath.Join(t.TempDir(), "users")
	alice, err := tracker.CreateUserToken(users, "alice", "client")
	check.NoError(t, err)
	tr, err := tracker.New(tracker.Config{
		Listen: "127.0.0.1:0", DataDir: t.TempDir(), Token: "fleet", UsersFile: users,
		HeartbeatInterval: 50 * time.Millisecond, LostAfter: 5 * time.Second, LeaseWait: 100 * time.Millisecond,
		Logger: quietLog(),
	})
	check.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			check.NoError(t, err, "tracker Run")
		case <-time.After(guard):
			t.Errorf("tracker did not stop within %s", guard)
		}
	})
	f := &leasedFleet{tracker: tr.Addr(), alice: alice, users: users}
	f.a = f.device(t, "a", rpcserver.Config{}, 1)
	f.b = f.device(t, "b", rpcserver.Config{}, 1)
	return f
}

// device starts a daemon under key with cfg (the fleet token and a
// minute's session timeout added) and registers it with the tracker as
// serving maxSessions sessions at once (said to be sandboxed when more
// than one, so that the tracker grants that many leases on it).
func (f *leasedFleet) device(t *testing.T, key string, cfg rpcserver.Config, maxSessions int) *testDaemon {
	t.Helper()
	cfg.Token, cfg.Key, cfg.SessionTimeout = "fleet", key, time.Minute
	var reg *client.Registrar
	td := startDaemon(t, cfg, func(d *rpcserver.Daemon) {
		reg = client.NewRegistrar(f.tracker, client.TrackerOptions{Token: "fleet", Logger: quietLog()}, proto.RegisterArgs{
			Role: proto.NodeDevice, Key: key, Addr: d.Addr().String(), MaxSessions: maxSessions, Sandboxed: maxSessions > 1,
		})
		d.SetTracker(reg)
	})
	select {
	case <-reg.Ready():
	case <-time.After(guard):
		t.Fatalf("device %s did not register", key)
	}
	return td
}

// lease asks the tracker, as alice, for the device under key.
func (f *leasedFleet) lease(t *testing.T, key string) *client.Lease {
	t.Helper()
	ctx := testCtx(t)
	tc, err := client.DialTracker(ctx, f.tracker, client.TrackerOptions{Token: f.alice, Logger: quietLog()})
	check.NoError(t, err)
	t.Cleanup(func() { tc.Close() })
	l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: key})
	check.NoError(t, err)
	return l
}

// TestLeaseTokenAdmits: a named user holding only their tracker token gets
// a lease, and the device daemon admits their hello on the lease token
// alone; the lease names the user in the daemon's log and metrics. Every
// other credential is refused: none, a forged token, the user's tracker
// token, another device's lease, a released lease.
func TestLeaseTokenAdmits(t *testing.T) {
	f := startLeasedFleet(t)
	ctx := testCtx(t)

	// No token at all, a forged one, alice's tracker token: refused at the hello.
	for _, tok := range []string{"", "kiln-forged-0000", f.alice} {
		_, err := client.Connect(ctx, f.a.addr, client.SessionOptions{Token: tok})
		check.ErrorIs(t, err, proto.ErrUnauthorized)
		_, err = client.Connect(ctx, f.a.addr, client.SessionOptions{LeaseToken: tok + "x"})
		check.ErrorIs(t, err, proto.ErrUnauthorized)
	}

	// Device b's lease does not open device a.
	lb := f.lease(t, "b")
	_, err := client.Connect(ctx, f.a.addr, client.SessionOptions{LeaseToken: lb.Token})
	check.ErrorIs(t, err, proto.ErrUnauthorized)

	// Alice's lease on a opens a, with no fleet token, and runs code there
	// (an upload uses a bulk connection, admitted on the same lease).
	la := f.lease(t, "a")
	s, err := client.Connect(ctx, f.a.addr, client.SessionOptions{LeaseToken: la.Token})
	check.NoError(t, err)
	check.NoError(t, s.Upload(ctx, "x.bin", make([]byte, 1<<20)))
	// A hello with a's lease but a different lease at session.open: refused.
	c, err := proto.Dial(ctx, f.a.addr, proto.DialOptions{Role: proto.RoleClient, Token: la.Token, Logger: quietLog()})
	check.NoError(t, err)
	err = c.Call(ctx, proto.SessionOpen, proto.OpenArgs{LeaseToken: lb.Token}, nil)
	check.ErrorIs(t, err, proto.ErrUnauthorized)
	check.Error(t, err, "differs from the one this connection was admitted with")
	c.Close()
	m := f.a.metrics(t)
	check.True(t, strings.Contains(m, `kiln_rpcserver_sessions_active_by_user{user="alice"} 1`), "metrics do not show alice's session:\n%s", m)
	check.True(t, strings.Contains(f.a.logs.String(), "user=alice"), "the daemon's log does not name alice")
	check.NoError(t, s.Close())

	// Released: the lease token opens nothing any more.
	check.NoError(t, la.Release(ctx))
	f.a.waitIdle(t)
	_, err = client.Connect(ctx, f.a.addr, client.SessionOptions{LeaseToken: la.Token})
	check.ErrorIs(t, err, proto.ErrUnauthorized)

	// The fleet-token path still works alongside (with a new lease).
	la2 := f.lease(t, "a")
	s2, err := client.Connect(ctx, f.a.addr, client.SessionOptions{Token: "fleet", LeaseToken: la2.Token})
	check.NoError(t, err)
	check.NoError(t, s2.Close())
	check.NoError(t, la2.Release(ctx))
}

// TestExpiredLeaseRefused: a lease left to expire admits no hello.
func TestExpiredLeaseRefused(t *testing.T) {
	f := startLeasedFleet(t)
	ctx := testCtx(t)
	tc, err := client.DialTracker(ctx, f.tracker, client.TrackerOptions{Token: f.alice, Logger: quietLog()})
	check.NoError(t, err)
	defer tc.Close()
	l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "a", TTL: 100 * time.Millisecond, NoRenew: true})
	check.NoError(t, err)
	eventually(t, "the lease expired", func() bool {
		c, err := proto.Dial(ctx, f.a.addr, proto.DialOptions{Role: proto.RoleClient, Token: l.Token, Logger: quietLog()})
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	_, err = client.Connect(ctx, f.a.addr, client.SessionOptions{LeaseToken: l.Token})
	check.ErrorIs(t, err, proto.ErrUnauthorized)
}

// TestOneSessionPerLease: on a board that serves two sessions at once, a
// client opens a second session under the lease of its first; the daemon
// refuses it, so the board's other slot stays for the second lease the
// tracker grants there, whose session opens.
func TestOneSessionPerLease(t *testing.T) {
	f := startLeasedFleet(t)
	m := f.device(t, "m", rpcserver.Config{MaxSessions: 2, Sandbox: rpcserver.SandboxOff, InsecureShared: true}, 2)
	ctx := testCtx(t)

	l1 := f.lease(t, "m")
	s1, err := client.Connect(ctx, m.addr, client.SessionOptions{LeaseToken: l1.Token})
	check.NoError(t, err)
	defer s1.Close()
	// The same lease again, by hello and by session.open under the fleet token.
	_, err = client.Connect(ctx, m.addr, client.SessionOptions{LeaseToken: l1.Token})
	check.ErrorIs(t, err, proto.ErrBusy)
	check.Error(t, err, "already has a session")
	_, err = client.Connect(ctx, m.addr, client.SessionOptions{Token: "fleet", LeaseToken: l1.Token})
	check.ErrorIs(t, err, proto.ErrBusy)

	// The tracker grants the board's second slot to another lease, and
	// the daemon has it free.
	l2 := f.lease(t, "m")
	check.True(t, l2.ID != l1.ID, "the tracker granted the same lease twice")
	s2, err := client.Connect(ctx, m.addr, client.SessionOptions{LeaseToken: l2.Token})
	check.NoError(t, err, "the second lease's session")
	defer s2.Close()
	met := m.metrics(t)
	check.True(t, strings.Contains(met, "kiln_rpcserver_sessions_active 2\n"), "two sessions are not open")
	check.True(t, strings.Contains(met, `kiln_rpcserver_sessions_refused_total{reason="lease_in_use"} `), "no lease_in_use refusal in the metrics")

	// Closed, the first lease's session frees its slot for the same lease.
	check.NoError(t, s1.Close())
	eventually(t, "the first session's slot is free", func() bool {
		return strings.Contains(m.metrics(t), "kiln_rpcserver_sessions_active 1\n")
	})
	s3, err := client.Connect(ctx, m.addr, client.SessionOptions{LeaseToken: l1.Token})
	check.NoError(t, err, "the first lease's new session")
	check.NoError(t, s3.Close())
}

// countingTracker counts the lease checks a daemon asks of its tracker.
type countingTracker struct {
	fakeTracker
	verifies atomic.Int32
}

func (c *countingTracker) VerifyLease(ctx context.Context, token string) (proto.LeaseInfo, error) {
	c.verifies.Add(1)
	return c.fakeTracker.VerifyLease(ctx, token)
}

// TestWrongTokenFlood: 200 hellos with guessed lease tokens from one peer
// cost the daemon ten lease checks with the tracker and a few log lines,
// not one of each per hello; the guesser is told to wait.
func TestWrongTokenFlood(t *testing.T) {
	ct := &countingTracker{}
	td := startDaemon(t, rpcserver.Config{Token: "fleet", Tracker: ct})
	ctx := testCtx(t)
	var last error
	for i := range 200 {
		c, err := proto.Dial(ctx, td.addr, proto.DialOptions{Role: proto.RoleClient, Token: fmt.Sprintf("guess-%d", i), Logger: quietLog()})
		if err == nil {
			c.Close()
		}
		check.ErrorIs(t, err, proto.ErrUnauthorized)
		last = err
	}
	check.Error(t, last, "too many wrong tokens from this address")
	check.Equal(t, ct.verifies.Load(), int32(10), "lease checks asked of the tracker")
	lines := 0
	for _, l := range strings.Split(td.logs.String(), "\n") {
		if strings.Contains(l, "hello refused") && !strings.Contains(l, "level=DEBUG") {
			lines++
		}
	}
	check.True(t, lines <= 3, "log lines about refused hellos above debug:", lines)
}

// TestFleetTokenBootstrapOnly: a daemon that registers with the fleet
// token warns at start and refuses that token's hellos, saying what to
// connect with instead; a lease opens its sessions. With AcceptFleetToken
// the fleet token opens them too, and it warns so.
func TestFleetTokenBootstrapOnly(t *testing.T) {
	f := startLeasedFleet(t)
	ctx := testCtx(t)
	dev := f.device(t, "f", rpcserver.Config{TokenIsFleet: true}, 1)
	check.True(t, strings.Contains(dev.logs.String(), "registers with the fleet token"), "no warning at start")
	_, err := client.Connect(ctx, dev.addr, client.SessionOptions{Token: "fleet"})
	check.ErrorIs(t, err, proto.ErrUnauthorized)
	check.Error(t, err, "opens no session on the fleet token")
	check.Error(t, err, "--accept-fleet-token")
	// Nor does it admit the session's raw connections on it.
	_, err = proto.Dial(ctx, dev.addr, proto.DialOptions{Role: proto.RoleBulk, Token: "fleet", Logger: quietLog()})
	check.Error(t, err, "opens no session on the fleet token")
	l := f.lease(t, "f")
	s, err := client.Connect(ctx, dev.addr, client.SessionOptions{Token: "fleet", LeaseToken: l.Token})
	check.NoError(t, err, "a lease's session")
	check.NoError(t, s.Upload(ctx, "x.bin", []byte("data")))
	check.NoError(t, s.Close())

	open := f.device(t, "g", rpcserver.Config{TokenIsFleet: true, AcceptFleetToken: true}, 1)
	check.True(t, strings.Contains(open.logs.String(), "--accept-fleet-token"), "no warning at start")
	s, err = client.Connect(ctx, open.addr, client.SessionOptions{Token: "fleet", LeaseToken: f.lease(t, "g").Token})
	check.NoError(t, err)
	check.NoError(t, s.Close())
	c, err := proto.Dial(ctx, open.addr, proto.DialOptions{Role: proto.RoleClient, Token: "fleet", Logger: quietLog()})
	check.NoError(t, err, "the fleet token's hello")
	c.Close()

	_, err = rpcserver.New(rpcserver.Config{Listen: "127.0.0.1:0", Dir: t.TempDir(), Token: "fleet", TokenIsFleet: true, AllowWithoutLease: true})
	check.Error(t, err, "give --accept-fleet-token too")
}

// TestRevokedUserSessionEnds: revoking a user ends their lease at the
// tracker and their session on the device, which is free for the next
// user, long before the lease's TTL.
func TestRevokedUserSessionEnds(t *testing.T) {
	f := startLeasedFleet(t)
	ctx := testCtx(t)
	bob, err := tracker.CreateUserToken(f.users, "bob", "client")
	check.NoError(t, err)
	tc, err := client.DialTracker(ctx, f.tracker, client.TrackerOptions{Token: f.alice, Logger: quietLog()})
	check.NoError(t, err)
	defer tc.Close()
	l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "a", TTL: time.Hour})
	check.NoError(t, err)
	s, err := client.Connect(ctx, f.a.addr, client.SessionOptions{LeaseToken: l.Token})
	check.NoError(t, err)
	defer s.Close()
	check.NoError(t, s.Upload(ctx, "x.bin", []byte("data")))

	n, err := tracker.RevokeUser(f.users, "alice")
	check.NoError(t, err)
	check.Equal(t, n, 1)
	var endErr error
	eventually(t, "alice's session ends", func() bool {
		_, endErr = s.List(ctx)
		return endErr != nil
	})
	check.ErrorIs(t, endErr, proto.ErrSessionExpired)
	check.Error(t, endErr, "its lease "+l.ID+" was released or expired")
	f.a.waitIdle(t)

	// The device is free again: bob's lease on it is granted at once.
	bc, err := client.DialTracker(ctx, f.tracker, client.TrackerOptions{Token: bob, Logger: quietLog()})
	check.NoError(t, err)
	defer bc.Close()
	lb, err := bc.RequestLease(ctx, client.LeaseRequest{Key: "a"})
	check.NoError(t, err)
	sb, err := client.Connect(ctx, f.a.addr, client.SessionOptions{LeaseToken: lb.Token})
	check.NoError(t, err)
	check.NoError(t, sb.Close())
}

// TestUnleasedSessionsCounted: on a board of two slots that also serves
// sessions without a lease, a session without one takes a slot at the
// tracker too: after one lease the next request waits, and is granted
// once the unleased session closes.
func TestUnleasedSessionsCounted(t *testing.T) {
	f := startLeasedFleet(t)
	m := f.device(t, "m", rpcserver.Config{MaxSessions: 2, Sandbox: rpcserver.SandboxOff, InsecureShared: true, AllowWithoutLease: true}, 2)
	ctx := testCtx(t)
	free, err := client.Connect(ctx, m.addr, client.SessionOptions{Token: "fleet"})
	check.NoError(t, err, "a session without a lease")
	l1 := f.lease(t, "m")
	s1, err := client.Connect(ctx, m.addr, client.SessionOptions{LeaseToken: l1.Token})
	check.NoError(t, err)
	defer s1.Close()

	tc, err := client.DialTracker(ctx, f.tracker, client.TrackerOptions{Token: f.alice, Logger: quietLog()})
	check.NoError(t, err)
	defer tc.Close()
	// The daemon's heartbeat tells the tracker of the unleased session.
	eventually(t, "the tracker sees board m full", func() bool {
		sum, err := tc.Query(ctx, 0)
		check.NoError(t, err)
		for _, n := range sum.Devices {
			if n.Key == "m" {
				return n.State == proto.StateBusy
			}
		}
		return false
	})
	queued := make(chan int, 16)
	granted := make(chan error, 1)
	go func() {
		l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "m", OnPosition: func(p int, _ string) { queued <- p }})
		if err == nil {
			l.Release(ctx)
		}
		granted <- err
	}()
	select {
	case p := <-queued:
		check.Equal(t, p, 1, "queue position")
	case err := <-granted:
		t.Fatalf("a third session's lease was granted on a board of two slots (err %v)", err)
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	check.NoError(t, free.Close())
	select {
	case err := <-granted:
		check.NoError(t, err, "the lease once the unleased session closed")
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
}
