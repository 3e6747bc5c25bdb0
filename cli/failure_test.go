package cli

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// The tests in this file are the fleet's failure and bad-input checks. Each
// runs a fleet of real kiln processes (this test binary with
// KILN_TEST_MAIN=1: `kiln tracker`, `kiln rpcserver`, `kiln compiler`) on
// 127.0.0.1 and talks to it through the CLI commands and the SDK, as users
// do.

// failCtx bounds a failure test.
func failCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*procGuard)
	t.Cleanup(cancel)
	return ctx
}

// openKernels leases a device of key, connects, uploads the test kernels
// and loads them.
func openKernels(t *testing.T, ctx context.Context, f *procFleet, tc *client.Tracker, key string) (*client.Lease, *client.Session, *client.Module) {
	t.Helper()
	lease, err := tc.RequestLease(ctx, client.LeaseRequest{Key: key, User: t.Name()})
	check.NoError(t, err)
	t.Cleanup(func() { lease.Release(context.Background()) })
	s, err := client.Connect(ctx, lease.Addr, client.SessionOptions{Token: f.tok, LeaseToken: lease.Token})
	check.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	check.NoError(t, s.Upload(ctx, "kernels.kiln", failKernels(t)))
	mod, err := s.LoadModule(ctx, "kernels.kiln")
	check.NoError(t, err)
	return lease, s, mod
}

// TestFailDeviceKilled kills -9 a device daemon in the middle of a call:
// the client's pending call and its next one fail with an error that names
// the lost connection, the tracker marks the device lost, and the other
// device still serves.
func TestFailDeviceKilled(t *testing.T) {
	failKernels(t)
	ctx := failCtx(t)
	f := newProcFleet(t, 500*time.Millisecond)
	f.startTracker("")
	f.startDevice("cpu")
	f.startDevice("cpu")
	f.startCompiler()
	f.waitFree("cpu", 2)
	tc := f.dialTracker(ctx)
	lease, s, mod := openKernels(t, ctx, f, tc, "cpu")
	sleep, err := mod.GetFunction(ctx, "sleep_ms")
	check.NoError(t, err)

	pending := make(chan error, 1)
	go func() {
		_, err := sleep.Call(ctx, int64(60_000))
		pending <- err
	}()
	// The call is in flight once the worker reports a call in progress;
	// a short pause is enough for the request to reach the worker, and the
	// test holds either way: a call sent after the kill fails the same way.
	time.Sleep(100 * time.Millisecond)
	victim := f.deviceAt(lease.Addr)
	killed := time.Now()
	victim.kill9(t)
	var callErr error
	select {
	case callErr = <-pending:
	case <-ctx.Done():
		t.Fatal("the pending call did not end after its daemon was killed")
	}
	// The figure is logged, not asserted: the client learns of the loss
	// from its connection, not from heartbeats.
	t.Logf("pending call failed %s after kill -9 (heartbeat %s): %v", time.Since(killed), f.heartbeat, callErr)
	check.ErrorIs(t, callErr, proto.ErrUnavailable)
	check.Error(t, callErr, "connection to", lease.Addr, "lost")

	_, err = sleep.Call(ctx, int64(1))
	check.ErrorIs(t, err, proto.ErrUnavailable)
	check.Error(t, err, "connection to", lease.Addr, "lost")
	check.True(t, s.Err() != nil, "the session does not report its end")

	eventually(t, "the tracker marks the killed device lost", func() bool {
		return f.deviceState(lease.Addr) == proto.StateLost
	})
	for _, k := range f.query().Keys {
		if k.Key == "cpu" {
			check.Equal(t, k.Lost, 1)
		}
	}
	// The other device still serves.
	lease2, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "cpu", User: "after the kill"})
	check.NoError(t, err)
	defer lease2.Release(ctx)
	check.True(t, lease2.Addr != lease.Addr, "leased the lost device again:", lease2.Addr)
}

// TestFailTrackerRestart kills -9 the tracker and starts it again on the
// same address and data directory: a build queued while no compiler node
// ran survives and is built once one appears, the device daemons register
// again by themselves, and the leases granted before the restart are still
// honoured and not handed out twice.
func TestFailTrackerRestart(t *testing.T) {
	failKernels(t)
	ctx := failCtx(t)
	f := newProcFleet(t, 250*time.Millisecond)
	f.startTracker("")
	f.startDevice("cpu")
	f.startDevice("cpu")
	f.waitFree("cpu", 2)

	tc := f.dialTracker(ctx)
	src, err := os.ReadFile("testdata/vadd.py")
	check.NoError(t, err)
	job, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "vadd.py", Module: string(src), Target: "cpu"})
	check.NoError(t, err)
	check.Equal(t, job.State, proto.JobQueued)
	var leases []*client.Lease
	for range 2 {
		l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "cpu", NoRenew: true, TTL: time.Minute, User: "before the restart"})
		check.NoError(t, err)
		leases = append(leases, l)
	}
	check.True(t, leases[0].Addr != leases[1].Addr, "one device leased twice:", leases[0].Addr)

	addr := f.trackerAddr
	f.tracker.kill9(t)
	f.startTracker(addr)
	check.Equal(t, f.trackerAddr, addr)

	// The daemons come back by themselves, busy with the restored leases.
	eventually(t, "both devices register again, busy", func() bool {
		for _, k := range f.query().Keys {
			if k.Key == "cpu" {
				return k.Busy == 2
			}
		}
		return false
	})
	tc = f.dialTracker(ctx)
	got, err := tc.BuildStatus(ctx, job.ID)
	check.NoError(t, err)
	check.Equal(t, got.State, proto.JobQueued)

	// A lease from before the restart opens a session (the daemon checks it
	// with the new tracker process).
	var s *client.Session
	var lastErr error
	eventually(t, "a pre-restart lease is honoured", func() bool {
		s, lastErr = client.Connect(ctx, leases[0].Addr, client.SessionOptions{Token: f.tok, LeaseToken: leases[0].Token})
		return lastErr == nil
	})
	defer s.Close()
	nop, err := s.GetGlobal(ctx, "rpcserver.nop")
	check.NoError(t, err)
	_, err = nop.Call(ctx)
	check.NoError(t, err)

	// Neither device is handed out again while its lease is held.
	// (The deadline is longer than the tracker's 1 s long poll, so the
	// client hears its queue position before giving up.)
	short, cancel := context.WithTimeout(ctx, 2500*time.Millisecond)
	_, err = tc.RequestLease(short, client.LeaseRequest{Key: "cpu", User: "after the restart"})
	cancel()
	check.ErrorIs(t, err, proto.ErrDeadline)
	check.Error(t, err, "gave up at", "deadline", "queue position 1", "every matching device stayed busy")

	// The queued build runs once a compiler node appears.
	f.startCompiler()
	done, err := tc.WaitBuild(ctx, job.ID, nil)
	check.NoError(t, err)
	check.Equal(t, done.State, proto.JobSucceeded)
	check.True(t, done.Artifact != "", "no artifact for the built job")
}

// TestFailKernelSegfault runs a kernel that segfaults with `kiln run
// --tracker`: the error names the signal and the function, the daemon
// process lives, and the device goes back to the pool (the next run, on the
// only device of its key, succeeds).
func TestFailKernelSegfault(t *testing.T) {
	failKernels(t)
	f := newProcFleet(t, 500*time.Millisecond)
	f.startTracker("")
	dev := f.startDevice("crashy")
	f.startDevice("cpu")
	f.waitFree("crashy", 1)
	dir := t.TempDir()
	art := writeFailKernels(t, dir)

	_, errOut, err := runApp(t, "run", art, "--tracker", f.trackerAddr, "--key", "crashy", "--token-file", f.tokFile,
		"--func", "segv", "--wait", "20s")
	check.ErrorIs(t, err, proto.ErrCrashed)
	check.Error(t, err, "SIGSEGV", `"segv"`)
	t.Logf("kiln run of a segfaulting kernel: %v (stderr %q)", err, errOut)
	check.True(t, dev.alive(), "the device daemon died with its kernel")

	x, err := ndarray.FromSlice([]float32{1, 2, 3, 4}, ndarray.Shape{4})
	check.NoError(t, err)
	xf := filepath.Join(dir, "x.npy")
	check.NoError(t, ndarray.SaveNPY(xf, x))
	out := filepath.Join(dir, "out")
	_, errOut, err = runApp(t, "run", art, "--tracker", f.trackerAddr, "--key", "crashy", "--token-file", f.tokFile,
		"--func", "vadd4", "--input", "A="+xf, "--input", "B="+xf, "--output", out, "--wait", "20s")
	check.NoError(t, err, errOut)
	c, err := ndarray.LoadNPY(filepath.Join(out, "C.npy"))
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](c)
	check.NoError(t, err)
	check.Equal(t, got, []float32{2, 4, 6, 8})
	check.True(t, dev.alive(), "the device daemon died")
	f.waitFree("crashy", 1)
}

// TestFailBadInput sends a fleet what users and attackers send by
// mistake or on purpose; every case gets one clear error and the fleet
// keeps serving.
func TestFailBadInput(t *testing.T) {
	failKernels(t)
	ctx := failCtx(t)
	f := newProcFleet(t, 500*time.Millisecond)
	f.startTracker("")
	dev := f.startDevice("cpu")
	devAddr := dev.addr(t)
	f.waitFree("cpu", 1)
	dir := t.TempDir()
	art := writeFailKernels(t, dir)
	wrongTok := filepath.Join(dir, "wrong-token")
	check.NoError(t, os.WriteFile(wrongTok, []byte("not-the-token\n"), 0o600))

	t.Run("wrong token at the tracker", func(t *testing.T) {
		_, _, err := runApp(t, "query", "--tracker", f.trackerAddr, "--token-file", wrongTok)
		check.ErrorIs(t, err, proto.ErrUnauthorized)
		check.Error(t, err, "authentication failed: wrong token")
	})
	t.Run("wrong token at a daemon", func(t *testing.T) {
		_, err := client.Connect(ctx, devAddr, client.SessionOptions{Token: "not-the-token"})
		check.ErrorIs(t, err, proto.ErrUnauthorized)
		check.Error(t, err, "authentication failed: wrong token")
	})
	t.Run("upload outside the session directory", func(t *testing.T) {
		tc := f.dialTracker(ctx)
		lease, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "cpu", User: t.Name()})
		check.NoError(t, err)
		defer lease.Release(ctx)
		s, err := client.Connect(ctx, lease.Addr, client.SessionOptions{Token: f.tok, LeaseToken: lease.Token})
		check.NoError(t, err)
		defer s.Close()
		for _, name := range []string{"../x", "/etc/x", "a/../../x"} {
			err := s.Upload(ctx, name, []byte("escape"))
			check.ErrorIs(t, err, proto.ErrBadRequest)
			check.Error(t, err, name)
		}
		_, err = os.Stat(filepath.Join(f.dir, "x"))
		check.True(t, os.IsNotExist(err), "a file escaped the session directory:", err)
		// The session goes on.
		check.NoError(t, s.Upload(ctx, "ok.bin", []byte("fine")))
		files, err := s.List(ctx)
		check.NoError(t, err)
		check.Equal(t, len(files), 1)
	})
	t.Run("session past its deadline", func(t *testing.T) {
		// The deadline leaves time to open a sandboxed session and load the
		// module on a loaded machine; the call itself sleeps a minute.
		_, _, err := runApp(t, "run", art, "--tracker", f.trackerAddr, "--key", "cpu", "--token-file", f.tokFile,
			"--func", "sleep_ms", "--arg", "ms=60000", "--session-timeout", "5s", "--wait", "20s")
		check.ErrorIs(t, err, proto.ErrSessionExpired)
		check.Error(t, err, "sleep_ms")
		t.Logf("kiln run past its session deadline: %v", err)
		check.True(t, dev.alive(), "the device daemon died")
		f.waitFree("cpu", 1)
	})
	t.Run("call past its timeout", func(t *testing.T) {
		// kiln run --timeout: the run fails with a deadline error.
		_, _, err := runApp(t, "run", art, "--tracker", f.trackerAddr, "--key", "cpu", "--token-file", f.tokFile,
			"--func", "sleep_ms", "--arg", "ms=600000", "--timeout", "500ms", "--session-timeout", "1h", "--wait", "20s")
		check.ErrorIs(t, err, proto.ErrDeadline)
		check.True(t, dev.alive(), "the device daemon died")
		f.waitFree("cpu", 1)

		// A kernel that never returns in time, called with a deadline
		// once everything else is in place: the daemon kills its worker
		// at the deadline and ends the session, long before the session's
		// own deadline, so the device is free for the next client.
		tc := f.dialTracker(ctx)
		_, s, mod := openKernels(t, ctx, f, tc, "cpu")
		sleep, err := mod.GetFunction(ctx, "sleep_ms")
		check.NoError(t, err)
		const killed = "call past its deadline: worker killed"
		before := strings.Count(dev.out.String(), killed)
		cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err = sleep.Call(cctx, int64(600_000))
		cancel()
		check.ErrorIs(t, err, proto.ErrDeadline)
		eventually(t, "the daemon kills the worker at the call's deadline", func() bool {
			return strings.Count(dev.out.String(), killed) > before
		})
		_, err = s.List(ctx)
		check.ErrorIs(t, err, proto.ErrDeadline)
		check.Error(t, err, "ran past the call's deadline")
	})
	t.Run("key nobody serves", func(t *testing.T) {
		// A process of its own: urfave/cli apps in one process share
		// global flags, so two cannot run at once there.
		run := startProc(t, "kiln run --key tpu", "run", art, "--tracker", f.trackerAddr, "--key", "tpu",
			"--token-file", f.tokFile, "--func", "segv", "--wait", "3s")
		eventually(t, "the request shows in kiln query's queue", func() bool {
			for _, q := range f.query().Queues {
				if strings.Contains(q.Queue, "tpu") && len(q.Waiting) == 1 {
					return q.Waiting[0].Position == 1
				}
			}
			return false
		})
		out, _, err := runApp(t, "query", "--tracker", f.trackerAddr, "--token-file", f.tokFile)
		check.NoError(t, err)
		check.True(t, strings.Contains(out, `queue "tpu"`), "kiln query lacks the waiting request:", out)
		select {
		case <-run.done:
		case <-ctx.Done():
			t.Fatal("kiln run did not give up")
		}
		check.True(t, run.err != nil, "kiln run succeeded without a device")
		check.Equal(t, run.cmd.ProcessState.ExitCode(), 1)
		got := run.out.String()
		for _, want := range []string{"waiting for a device: position 1", `key "tpu"`, "gave up at", "queue position 1",
			"no live device serves it", proto.ErrDeadline.Error()} {
			check.True(t, strings.Contains(got, want), "kiln run's output lacks", want, "in", got)
		}
	})
	t.Run("malformed and oversized frames", func(t *testing.T) {
		// The daemon, registered with the fleet token, admits a lease's
		// token, not that one.
		lease, err := f.dialTracker(ctx).RequestLease(ctx, client.LeaseRequest{Key: "cpu", User: t.Name()})
		check.NoError(t, err)
		for _, target := range []struct{ name, addr, tok string }{{"tracker", f.trackerAddr, f.tok}, {"daemon", devAddr, lease.Token}} {
			for _, tc := range []struct {
				name  string
				frame []byte
				code  proto.Code
				want  string
			}{
				{"oversized", binary.BigEndian.AppendUint32(nil, 1<<30), proto.CodeTooLarge, "frame"},
				{"not msgpack", append(binary.BigEndian.AppendUint32(nil, 4), 0xc1, 0xc1, 0xc1, 0xc1), proto.CodeBadRequest, ""},
				{"not a request", append(binary.BigEndian.AppendUint32(nil, 1), 0x2a), proto.CodeBadRequest, ""},
				// A request whose args nest a million arrays: the decoder
				// recursed into them and overflowed its stack, killing the
				// process (fatal, not recoverable).
				{"million-deep args", deepRequestFrame(t, 1<<20), proto.CodeBadRequest, "nesting deeper than"},
			} {
				t.Run(target.name+"/"+tc.name, func(t *testing.T) {
					resp := rawFrame(t, ctx, target.addr, target.tok, tc.frame)
					check.True(t, resp.Error != nil, "no error for a bad frame:", resp)
					check.Equal(t, resp.ID, uint64(0))
					check.Equal(t, resp.Error.Code, tc.code, resp.Error.Message)
					check.True(t, strings.Contains(resp.Error.Message, tc.want), resp.Error.Message)
					t.Logf("%s answered: %s: %s", target.name, resp.Error.Code, resp.Error.Message)
				})
			}
			t.Run(target.name+"/not a kiln hello", func(t *testing.T) {
				// Dropped without a word: a port scanner learns nothing.
				b := rawHello(t, ctx, target.addr, []byte("GET / HTTP/1.0\r\n\r\n"))
				check.Equal(t, len(b), 0, "reply to a non-kiln peer:", b)
			})
			t.Run(target.name+"/other protocol version", func(t *testing.T) {
				hello := binary.BigEndian.AppendUint16([]byte(proto.Magic), proto.ProtocolVersion+7)
				hello = append(hello, byte(proto.RoleClient), 0, 0)
				b := rawHello(t, ctx, target.addr, hello)
				rep, err := proto.ReadHelloReply(bytes.NewReader(b))
				check.NoError(t, err, b)
				check.Equal(t, rep.Status, proto.StatusBadVersion)
				check.Equal(t, rep.Version, proto.ProtocolVersion)
				t.Logf("%s answered a version %d hello: %s %q", target.name, proto.ProtocolVersion+7, rep.Status, rep.Message)
			})
		}
		check.NoError(t, lease.Release(ctx))
		// Both keep serving: a run through the tracker on the daemon.
		x, err := ndarray.FromSlice([]float32{1, 2, 3, 4}, ndarray.Shape{4})
		check.NoError(t, err)
		xf := filepath.Join(dir, "x.npy")
		check.NoError(t, ndarray.SaveNPY(xf, x))
		// The daemon frees its session slot a moment after a raw
		// connection closed; until then a run is told the device is busy.
		var errOut string
		eventually(t, "a run on the daemon after the bad frames", func() bool {
			_, errOut, err = runApp(t, "run", art, "--tracker", f.trackerAddr, "--key", "cpu", "--token-file", f.tokFile,
				"--func", "vadd4", "--input", "A="+xf, "--input", "B="+xf, "--output", filepath.Join(dir, "out"), "--wait", "20s")
			return !errors.Is(err, proto.ErrBusy)
		})
		check.NoError(t, err, errOut)
		check.True(t, dev.alive(), "the device daemon died")
	})
}

// deepRequestFrame is a framed request whose args nest depth msgpack
// arrays.
func deepRequestFrame(t *testing.T, depth int) []byte {
	t.Helper()
	args := append(bytes.Repeat([]byte{0x91}, depth), 0xc0)
	b, err := msgpack.Marshal(proto.Request{ID: 1, Method: "tracker.query", Args: args})
	check.NoError(t, err)
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
}

// rawFrame connects to a kiln listener as a raw TCP client: it writes the
// hello by hand, opens the control stream of a yamux session and sends
// frame (bytes of its own making), then reads the listener's last word: a
// response with id 0 saying what was wrong.
func rawFrame(t *testing.T, ctx context.Context, addr, tok string, frame []byte) proto.Response {
	t.Helper()
	conn := rawDial(t, ctx, addr, tok)
	defer conn.Close()
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	sess, err := yamux.Client(conn, cfg)
	check.NoError(t, err)
	defer sess.Close()
	st, err := sess.Open()
	check.NoError(t, err)
	// The listener may answer and cut the connection before the whole
	// frame is written: what it said before that is still read below.
	st.Write(frame)
	b, err := proto.ReadFrame(st, proto.DefaultMaxFrameSize)
	check.NoError(t, err, "reading the listener's answer")
	resp, err := proto.DecodeResponse(b)
	check.NoError(t, err)
	return resp
}

// rawDial connects and says a client's hello by hand. A device daemon
// frees its exclusive session slot a moment after the previous raw
// connection closed, so a "busy" refusal is tried again.
func rawDial(t *testing.T, ctx context.Context, addr, tok string) net.Conn {
	t.Helper()
	hello := []byte(proto.Magic)
	hello = binary.BigEndian.AppendUint16(hello, proto.ProtocolVersion)
	hello = append(hello, byte(proto.RoleClient))
	hello = binary.BigEndian.AppendUint16(hello, uint16(len(tok)))
	hello = append(hello, tok...)
	var conn net.Conn
	var refused string
	eventually(t, "the listener accepts the hello", func() bool {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		check.NoError(t, err)
		c.SetDeadline(time.Now().Add(procGuard))
		_, err = c.Write(hello)
		check.NoError(t, err)
		var reply [9]byte
		_, err = io.ReadFull(c, reply[:])
		check.NoError(t, err)
		check.Equal(t, string(reply[:4]), proto.Magic)
		msg := make([]byte, binary.BigEndian.Uint16(reply[7:]))
		_, err = io.ReadFull(c, msg)
		check.NoError(t, err)
		if proto.Status(reply[6]) == proto.StatusOK {
			conn = c
			return true
		}
		c.Close()
		refused = string(msg)
		if proto.Status(reply[6]) != proto.StatusRefused || !strings.HasPrefix(refused, string(proto.CodeBusy)) {
			t.Fatalf("hello refused: %s %s", proto.Status(reply[6]), msg)
		}
		return false
	})
	t.Logf("hello accepted (last refusal: %q)", refused)
	return conn
}

// rawHello sends hello bytes to a kiln listener as a raw TCP client and
// returns everything the listener writes back before it closes.
func rawHello(t *testing.T, ctx context.Context, addr string, hello []byte) []byte {
	t.Helper()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	check.NoError(t, err)
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(procGuard))
	_, err = conn.Write(hello)
	check.NoError(t, err)
	b, err := io.ReadAll(conn)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		check.NoError(t, err)
	}
	return b
}
