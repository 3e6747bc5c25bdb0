package ui_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker"
	"github.com/kiln-ml/kiln/tracker/ui"
)

// fleet is a tracker on loopback with a users file (alice and bob), one
// device daemon registered under key "cpu" as node "board-7", and the
// console serving on its own loopback port.
type fleet struct {
	tr           *tracker.Server
	url          string // the console, http://127.0.0.1:PORT
	fleetToken   string
	usersFile    string
	alice, bob   string // user tokens
	aliceTracker *client.Tracker
	bobTracker   *client.Tracker
	admin        *client.Tracker
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// workerEnv makes this test binary a device daemon's session worker.
const workerEnv = "KILN_UI_TEST_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		os.Exit(rpcserver.WorkerMain())
	}
	os.Exit(m.Run())
}

func startFleet(t *testing.T, poll time.Duration) *fleet {
	t.Helper()
	dir := t.TempDir()
	users := filepath.Join(dir, "users")
	alice, err := tracker.CreateUserToken(users, "alice", "client")
	check.NoError(t, err)
	bob, err := tracker.CreateUserToken(users, "bob", "client")
	check.NoError(t, err)
	f := &fleet{fleetToken: "fleet-secret-token", alice: alice, bob: bob, usersFile: users}
	tr, err := tracker.New(tracker.Config{
		Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, "tracker"), Token: f.fleetToken, UsersFile: users,
		Logger: quiet, HeartbeatInterval: 200 * time.Millisecond,
	})
	check.NoError(t, err)
	f.tr = tr
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	wg.Go(func() { tr.Run(ctx) })

	topts := client.TrackerOptions{Token: f.fleetToken, Logger: quiet}
	d, err := rpcserver.New(rpcserver.Config{Listen: "127.0.0.1:0", Key: "cpu", Token: f.fleetToken, Dir: filepath.Join(dir, "sessions"), Version: "test", Logger: quiet,
		Worker: rpcserver.WorkerSpec{Path: os.Args[0], Args: []string{"-test.run=^$"}, Env: []string{workerEnv + "=1", "GORACE=atexit_sleep_ms=0"}}})
	check.NoError(t, err)
	reg := client.NewRegistrar(tr.Addr(), topts, proto.RegisterArgs{
		Role: proto.NodeDevice, Key: "cpu", NodeID: "board-7", Addr: d.Addr().String(), Attrs: rpcserver.NodeAttrs("test"),
	})
	d.SetTracker(reg)
	wg.Go(func() { d.Run(ctx) })
	select {
	case <-reg.Ready():
	case <-time.After(time.Minute):
		t.Fatal("the device did not register within a minute")
	}

	con, err := ui.New(ui.Config{Tracker: tr, Logger: quiet, Poll: poll})
	check.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	f.url = "http://" + ln.Addr().String()
	wg.Go(func() { con.Serve(ctx, ln) })

	dial := func(tok string) *client.Tracker {
		c, err := client.DialTracker(ctx, tr.Addr(), client.TrackerOptions{Token: tok, Logger: quiet})
		check.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	f.aliceTracker, f.bobTracker, f.admin = dial(alice), dial(bob), dial(f.fleetToken)
	return f
}

// record stores a result with the given samples (seconds) through tc.
func record(t *testing.T, tc *client.Tracker, fn, label string, shared bool, samples ...float64) proto.Result {
	t.Helper()
	s := append([]float64(nil), samples...)
	med := s[len(s)/2]
	r, err := tc.RecordResult(context.Background(), proto.Result{
		Function: fn, Label: label, Shared: shared, Source: proto.ResultSourceBench, DeviceKey: "cpu", NodeID: "board-7",
		Target: "cpu", Inputs: []string{"A:float32[1024]"},
		Time:    proto.TimeResult{Results: s, Median: med, Mean: med, Min: s[0], Max: s[len(s)-1], Number: 10},
		Kernels: []proto.KernelTime{{Name: fn + "_kernel0", Results: s}, {Name: fn + "_kernel1", Results: s}},
	})
	check.NoError(t, err)
	return r
}

func revokeUser(f *fleet, user string) error {
	_, err := tracker.RevokeUser(f.usersFile, user)
	return err
}
