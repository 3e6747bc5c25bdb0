package rpcserver_test

import (
	"context"
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
