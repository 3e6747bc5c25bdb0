package metrics

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// MaxConns bounds the connections a metrics listener serves at once: a
// scraper needs one, and idle connections must not exhaust the process's
// descriptors (which would lock out its other listeners too).
const MaxConns = 64

// NewServer is the HTTP server of a /metrics listener, with timeouts on
// every phase so that slow or idle peers are dropped: 10 s to send the
// headers and the request, 30 s to take the response, 30 s idle between
// requests, 16 KiB of headers.
func NewServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       30 * time.Second,
		MaxHeaderBytes:    16 << 10,
	}
}

// LimitListener returns ln accepting at most n connections at once; a
// further connection waits in the kernel's backlog until one closes.
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
