package metrics

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestLimitListener: past the limit, a connection is not accepted until
// one of the accepted ones closes.
func TestLimitListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	l := LimitListener(ln, 2)
	defer l.Close()
	accepted := make(chan net.Conn, 3)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	for range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		check.NoError(t, err)
		defer c.Close()
	}
	first := <-accepted
	<-accepted
	select {
	case <-accepted:
		t.Fatal("a third connection was accepted past the limit of 2")
	case <-time.After(100 * time.Millisecond):
	}
	first.Close()
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting connection was not accepted after one closed")
	}
}

// probeTimeout is how long a probe may wait for its answer: longer than
// Kubernetes' default probe timeout (1 s), after which an unanswered
// liveness probe counts as a failure and, repeated, restarts the pod.
const probeTimeout = 5 * time.Second

// hold opens n connections to addr that send nothing, until the test ends.
func hold(t *testing.T, addr string, n int) {
	t.Helper()
	for range n {
		c, err := net.Dial("tcp", addr)
		check.NoError(t, err)
		t.Cleanup(func() { c.Close() })
	}
}

// TestServeIdleFlood: a peer holding more idle connections than the
// listener's whole limit, some with a request's first line sent, some
// after a request kept alive, does not keep a health probe out.
func TestServeIdleFlood(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	mux := http.NewServeMux()
	HandleHealth(mux, func() error { return nil })
	srv := NewServer(mux)
	done := make(chan error, 1)
	go func() { done <- Serve(srv, ln) }()
	defer func() {
		srv.Close()
		check.ErrorIs(t, <-done, http.ErrServerClosed)
	}()
	addr := ln.Addr().String()

	kept := &http.Client{Timeout: probeTimeout}
	for range MaxConnsPerPeer {
		resp, err := kept.Get("http://" + addr + LivePath) // a connection kept alive, idle
		check.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	hold(t, addr, MaxConns+8)
	for range 8 {
		c, err := net.Dial("tcp", addr)
		check.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		_, err = c.Write([]byte("GET /metrics HTTP/1.1\r\n"))
		check.NoError(t, err)
	}

	probe := &http.Client{Timeout: probeTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
	for _, path := range []string{LivePath, ReadyPath, LivePath} {
		resp, err := probe.Get("http://" + addr + path)
		check.NoError(t, err, path)
		resp.Body.Close()
		check.Equal(t, resp.StatusCode, http.StatusOK, path)
	}
}

// TestServePerPeer: one peer holds no more than MaxConnsPerPeer
// connections: its further ones take the place of its own oldest idle
// ones, never another peer's.
func TestServePerPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	g := newGuard(ln, MaxConns, 2)
	defer g.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := g.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	var first net.Conn
	for i := range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		check.NoError(t, err)
		defer c.Close()
		if i == 0 {
			first = c
		}
		(<-accepted).SetDeadline(time.Now().Add(probeTimeout))
	}
	// The first connection was closed to make room for the third.
	first.SetReadDeadline(time.Now().Add(probeTimeout))
	_, err = first.Read(make([]byte, 1))
	check.ErrorIs(t, err, io.EOF)
	g.mu.Lock()
	n := g.byPeer["127.0.0.1"]
	g.mu.Unlock()
	check.Equal(t, n, 2)
}
