package cli

import (
	"context"
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

	_, err = dialProxy(ctx, p.Addr().String(), "wrong-token", "board")
	check.Error(t, err, "wrong token")
	nc, err := net.Dial("tcp", p.Addr().String())
	check.NoError(t, err)
	_, err = nc.Write([]byte("GET / HTTP/1.0\n"))
	check.NoError(t, err)
	line, err := readLine(nc)
	check.NoError(t, err)
	check.Equal(t, line, "error not a KILNPROXY1 board or conn line")
	nc.Close()

	pl, err := dialProxy(ctx, p.Addr().String(), tok, "board")
	check.NoError(t, err)
	exe, err := os.Executable()
	check.NoError(t, err)
	d, err := rpcserver.New(rpcserver.Config{Listener: pl, Key: "board", Token: tok, Dir: filepath.Join(t.TempDir(), "sessions"),
		Version: Version(), Logger: quiet, Worker: rpcserver.WorkerSpec{Path: exe}})
	check.NoError(t, err)
	dctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- d.Run(dctx) }()
	public := d.Addr().String()
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
	<-ran
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
