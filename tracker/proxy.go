package tracker

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// handoff is a leading replica's listeners as its term's tracker sees
// them: the replica accepts every connection and hands the term those it
// serves itself.
type handoff struct {
	kiln, tvm *handoffListener // tvm nil without a TVM listener
}

func newHandoff(kiln, tvm net.Listener) *handoff {
	h := &handoff{kiln: newHandoffListener(kiln.Addr())}
	if tvm != nil {
		h.tvm = newHandoffListener(tvm.Addr())
	}
	return h
}

func (h *handoff) close() {
	h.kiln.Close()
	if h.tvm != nil {
		h.tvm.Close()
	}
}

// handoffListener is a net.Listener whose connections are handed to it.
type handoffListener struct {
	addr   net.Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newHandoffListener(addr net.Addr) *handoffListener {
	return &handoffListener{addr: addr, conns: make(chan net.Conn), closed: make(chan struct{})}
}

// hand gives c to the listener's Accept, or closes it when the listener
// is closed first.
func (l *handoffListener) hand(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.closed:
		c.Close()
	}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *handoffListener) Addr() net.Addr { return l.addr }

// proxyDialTimeout bounds dialling the leader for a forwarded connection.
const proxyDialTimeout = 5 * time.Second

// proxies are the connections a follower forwards to the leader, by the
// leader they go to, so that a change of leader closes them: their
// clients reconnect and reach the new one.
type proxies struct {
	mu     sync.Mutex
	conns  map[net.Conn]string // client side → leader id
	closed bool
}

// forward copies bytes both ways between c and the leader at addr until
// either side closes. It returns the error of dialling the leader, nil
// once connected.
func (p *proxies) forward(c net.Conn, leaderID, addr string) error {
	up, err := net.DialTimeout("tcp", addr, proxyDialTimeout)
	if err != nil {
		c.Close()
		return err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.Close()
		up.Close()
		return nil
	}
	if p.conns == nil {
		p.conns = map[net.Conn]string{}
	}
	p.conns[c] = leaderID
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	c.Close()
	up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	return nil
}

// leaderChanged closes the connections forwarded to another leader than
// id.
func (p *proxies) leaderChanged(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c, to := range p.conns {
		if to != id {
			c.Close()
		}
	}
}

// closeAll closes every forwarded connection and refuses new ones.
func (p *proxies) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
}

// acceptAll accepts connections on ln and gives each to route, until ln
// is closed.
func acceptAll(ln net.Listener, route func(net.Conn)) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return err
		}
		go route(c)
	}
}
