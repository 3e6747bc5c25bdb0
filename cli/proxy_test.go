package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver"
)

// TestProxy: a device daemon that cannot be dialled connects out to kiln
// proxy (as rpcserver --proxy does), and a client reaches it at the port
// the proxy opened: a session, an upload, a global call and the call
// connection the daemon hands to its worker all go through the proxy. A
// daemon with a wrong token is refused, and a stranger's line on the
// proxy's port is answered with an error.
func TestProxy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	const tok = "proxy-test-token"
	p, err := newProxy("127.0.0.1:0", "", "", tok, quiet)
	check.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx) }()

	_, err = dialProxy(ctx, p.Addr().String(), "wrong-token", "board", quiet)
	check.Error(t, err, "wrong token")
	nc, err := net.Dial("tcp", p.Addr().String())
	check.NoError(t, err)
	_, err = nc.Write([]byte("GET / HTTP/1.0\n"))
	check.NoError(t, err)
	line, err := readLine(nc)
	check.NoError(t, err)
	check.Equal(t, line, "error not a KILNPROXY1 board or conn line")
	nc.Close()

	pl, err := dialProxy(ctx, p.Addr().String(), tok, "board", quiet)
	check.NoError(t, err)
	public, stop := serveThrough(t, ctx, pl, tok)
	check.True(t, public != p.Addr().String(), "the daemon's own port", public)

	s, err := client.Connect(ctx, public, client.SessionOptions{Token: tok})
	check.NoError(t, err)
	check.NoError(t, s.Upload(ctx, "hello.txt", []byte("through the proxy")))
	files, err := s.List(ctx)
	check.NoError(t, err)
	check.Equal(t, len(files), 1)
	echo, err := s.GetGlobal(ctx, "testing.echo")
	check.NoError(t, err)
	for i := range 3 {
		got, err := s.Call(ctx, echo, int64(40+i))
		check.NoError(t, err)
		check.Equal(t, got, any(int64(40+i)))
	}
	check.NoError(t, s.Close())

	// A client that dials the proxy's own port, as TVM's
	// rpc.connect(proxy_host, proxy_port, key=...) does, is told what the
	// port is; a lookup by key names the port of the board serving it.
	_, err = client.Connect(ctx, p.Addr().String(), client.SessionOptions{Token: tok})
	check.Error(t, err, proxyClientRefusal)
	check.Equal(t, proxyLookup(t, p, "board"), "ok "+public)
	check.Equal(t, proxyLookup(t, p, "nope"), `error no board with key "nope" is connected to the proxy (connected: "board")`)
	s, err = client.Connect(ctx, strings.TrimPrefix(proxyLookup(t, p, "board"), "ok "), client.SessionOptions{Token: tok})
	check.NoError(t, err)
	check.NoError(t, s.Close())

	stop()
	// Once the daemon has left, its key is no longer served.
	gone := ""
	for range 400 {
		if gone = proxyLookup(t, p, "board"); strings.HasPrefix(gone, "error") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	check.Equal(t, gone, `error no board with key "board" is connected to the proxy (none is)`)
	cancel()
	check.NoError(t, <-served)
}

// serveThrough runs a device daemon (key "board") on the proxy listener
// pl and returns the address clients reach it at, and a function that
// stops it and waits until it has.
func serveThrough(t *testing.T, ctx context.Context, pl *proxyListener, tok string) (string, func()) {
	t.Helper()
	exe, err := os.Executable()
	check.NoError(t, err)
	d, err := rpcserver.New(rpcserver.Config{Listener: pl, Key: "board", Token: tok, Dir: filepath.Join(t.TempDir(), "sessions"),
		Version: Version(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Worker: rpcserver.WorkerSpec{Path: exe}})
	check.NoError(t, err)
	dctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- d.Run(dctx) }()
	return d.Addr().String(), func() {
		stop()
		<-ran
	}
}

// proxyLookup asks the proxy for the board serving key and returns its
// answer line.
func proxyLookup(t *testing.T, p *proxy, key string) string {
	t.Helper()
	nc, err := net.Dial("tcp", p.Addr().String())
	check.NoError(t, err)
	defer nc.Close()
	_, err = nc.Write([]byte(proxyMagic + " lookup " + key + "\n"))
	check.NoError(t, err)
	line, err := readLine(nc)
	check.NoError(t, err)
	return line
}

// TestProxyReconnect: a daemon serving through kiln proxy loses the proxy
// (it stops, closing every connection, as a killed proxy's do), connects
// again once a new proxy listens on the same port, gets the port it had,
// and a client reaches it there again.
func TestProxyReconnect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	const tok = "proxy-test-token"
	p1, err := newProxy("127.0.0.1:0", "", "", tok, quiet)
	check.NoError(t, err)
	addr := p1.Addr().String()
	ctx1, stop1 := context.WithCancel(ctx)
	served1 := make(chan error, 1)
	go func() { served1 <- p1.Serve(ctx1) }()

	var logs syncBuffer
	pl, err := dialProxy(ctx, addr, tok, "board", slog.New(slog.NewTextHandler(&logs, nil)))
	check.NoError(t, err)
	public, stopDaemon := serveThrough(t, ctx, pl, tok)

	echo := func() error {
		s, err := client.Connect(ctx, public, client.SessionOptions{Token: tok})
		if err != nil {
			return err
		}
		defer s.Close()
		f, err := s.GetGlobal(ctx, "testing.echo")
		if err != nil {
			return err
		}
		got, err := s.Call(ctx, f, int64(7))
		if err == nil && got != any(int64(7)) {
			err = fmt.Errorf("echo gave %v", got)
		}
		return err
	}
	check.NoError(t, echo())

	// The proxy goes away: its port and the daemon's are closed.
	stop1()
	check.NoError(t, <-served1)
	check.True(t, echo() != nil, "no proxy, no daemon")

	// A new proxy on the same port: the daemon connects again.
	p2, err := newProxy(addr, "", "", tok, quiet)
	check.NoError(t, err)
	served2 := make(chan error, 1)
	go func() { served2 <- p2.Serve(ctx) }()
	err = errors.New("not tried")
	for i := 0; i < 3000 && err != nil; i++ {
		if err = echo(); err != nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
	check.NoError(t, err, "the daemon is reachable through the new proxy at its old port")
	check.Equal(t, proxyLookup(t, p2, "board"), "ok "+public)
	check.True(t, strings.Contains(logs.String(), "lost the kiln proxy") && strings.Contains(logs.String(), "connected to the kiln proxy again"), "the reconnection is logged:\n"+logs.String())

	stopDaemon()
	cancel()
	check.NoError(t, <-served2)
}
