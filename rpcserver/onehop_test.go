package rpcserver_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestCallConnection: calls go on a connection the daemon hands to the
// worker, and the daemon still counts them; the ticket that admits that
// connection is good once.
func TestCallConnection(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{Token: "tok"})
	s := td.connect(t, client.SessionOptions{Token: "tok"})
	ctx := testCtx(t)
	check.True(t, s.Info().CallTicket != "", "a session on a plain TCP daemon gets a call ticket")
	eventually(t, "the call connection is handed to the worker", func() bool {
		return strings.Contains(td.logs.String(), "call connection handed to the worker")
	})
	echo, err := s.GetGlobal(ctx, rpcserver.GlobalEcho)
	check.NoError(t, err)
	const n = 25
	for i := range n {
		out, err := echo.Call(ctx, int64(i))
		check.NoError(t, err)
		check.Equal(t, out, any(int64(i)))
	}
	// A failing call is counted with its code.
	_, err = s.GetGlobal(ctx, "no.such.function")
	check.ErrorIs(t, err, proto.ErrNotFound)
	m := td.metrics(t)
	check.True(t, strings.Contains(m, fmt.Sprintf(`kiln_rpcserver_calls_total{code="ok",method="func.call"} %d`, n)), m)
	check.True(t, strings.Contains(m, `kiln_rpcserver_calls_total{code="not_found",method="global.get"} 1`), m)
	check.True(t, strings.Contains(m, "kiln_rpcserver_worker_calls_in_flight 0\n"), m)

	// The ticket was spent by the client's own call connection: another
	// connection presenting it (a replay) is refused by the daemon.
	for _, tc := range []struct{ ticket, why string }{
		{s.Info().CallTicket, "a spent ticket"},
		{"0123456789abcdef", "a made-up ticket"},
	} {
		nc, err := proto.DialRaw(ctx, td.addr, proto.DialOptions{Role: proto.RoleCall, Token: "tok"})
		check.NoError(t, err)
		check.NoError(t, proto.WriteFrame(nc, proto.CallTicket{Ticket: tc.ticket}, 0))
		nc.SetReadDeadline(time.Now().Add(guard))
		b, err := proto.ReadFrame(nc, 0)
		check.NoError(t, err, tc.why)
		resp, err := proto.DecodeResponse(b)
		check.NoError(t, err)
		check.True(t, resp.Error != nil, tc.why+" is refused")
		check.ErrorIs(t, resp.Error, proto.ErrUnauthorized)
		nc.Close()
	}
	// A call connection without the token does not get past the hello.
	_, err = proto.DialRaw(ctx, td.addr, proto.DialOptions{Role: proto.RoleCall, Token: "wrong"})
	check.ErrorIs(t, err, proto.ErrUnauthorized)
	// The session still works.
	_, err = echo.Call(ctx, "still here")
	check.NoError(t, err)
}

// TestCallPastDeadline: a kernel that outlives its call's deadline on the
// call connection makes the worker end itself; the daemon, reading the
// call board, says which call it was and frees the device.
func TestCallPastDeadline(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{})
	s := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)
	mod := loadKernels(t, s)
	sleep, err := mod.GetFunction(ctx, "sleep_ms")
	check.NoError(t, err)
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = sleep.Call(cctx, int64(600_000))
	cancel()
	check.ErrorIs(t, err, proto.ErrDeadline)
	eventually(t, "the session ends at the call's deadline", func() bool {
		_, err := s.List(ctx)
		return errors.Is(err, proto.ErrDeadline)
	})
	_, err = s.List(ctx)
	check.Error(t, err, "ran past the call's deadline", `function "sleep_ms"`)
	check.True(t, strings.Contains(td.logs.String(), "call past its deadline: worker killed"), "the daemon logs the kill")
	m := td.metrics(t)
	check.True(t, strings.Contains(m, `kiln_rpcserver_sessions_ended_total{how="call_deadline"} 1`), m)
	// The device is free at once, long before the session's deadline.
	s2 := td.connect(t, client.SessionOptions{})
	_, err = s2.List(ctx)
	check.NoError(t, err)
}

// TestTLSKeepsDaemonOnPath: a TLS session gets no call ticket (its
// encryption state stays in the daemon), and its calls and crashes go
// through the daemon as before.
func TestTLSKeepsDaemonOnPath(t *testing.T) {
	srvTLS, cliTLS := testTLS(t)
	td := startDaemon(t, rpcserver.Config{TLS: srvTLS, Token: "tok"})
	s := td.connect(t, client.SessionOptions{Token: "tok", TLS: cliTLS})
	ctx := testCtx(t)
	check.Equal(t, s.Info().CallTicket, "")
	mod := loadKernels(t, s)
	crash, err := mod.GetFunction(ctx, "crash")
	check.NoError(t, err)
	_, err = crash.Call(ctx, 0)
	check.ErrorIs(t, err, proto.ErrCrashed)
	check.Error(t, err, "SIGSEGV", `function "crash"`)
	check.True(t, !strings.Contains(td.logs.String(), "call connection handed"), "no call connection over TLS")
}

// TestCallConnectionBadFrames: the worker serving a call connection
// refuses what the daemon would: an oversized frame (past the daemon's
// MaxFrameSize too) and a request nested past the decoder's bound. It
// closes that connection only: the worker and the session live on.
func TestCallConnectionBadFrames(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{Token: "tok", MaxFrameSize: 64 << 10})
	ctx := testCtx(t)
	nested := []byte{0x83, 0xa2, 'i', 'd', 0x01, 0xa6, 'm', 'e', 't', 'h', 'o', 'd', 0xa9, 'f', 'u', 'n', 'c', '.', 'c', 'a', 'l', 'l', 0xa4, 'a', 'r', 'g', 's'}
	for range 50_000 {
		nested = append(nested, 0x91)
	}
	nested = append(nested, 0xc0)
	frame := func(payload []byte) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(payload))), payload...)
	}
	for _, tc := range []struct {
		name  string
		frame []byte
		code  proto.Code
	}{
		{"oversized", []byte{0xff, 0xff, 0xff, 0xff}, proto.CodeTooLarge},
		{"past the daemon's frame limit", frame(bytes.Repeat([]byte{0xc0}, 100<<10)), proto.CodeTooLarge},
		{"nested past the bound", frame(nested), proto.CodeBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			td.waitIdle(t)
			c, err := proto.Dial(ctx, td.addr, proto.DialOptions{Role: proto.RoleClient, Token: "tok"})
			check.NoError(t, err)
			defer c.Close()
			var info proto.SessionInfo
			check.NoError(t, c.Call(ctx, proto.SessionOpen, proto.OpenArgs{}, &info))
			check.True(t, info.CallTicket != "", "a call ticket")
			nc, err := proto.DialRaw(ctx, td.addr, proto.DialOptions{Role: proto.RoleCall, Token: "tok"})
			check.NoError(t, err)
			defer nc.Close()
			nc.SetDeadline(time.Now().Add(guard))
			check.NoError(t, proto.WriteFrame(nc, proto.CallTicket{Ticket: info.CallTicket}, 0))
			b, err := proto.ReadFrame(nc, 0)
			check.NoError(t, err)
			ack, err := proto.DecodeResponse(b)
			check.NoError(t, err)
			check.True(t, ack.ID == 1 && ack.Error == nil, "the worker took the connection", ack.Error)

			nc.Write(tc.frame) // the worker may cut the connection before Write returns
			b, err = proto.ReadFrame(nc, 0)
			check.NoError(t, err)
			resp, err := proto.DecodeResponse(b)
			check.NoError(t, err)
			check.True(t, resp.ID == 0 && resp.Error != nil && resp.Error.Code == tc.code, resp.Error)
			_, err = proto.ReadFrame(nc, 0)
			check.True(t, err != nil, "the call connection is closed")

			// The worker lives: calls through the daemon still reach it.
			var fi proto.FuncInfo
			check.NoError(t, c.Call(ctx, proto.GlobalGet, proto.GetFunctionArgs{Name: rpcserver.GlobalNop}, &fi))
			check.NoError(t, c.Call(ctx, proto.FuncCall, proto.CallArgs{Func: fi.Handle}, nil))
		})
	}
}
