package rpcserver_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

func TestUploadLoadCall(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{Key: "test-cpu", Version: "v-test"})
	s := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)
	info := s.Info()
	check.Equal(t, info.Key, "test-cpu")
	check.Equal(t, info.Version, "v-test")
	check.True(t, info.WorkerPID > 0 && info.WorkerPID != os.Getpid(), "worker pid", info.WorkerPID)
	check.True(t, s.Expires().After(time.Now()), s.Expires())

	mod := loadKernels(t, s)
	check.Equal(t, mod.Type, "cpu")
	check.Equal(t, mod.Functions, []string{"abort_now", "crash", "fail", "fill", "hog", "intrude", "nop", "orphan", "privs", "sleep_ms", "vadd"})
	vadd, err := mod.GetFunction(ctx, "vadd")
	check.NoError(t, err)

	n := 1000
	xa, xb := make([]float32, n), make([]float32, n)
	for i := range xa {
		xa[i], xb[i] = float32(i), 0.5*float32(i)
	}
	la, err := ndarray.FromSlice(xa, ndarray.Shape{int64(n)})
	check.NoError(t, err)
	lb, err := ndarray.FromSlice(xb, ndarray.Shape{int64(n)})
	check.NoError(t, err)
	arrs := make([]*client.Array, 3)
	for i := range arrs {
		arrs[i], err = s.Empty(ctx, ndarray.Shape{int64(n)}, ndarray.Float32, devices.CPUDevice)
		check.NoError(t, err)
		check.Equal(t, arrs[i].Bytes, int64(4*n))
	}
	check.NoError(t, s.CopyFrom(ctx, arrs[0], la))
	check.NoError(t, s.CopyFrom(ctx, arrs[1], lb))
	out, err := vadd.Call(ctx, arrs[0], arrs[1], arrs[2])
	check.NoError(t, err)
	check.Equal(t, out, any(nil))
	lc, err := s.CopyTo(ctx, arrs[2])
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](lc)
	check.NoError(t, err)
	for i := range got {
		if got[i] != xa[i]+xb[i] {
			t.Fatalf("c[%d] = %v, want %v", i, got[i], xa[i]+xb[i])
		}
	}

	// A kernel's own failure keeps its message; a wrong argument is a bad
	// request; an unknown function is not found.
	fail, err := mod.GetFunction(ctx, "fail")
	check.NoError(t, err)
	_, err = fail.Call(ctx)
	check.Error(t, err, "this kernel always fails")
	_, err = vadd.Call(ctx, arrs[0], 3)
	check.ErrorIs(t, err, proto.ErrBadRequest)
	short10, err := s.Empty(ctx, ndarray.Shape{10}, ndarray.Float32, devices.CPUDevice)
	check.NoError(t, err)
	// A wrong shape is a bad request that names the function once, as a
	// local call's error does.
	_, err = vadd.Call(ctx, arrs[0], short10, arrs[2])
	check.ErrorIs(t, err, proto.ErrBadRequest)
	check.Equal(t, err.Error(), `call "vadd": argument 1: "B": dimension 0 is 10 but n is already 1000 from an earlier argument: bad request`)
	_, err = mod.GetFunction(ctx, "nope")
	check.ErrorIs(t, err, proto.ErrNotFound)

	// Freed arrays are gone.
	check.NoError(t, arrs[2].Free(ctx))
	_, err = arrs[2].ReadBytes(ctx)
	check.ErrorIs(t, err, proto.ErrNotFound)
	_, err = vadd.Call(ctx, arrs[0], arrs[1], arrs[2])
	check.ErrorIs(t, err, proto.ErrNotFound)
	// A wrong size is refused.
	check.ErrorIs(t, arrs[0].CopyFromBytes(ctx, make([]byte, 8)), proto.ErrBadRequest)
	short := *arrs[0]
	short.Bytes = 8
	err = short.CopyFromReader(ctx, bytes.NewReader(make([]byte, 8)))
	check.ErrorIs(t, err, proto.ErrBadRequest)
	check.Error(t, err, "8 bytes sent, the array holds 4000")
}

func TestBareSharedObject(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{})
	s := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)
	check.NoError(t, s.Upload(ctx, "lib/kernels.so", kernels(t)))
	mod, err := s.LoadModule(ctx, "lib/kernels.so")
	check.NoError(t, err)
	nop, err := mod.GetFunction(ctx, "nop")
	check.NoError(t, err)
	_, err = nop.Call(ctx)
	check.NoError(t, err)

	// Not a module at all.
	check.NoError(t, s.Upload(ctx, "junk.bin", []byte("hello, world")))
	_, err = s.LoadModule(ctx, "junk.bin")
	check.ErrorIs(t, err, proto.ErrBadRequest)
	_, err = s.LoadModule(ctx, "missing.so")
	check.ErrorIs(t, err, proto.ErrNotFound)
}

func TestFiles(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{})
	s := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)
	check.NoError(t, s.Upload(ctx, "a.txt", []byte("alpha")))
	check.NoError(t, s.Upload(ctx, "dir/b.txt", []byte("bravo!")))
	check.NoError(t, s.Upload(ctx, "empty", nil))
	files, err := s.List(ctx)
	check.NoError(t, err)
	names := []string{}
	for _, f := range files {
		names = append(names, f.Name)
	}
	check.Equal(t, names, []string{"a.txt", "dir/b.txt", "empty"})
	check.Equal(t, files[1].Size, int64(6))

	var buf bytes.Buffer
	n, err := s.Download(ctx, "dir/b.txt", &buf)
	check.NoError(t, err)
	check.Equal(t, n, int64(6))
	check.Equal(t, buf.String(), "bravo!")

	check.NoError(t, s.Remove(ctx, "a.txt"))
	check.ErrorIs(t, s.Remove(ctx, "a.txt"), proto.ErrNotFound)
	_, err = s.Download(ctx, "a.txt", &buf)
	check.ErrorIs(t, err, proto.ErrNotFound)
}

func TestPathTraversal(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{})
	s := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)

	// A symbolic link out of the session directory, planted from outside.
	dirs, err := filepath.Glob(filepath.Join(td.dir, "session-*", "files"))
	check.NoError(t, err)
	check.Equal(t, len(dirs), 1, dirs)
	outside := t.TempDir()
	check.NoError(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644))
	check.NoError(t, os.Symlink(outside, filepath.Join(dirs[0], "link")))
	check.NoError(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dirs[0], "filelink")))

	names := []string{"../x", "/etc/x", "a/../../x", "..", "", "./..", "x/../../../etc/passwd", "link/secret", "filelink", "link/new", `..\x`}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			err := s.Upload(ctx, name, []byte("data"))
			check.ErrorIs(t, err, proto.ErrBadRequest)
			var buf bytes.Buffer
			_, err = s.Download(ctx, name, &buf)
			check.ErrorIs(t, err, proto.ErrBadRequest)
			check.Equal(t, buf.Len(), 0)
			check.ErrorIs(t, s.Remove(ctx, name), proto.ErrBadRequest)
			_, err = s.LoadModule(ctx, name)
			check.ErrorIs(t, err, proto.ErrBadRequest)
		})
	}
	_, err = os.Stat(filepath.Join(outside, "new"))
	check.True(t, errors.Is(err, os.ErrNotExist), "nothing written outside", err)
	_, err = os.Stat(filepath.Join(filepath.Dir(td.dir), "x"))
	check.True(t, errors.Is(err, os.ErrNotExist), "nothing written outside", err)
}

func TestExclusiveAndToken(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{Key: "board-1", Token: "s3cret"})
	ctx := testCtx(t)

	_, err := client.Connect(ctx, td.addr, client.SessionOptions{Token: "wrong"})
	check.ErrorIs(t, err, proto.ErrUnauthorized)
	_, err = client.Connect(ctx, td.addr, client.SessionOptions{})
	check.ErrorIs(t, err, proto.ErrUnauthorized)

	s := td.connect(t, client.SessionOptions{Token: "s3cret"})
	_, err = client.Connect(ctx, td.addr, client.SessionOptions{Token: "s3cret"})
	check.ErrorIs(t, err, proto.ErrBusy)
	check.Error(t, err, "device board-1 is busy", s.Info().ID)
	// The holder's address is not told to whoever else knocks.
	check.True(t, !strings.Contains(err.Error(), " from "), "busy error shows the holder's address:", err)

	// Closing the session frees the device before Close returns: the
	// next session opens at once, every time.
	check.NoError(t, s.Close())
	for i := range 4 {
		s2, err := client.Connect(ctx, td.addr, client.SessionOptions{Token: "s3cret"})
		check.NoError(t, err, "session", i+2, "right after the one before closed")
		check.NoError(t, s2.Close())
	}
	s2, err := client.Connect(ctx, td.addr, client.SessionOptions{Token: "s3cret"})
	check.NoError(t, err, "session 6 right after the one before closed")
	defer s2.Close()
	m := td.metrics(t)
	check.True(t, strings.Contains(m, `kiln_rpcserver_sessions_refused_total{reason="busy"}`), m)
	check.True(t, strings.Contains(m, "kiln_rpcserver_sessions_active 1\n"), m)
}

func TestKernelCrash(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{})
	tests := []struct {
		fn     string
		args   []any
		signal string
	}{
		{"crash", []any{0}, "SIGSEGV"},
		{"abort_now", nil, "SIGABRT"},
	}
	for i, tc := range tests {
		t.Run(tc.fn, func(t *testing.T) {
			td.waitIdle(t)
			s := td.connect(t, client.SessionOptions{})
			ctx := testCtx(t)
			mod := loadKernels(t, s)
			f, err := mod.GetFunction(ctx, tc.fn)
			check.NoError(t, err)
			_, err = f.Call(ctx, tc.args...)
			check.ErrorIs(t, err, proto.ErrCrashed)
			check.Error(t, err, tc.signal, fmt.Sprintf("function %q", tc.fn))
			t.Logf("the client sees: %v", err)
			// Later calls on the dead session say why it ended.
			_, err = s.List(ctx)
			check.ErrorIs(t, err, proto.ErrCrashed)
			check.ErrorIs(t, s.Err(), proto.ErrCrashed)

			// The daemon lives and the device is free again at once.
			s2 := td.connect(t, client.SessionOptions{})
			nop, err := s2.GetGlobal(ctx, rpcserver.GlobalNop)
			check.NoError(t, err)
			_, err = nop.Call(ctx)
			check.NoError(t, err)
			check.NoError(t, s2.Close())
			m := td.metrics(t)
			check.True(t, strings.Contains(m, fmt.Sprintf("kiln_rpcserver_worker_crashes_total %d\n", i+1)), m)
			check.True(t, strings.Contains(m, fmt.Sprintf(`kiln_rpcserver_calls_total{code="crashed",method="func.call"} %d`, i+1)), m)
		})
	}
}

func TestWorkerKilledMidCall(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{})
	s := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)
	mod := loadKernels(t, s)
	sleep, err := mod.GetFunction(ctx, "sleep_ms")
	check.NoError(t, err)
	errc := make(chan error, 1)
	go func() {
		_, err := sleep.Call(ctx, 50000)
		errc <- err
	}()
	eventually(t, "the call is in flight", func() bool {
		return strings.Contains(td.metrics(t), "kiln_rpcserver_worker_calls_in_flight 1\n")
	})
	check.NoError(t, syscall.Kill(s.Info().WorkerPID, syscall.SIGKILL))
	select {
	case err = <-errc:
	case <-time.After(guard):
		t.Fatal("the call did not return after its worker was killed")
	}
	check.ErrorIs(t, err, proto.ErrCrashed)
	check.Error(t, err, "SIGKILL", `function "sleep_ms"`)
	s2 := td.connect(t, client.SessionOptions{})
	_, err = s2.List(ctx)
	check.NoError(t, err)
}

func TestSessionDeadline(t *testing.T) {
	kernelsArtifact(t) // build before the clock runs
	// Long enough for the upload and load below on a loaded machine.
	td := startDaemon(t, rpcserver.Config{SessionTimeout: 4 * time.Second, MaxSessions: 2, InsecureShared: true})
	busy := td.connect(t, client.SessionOptions{})
	idle := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)
	mod := loadKernels(t, busy)
	sleep, err := mod.GetFunction(ctx, "sleep_ms")
	check.NoError(t, err)
	// The call outlives the session: the worker is killed at the deadline.
	_, err = sleep.Call(ctx, 50000)
	check.ErrorIs(t, err, proto.ErrSessionExpired)
	check.Error(t, err, "expired")
	_, err = busy.List(ctx)
	check.ErrorIs(t, err, proto.ErrSessionExpired)

	// An idle session is told too, and the device is free for the next.
	eventually(t, "the idle session expires", func() bool {
		_, err := idle.List(ctx)
		return errors.Is(err, proto.ErrSessionExpired)
	})
	s3 := td.connect(t, client.SessionOptions{})
	_, err = s3.List(ctx)
	check.NoError(t, err)
	m := td.metrics(t)
	check.True(t, strings.Contains(m, `kiln_rpcserver_sessions_ended_total{how="expired"} 2`), m)
	check.True(t, !strings.Contains(m, "kiln_rpcserver_worker_crashes_total 1"), m)
}

func TestTimeEvaluatorRemote(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{})
	s := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)
	mod := loadKernels(t, s)
	sleep, err := mod.GetFunction(ctx, "sleep_ms")
	check.NoError(t, err)
	r, err := s.TimeEvaluator(ctx, sleep, client.TimeOptions{Number: 1, Repeat: 3, MinRepeatMS: 5}, 2)
	check.NoError(t, err)
	check.Equal(t, len(r.Results), 3)
	check.Equal(t, r.Device, "cpu:0")
	for _, v := range r.Results {
		check.True(t, v >= 0.002, "a 2 ms kernel lasts at least 2 ms", v)
	}
	check.True(t, r.Number >= 3, "number grew to reach min_repeat_ms", r.Number)
	check.True(t, r.Min <= r.Median && r.Median <= r.Max && r.Min <= r.Mean && r.Mean <= r.Max, r)

	nop, err := s.GetGlobal(ctx, rpcserver.GlobalNop)
	check.NoError(t, err)
	_, err = s.TimeEvaluator(ctx, nop, client.TimeOptions{MinRepeatMS: -1})
	check.ErrorIs(t, err, proto.ErrBadRequest)
}

func TestTimeEvaluatorReport(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{MaxSessions: 2, InsecureShared: true})
	s := td.connect(t, client.SessionOptions{})
	other := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)
	nop, err := s.GetGlobal(ctx, rpcserver.GlobalNop)
	check.NoError(t, err)

	r, err := s.TimeEvaluator(ctx, nop, client.TimeOptions{Repeat: 6, StableWithin: 0.5})
	check.NoError(t, err)
	rep := r.Report
	check.True(t, rep != nil, "the daemon sends a validity report")
	check.Equal(t, rep.N, 6)
	check.Equal(t, rep.StableWithin, 0.5)
	check.True(t, rep.Verdict == proto.VerdictStable || rep.Verdict == proto.VerdictNoisy && rep.Reason != "", rep)
	check.True(t, rep.CILow <= rep.Median && rep.Median <= rep.CIHigh, rep)
	check.True(t, rep.Machine.CPUs > 0, rep.Machine)
	check.Equal(t, rep.Machine.OtherSessions, 1, "the other session, read from the call board")

	other.Close()
	eventually(t, "the other session's end reaches the worker", func() bool {
		r, err := s.TimeEvaluator(ctx, nop, client.TimeOptions{Repeat: 1})
		check.NoError(t, err)
		return r.Report.Machine.OtherSessions == 0
	})
	r, err = s.TimeEvaluator(ctx, nop, client.TimeOptions{Repeat: 2})
	check.NoError(t, err)
	check.Equal(t, r.Report.Verdict, proto.VerdictNoisy)
	check.True(t, strings.HasPrefix(r.Report.Reason, "too few samples (n=2) for a 95% interval"), r.Report.Reason)

	_, err = s.TimeEvaluator(ctx, nop, client.TimeOptions{StableWithin: 1.5})
	check.ErrorIs(t, err, proto.ErrBadRequest)
}

func TestGlobalsAndAttrs(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{})
	s := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)
	names, err := s.ListGlobals(ctx)
	check.NoError(t, err)
	check.True(t, strings.Contains(strings.Join(names, " "), rpcserver.GlobalEcho), names)
	echo, err := s.GetGlobal(ctx, rpcserver.GlobalEcho)
	check.NoError(t, err)
	tests := []struct {
		in   any
		want any
	}{
		{int64(7), int64(7)},
		{2.5, 2.5},
		{"hi", "hi"},
		{[]byte{1, 2}, []byte{1, 2}},
		{nil, nil},
		{ndarray.Shape{2, 3}, ndarray.Shape{2, 3}},
		{ndarray.Float16, ndarray.Float16},
		{devices.CPUDevice, devices.CPUDevice},
	}
	for _, tc := range tests {
		got, err := echo.Call(ctx, tc.in)
		check.NoError(t, err)
		check.Equal(t, got, tc.want)
	}
	arr, err := s.Empty(ctx, ndarray.Shape{4}, ndarray.Int32, devices.CPUDevice)
	check.NoError(t, err)
	got, err := echo.Call(ctx, arr)
	check.NoError(t, err)
	check.Equal(t, got.(*client.Array).Handle, arr.Handle)

	attrs, err := s.DeviceAttrs(ctx)
	check.NoError(t, err)
	check.True(t, len(attrs.Devices) > 0 && attrs.Devices[0].Device == "cpu:0", attrs)
	check.True(t, attrs.Host.Cores > 0, attrs.Host)

	_, err = s.GetGlobal(ctx, "no.such.function")
	check.ErrorIs(t, err, proto.ErrNotFound)
	_, err = s.Empty(ctx, ndarray.Shape{4}, ndarray.Int32, devices.Device{Type: devices.Type(99)})
	check.True(t, err != nil, "unknown device")
}

func TestShutdownCutsSessions(t *testing.T) {
	cfg := rpcserver.Config{Listen: "127.0.0.1:0", Dir: t.TempDir(), DrainTimeout: 200 * time.Millisecond,
		Worker: rpcserver.WorkerSpec{Path: os.Args[0], Args: []string{"-test.run=^$"}, Env: workerEnvVars()}}
	d, err := rpcserver.New(cfg)
	check.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	s, err := client.Connect(testCtx(t), d.Addr().String(), client.SessionOptions{})
	check.NoError(t, err)
	defer s.Close()
	pid := s.Info().WorkerPID
	cancel()
	select {
	case err := <-done:
		check.NoError(t, err)
	case <-time.After(guard):
		t.Fatal("Run did not return")
	}
	// The worker is gone and the session directories removed.
	check.True(t, syscall.Kill(pid, 0) != nil, "worker still alive", pid)
	left, _ := filepath.Glob(filepath.Join(cfg.Dir, "session-*"))
	check.Equal(t, len(left), 0, left)
	_, err = s.List(testCtx(t))
	check.ErrorIs(t, err, proto.ErrUnavailable)
}

func TestMalformedFrames(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{Token: "tok"})
	tests := []struct {
		name  string
		frame []byte
		code  proto.Code
	}{
		{"oversized", []byte{0xff, 0xff, 0xff, 0xff}, proto.CodeTooLarge},
		{"not msgpack", append([]byte{0, 0, 0, 3}, 0xc1, 0xc1, 0xc1), proto.CodeBadRequest},
		{"not a request", append([]byte{0, 0, 0, 1}, 0x07), proto.CodeBadRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			td.waitIdle(t)
			nc, err := net.DialTimeout("tcp", td.addr, guard)
			check.NoError(t, err)
			defer nc.Close()
			nc.SetDeadline(time.Now().Add(guard))
			check.NoError(t, proto.WriteHello(nc, proto.Hello{Version: proto.ProtocolVersion, Role: proto.RoleClient, Token: "tok"}))
			rep, err := proto.ReadHelloReply(nc)
			check.NoError(t, err)
			check.NoError(t, rep.Err())
			sess, err := yamux.Client(nc, nil)
			check.NoError(t, err)
			defer sess.Close()
			st, err := sess.OpenStream()
			check.NoError(t, err)
			// The daemon may cut the connection before Write returns; what
			// it said before that is still read below.
			st.Write(tc.frame)
			b, err := proto.ReadFrame(st, 0)
			check.NoError(t, err)
			resp, err := proto.DecodeResponse(b)
			check.NoError(t, err)
			check.Equal(t, resp.ID, uint64(0))
			check.True(t, resp.Error != nil && resp.Error.Code == tc.code, resp.Error)
			// The daemon closes that connection and frees the device.
			_, err = proto.ReadFrame(st, 0)
			check.True(t, err != nil, "connection closed")
			eventually(t, "the device is free again", func() bool {
				s, err := client.Connect(testCtx(t), td.addr, client.SessionOptions{Token: "tok"})
				if err == nil {
					s.Close()
				}
				return err == nil
			})
		})
	}
}

func TestNotOpened(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{})
	c, err := proto.Dial(testCtx(t), td.addr, proto.DialOptions{})
	check.NoError(t, err)
	defer c.Close()
	// Every method but session.open is refused before it.
	for _, m := range []string{proto.FileList, proto.FuncCall, proto.GlobalList} {
		err := c.Call(testCtx(t), m, nil, nil)
		check.ErrorIs(t, err, proto.ErrUnauthorized)
	}
	err = c.Upload(testCtx(t), proto.FileUpload, "x", 1, strings.NewReader("x"))
	check.ErrorIs(t, err, proto.ErrUnauthorized)
	var info proto.SessionInfo
	check.NoError(t, c.Call(testCtx(t), proto.SessionOpen, proto.OpenArgs{}, &info))
	var again proto.SessionInfo
	check.NoError(t, c.Call(testCtx(t), proto.SessionOpen, proto.OpenArgs{}, &again))
	check.Equal(t, again, info)
	check.NoError(t, c.Call(testCtx(t), proto.FileList, nil, nil))
	err = c.Call(testCtx(t), "no.such.method", nil, nil)
	check.ErrorIs(t, err, proto.ErrNotFound)
}

// fakeTracker is a Tracker that knows one lease token.
type fakeTracker struct {
	mu       sync.Mutex
	active   []string
	failures []string
	onEnded  func(id string)
}

func (f *fakeTracker) WatchLeases(fn func(id string)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onEnded = fn
}

// endLease plays the tracker's heartbeat reply saying lease id ended.
func (f *fakeTracker) endLease(t *testing.T, id string) {
	f.mu.Lock()
	fn := f.onEnded
	f.mu.Unlock()
	check.True(t, fn != nil, "the daemon did not watch its leases")
	fn(id)
}

func (f *fakeTracker) VerifyLease(ctx context.Context, token string) (proto.LeaseInfo, error) {
	switch token {
	case "good": // asks for more than the daemon allows
		return proto.LeaseInfo{ID: "lease-1", Key: "k", SessionTimeout: 1000 * time.Hour}, nil
	case "short": // asks for less
		return proto.LeaseInfo{ID: "lease-2", Key: "k", SessionTimeout: 10 * time.Second}, nil
	}
	return proto.LeaseInfo{}, fmt.Errorf("lease token %q: %w", token, proto.ErrNotFound)
}

func (f *fakeTracker) SetActiveLeases(ids []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.active = append(f.active, strings.Join(ids, ","))
}

func (f *fakeTracker) ReportFailure(ctx context.Context, message string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures = append(f.failures, message)
	return nil
}

func (f *fakeTracker) snapshot() ([]string, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.active), slices.Clone(f.failures)
}

func TestLeases(t *testing.T) {
	ft := &fakeTracker{}
	td := startDaemon(t, rpcserver.Config{Tracker: ft, SessionTimeout: time.Minute})
	ctx := testCtx(t)
	_, err := client.Connect(ctx, td.addr, client.SessionOptions{})
	check.ErrorIs(t, err, proto.ErrUnauthorized)
	check.Error(t, err, "tracker lease")
	td.waitIdle(t)
	_, err = client.Connect(ctx, td.addr, client.SessionOptions{LeaseToken: "forged"})
	check.ErrorIs(t, err, proto.ErrNotFound)
	td.waitIdle(t)

	// A lease may shorten the daemon's session timeout, never lengthen it.
	short := td.connect(t, client.SessionOptions{LeaseToken: "short"})
	check.True(t, time.Until(short.Expires()) <= 10*time.Second, short.Expires())
	short.Close()
	td.waitIdle(t)
	s := td.connect(t, client.SessionOptions{LeaseToken: "good"})
	check.True(t, time.Until(s.Expires()) <= time.Minute, "a lease asking 1000 h got a session until", s.Expires())
	mod := loadKernels(t, s)
	crash, err := mod.GetFunction(ctx, "crash")
	check.NoError(t, err)
	_, err = crash.Call(ctx, 0)
	check.ErrorIs(t, err, proto.ErrCrashed)
	eventually(t, "the failure is reported", func() bool {
		active, failures := ft.snapshot()
		return len(failures) == 1 && slices.Equal(active, []string{"lease-2", "", "lease-1", ""})
	})
	_, failures := ft.snapshot()
	check.True(t, strings.Contains(failures[0], "SIGSEGV"), failures)
}

// testTLS makes a self-signed certificate for 127.0.0.1: the server's TLS
// configuration and a client's that trusts it.
func testTLS(t testing.TB) (*tls.Config, *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kiln test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	check.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	check.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	srvTLS := &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}
	return srvTLS, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

func TestTLS(t *testing.T) {
	srvTLS, cliTLS := testTLS(t)
	td := startDaemon(t, rpcserver.Config{TLS: srvTLS, Token: "tok"})
	s := td.connect(t, client.SessionOptions{Token: "tok", TLS: cliTLS})
	check.NoError(t, s.Upload(testCtx(t), "x", []byte("over tls")))
	var buf bytes.Buffer
	_, err := s.Download(testCtx(t), "x", &buf)
	check.NoError(t, err)
	check.Equal(t, buf.String(), "over tls")
	// A large file goes on a TLS connection of its own.
	big := bytes.Repeat([]byte("tls bulk "), 300_000)
	check.NoError(t, s.Upload(testCtx(t), "big", big))
	buf.Reset()
	_, err = s.Download(testCtx(t), "big", &buf)
	check.NoError(t, err)
	check.True(t, bytes.Equal(buf.Bytes(), big), "large upload over TLS differs")
	check.NoError(t, s.Close())
	td.waitIdle(t)

	// A client that does not trust the certificate is turned away.
	_, err = client.Connect(testCtx(t), td.addr, client.SessionOptions{Token: "tok", TLS: &tls.Config{MinVersion: tls.VersionTLS12}})
	check.True(t, err != nil, "untrusted certificate")
	// A plain client does not get a session either.
	_, err = client.Connect(testCtx(t), td.addr, client.SessionOptions{Token: "tok", HandshakeTimeout: 2 * time.Second})
	check.True(t, err != nil, "plain client on a TLS listener")
}

func TestWorkerFailsToStart(t *testing.T) {
	for _, spec := range []rpcserver.WorkerSpec{
		{Path: filepath.Join(t.TempDir(), "no-such-binary")},
		{Path: "/bin/sh", Args: []string{"-c", "echo worker refuses >&2; exit 7"}},
	} {
		cfg := rpcserver.Config{Listen: "127.0.0.1:0", Dir: t.TempDir(), Worker: spec, DrainTimeout: time.Second}
		d, err := rpcserver.New(cfg)
		check.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		_, err = client.Connect(testCtx(t), d.Addr().String(), client.SessionOptions{})
		check.Error(t, err, "start worker")
		t.Logf("the client sees: %v", err)
		cancel()
		check.NoError(t, <-done)
	}
}

// TestSlotAfterLease: connections that never open a session, or open one
// with a forged lease, do not take the device: the lease's holder gets it.
func TestSlotAfterLease(t *testing.T) {
	ft := &fakeTracker{}
	td := startDaemon(t, rpcserver.Config{Tracker: ft})
	ctx := testCtx(t)
	idle, err := proto.Dial(ctx, td.addr, proto.DialOptions{})
	check.NoError(t, err)
	defer idle.Close()
	forged, err := proto.Dial(ctx, td.addr, proto.DialOptions{})
	check.NoError(t, err)
	defer forged.Close()
	err = forged.Call(ctx, proto.SessionOpen, proto.OpenArgs{LeaseToken: "forged"}, nil)
	check.ErrorIs(t, err, proto.ErrNotFound)

	s := td.connect(t, client.SessionOptions{LeaseToken: "good"})
	check.NoError(t, s.Upload(ctx, "x", []byte("x")))
	// The holder keeps it: a second lease is refused as busy.
	_, err = client.Connect(ctx, td.addr, client.SessionOptions{LeaseToken: "short"})
	check.ErrorIs(t, err, proto.ErrBusy)
	check.True(t, strings.Contains(td.metrics(t), "kiln_rpcserver_sessions_active 1\n"), td.metrics(t))
}

// TestLeaseEndsSession: when the tracker says a session's lease was
// released or expired, the session ends and the device is free again.
func TestLeaseEndsSession(t *testing.T) {
	ft := &fakeTracker{}
	td := startDaemon(t, rpcserver.Config{Tracker: ft})
	ctx := testCtx(t)
	s := td.connect(t, client.SessionOptions{LeaseToken: "good"})
	check.NoError(t, s.Upload(ctx, "x", []byte("x")))
	ft.endLease(t, "other-lease") // not this session's: nothing happens
	check.NoError(t, s.Upload(ctx, "y", []byte("y")))

	ft.endLease(t, "lease-1") // ends the session before it returns
	_, err := s.List(ctx)
	check.ErrorIs(t, err, proto.ErrSessionExpired)
	check.Error(t, err, "lease lease-1 was released or expired")
	td.waitIdle(t)
	next := td.connect(t, client.SessionOptions{LeaseToken: "short"})
	check.NoError(t, next.Upload(ctx, "x", []byte("x")))
}

// TestSessionTimeoutAskedByClient: a client's Timeout shortens its session
// (never lengthens it past the daemon's limit): the daemon ends it and the
// exclusive device is free for the next client while the first still
// holds its session.
func TestSessionTimeoutAskedByClient(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{SessionTimeout: time.Hour})
	ctx := testCtx(t)
	held := td.connect(t, client.SessionOptions{Timeout: 2 * time.Second})
	check.True(t, time.Until(held.Expires()) < time.Minute, "expires", held.Expires())
	eventually(t, "the short session expires", func() bool {
		_, err := held.List(ctx)
		return errors.Is(err, proto.ErrSessionExpired)
	})
	next := td.connect(t, client.SessionOptions{Timeout: 2 * time.Hour})
	_, err := next.List(ctx)
	check.NoError(t, err)
	check.True(t, time.Until(next.Expires()) <= time.Hour, "a client cannot outlast the daemon's limit", next.Expires())
}
