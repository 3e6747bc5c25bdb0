package metrics

import (
	"container/list"
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits of a metrics listener (see Serve).
const (
	// MaxConns bounds the connections a metrics listener holds at once: a
	// scraper and the probes need a few, and idle connections must not
	// exhaust the process's descriptors (which would lock out its other
	// listeners too).
	MaxConns = 64
	// MaxConnsPerPeer bounds the connections of one peer (an IP address).
	MaxConnsPerPeer = 16
	// HeaderTimeout bounds the time from a connection's accept (or its
	// last response) to its request's headers.
	HeaderTimeout = 5 * time.Second
	// IdleTimeout bounds a kept-alive connection's wait for its next
	// request.
	IdleTimeout = 10 * time.Second
)

// NewServer is the HTTP server of a /metrics listener, with timeouts on
// every phase so that slow or idle peers are dropped: HeaderTimeout to
// send the headers, 10 s for the whole request, 30 s to take the
// response, IdleTimeout between requests, 16 KiB of headers. Serve it with
// Serve.
func NewServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: HeaderTimeout,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    16 << 10,
	}
}

// Serve serves srv (from NewServer) on ln, holding at most MaxConns
// connections, MaxConnsPerPeer of one peer. A connection that finds the
// listener (or its peer's share) full does not wait behind the others:
// the oldest connection that is not in the middle of a request (one
// that sent nothing yet, or waits idle between requests) is closed to make
// room for it, so that connections held open and idle cannot keep a
// liveness probe or a scrape out. Only when every connection is in a
// request (each bounded by the server's timeouts) is the new one closed.
func Serve(srv *http.Server, ln net.Listener) error {
	g := newGuard(ln, MaxConns, MaxConnsPerPeer)
	prev := srv.ConnState
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		g.state(c, st)
		if prev != nil {
			prev(c, st)
		}
	}
	return srv.Serve(g)
}

// guard is the listener Serve serves on.
type guard struct {
	net.Listener
	max, perPeer int

	mu     sync.Mutex
	conns  map[net.Conn]*guarded
	idle   *list.List // of *guarded, oldest first: those not in a request
	byPeer map[string]int
}

// guarded is one connection the guard holds.
type guarded struct {
	c    net.Conn
	peer string
	at   *list.Element // in idle; nil while in a request
}

func newGuard(ln net.Listener, max, perPeer int) *guard {
	return &guard{Listener: ln, max: max, perPeer: perPeer, conns: map[net.Conn]*guarded{}, idle: list.New(), byPeer: map[string]int{}}
}

func (g *guard) Accept() (net.Conn, error) {
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if gc := g.admit(c); gc != nil {
			return gc, nil
		}
		c.Close()
	}
}

// admit takes c in, making room for it, or returns nil when there is none.
func (g *guard) admit(c net.Conn) net.Conn {
	peer := c.RemoteAddr().String()
	if h, _, err := net.SplitHostPort(peer); err == nil {
		peer = h
	}
	var evict []net.Conn
	g.mu.Lock()
	if g.byPeer[peer] >= g.perPeer {
		e := g.oldestIdle(peer)
		if e == nil {
			g.mu.Unlock()
			return nil
		}
		evict = append(evict, g.drop(e))
	}
	if len(g.conns) >= g.max {
		e := g.oldestIdle("")
		if e == nil {
			g.mu.Unlock()
			for _, c := range evict {
				c.Close()
			}
			return nil
		}
		evict = append(evict, g.drop(e))
	}
	gc := &guardConn{Conn: c, g: g}
	e := &guarded{c: gc, peer: peer}
	e.at = g.idle.PushBack(e)
	g.conns[gc] = e
	g.byPeer[peer]++
	g.mu.Unlock()
	for _, c := range evict {
		c.Close()
	}
	return gc
}

// oldestIdle returns the oldest connection not in a request, of peer
// (any peer when ""), or nil.
func (g *guard) oldestIdle(peer string) *guarded {
	for el := g.idle.Front(); el != nil; el = el.Next() {
		if e := el.Value.(*guarded); peer == "" || e.peer == peer {
			return e
		}
	}
	return nil
}

// drop forgets e (g.mu held) and returns its connection, to be closed.
func (g *guard) drop(e *guarded) net.Conn {
	if e.at != nil {
		g.idle.Remove(e.at)
		e.at = nil
	}
	delete(g.conns, e.c)
	if g.byPeer[e.peer]--; g.byPeer[e.peer] <= 0 {
		delete(g.byPeer, e.peer)
	}
	return e.c
}

// state follows a connection through the HTTP server's states.
func (g *guard) state(c net.Conn, st http.ConnState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.conns[c]
	if e == nil {
		return
	}
	switch st {
	case http.StateActive:
		if e.at != nil {
			g.idle.Remove(e.at)
			e.at = nil
		}
	case http.StateIdle:
		if e.at == nil {
			e.at = g.idle.PushBack(e)
		}
	case http.StateClosed, http.StateHijacked:
		g.drop(e)
	}
}

// guardConn is a connection the guard holds; closing it lets it go.
type guardConn struct {
	net.Conn
	g    *guard
	once sync.Once
}

func (c *guardConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.g.mu.Lock()
		if e := c.g.conns[c]; e != nil {
			c.g.drop(e)
		}
		c.g.mu.Unlock()
	})
	return err
}

// LimitListener returns ln accepting at most n connections at once; a
// further connection waits in the kernel's backlog until one closes. It
// is for listeners that are not HTTP; an HTTP metrics listener uses
// Serve.
func LimitListener(ln net.Listener, n int) net.Listener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{})}
}

type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
