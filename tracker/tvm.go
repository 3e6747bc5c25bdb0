package tracker

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/internal/refusal"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// tvmState is the TVM-protocol side: TVM rpc servers and their requests,
// kept apart from kiln's devices (they speak another protocol).
//
// The protocol has no authentication, so what one peer can make the
// tracker hold is bounded: connections, keys put and match keys pending
// per connection, and info keys.
// Limits of the TVM listener.
const (
	// DefaultTVMIdleTimeout is Config.TVMIdleTimeout's default.
	DefaultTVMIdleTimeout = 2 * time.Minute
	// DefaultTVMMaxConnsPerPeer is Config.TVMMaxConnsPerPeer's default: a
	// host may run many TVM rpc servers (one per board), but one peer
	// must not hold the listener's whole tvmMaxConns.
	DefaultTVMMaxConnsPerPeer = 128

	tvmMaxConns    = 1024
	tvmMaxPuts     = 64   // distinct keys one connection serves
	tvmMaxPending  = 1024 // match keys one connection has outstanding
	tvmMaxInfoKeys = 64
)

type tvmState struct {
	mu     sync.Mutex
	conns  map[*tvmConn]struct{}
	byPeer map[string]int // connections by peer host
	// refusals summarizes refused connections in the log.
	refusals refusal.Log
	queues   map[string]*tvmQueue
	seq      uint64
	closed   bool
}

type tvmConn struct {
	nc   net.Conn
	host string
	wmu  sync.Mutex

	// Guarded by tvmState.mu.
	info    map[string]any
	pending map[string]bool // match keys put and not yet handed out
	puts    []*tvmValue
	closed  bool
}

type tvmValue struct {
	conn     *tvmConn
	key      string
	addr     string
	port     int
	matchKey string
}

type tvmReq struct {
	conn     *tvmConn
	priority int
	seq      uint64
}

type tvmQueue struct {
	values   []*tvmValue
	requests []*tvmReq // priority high first, then arrival
}

func (t *tvmState) init() {
	t.conns = make(map[*tvmConn]struct{})
	t.byPeer = make(map[string]int)
	t.queues = make(map[string]*tvmQueue)
}

func (t *tvmState) queue(key string) *tvmQueue {
	q := t.queues[key]
	if q == nil {
		q = &tvmQueue{}
		t.queues[key] = q
	}
	return q
}

// closeAll closes every TVM connection and refuses new ones.
func (t *tvmState) closeAll() {
	t.mu.Lock()
	t.closed = true
	conns := make([]*tvmConn, 0, len(t.conns))
	for c := range t.conns {
		conns = append(conns, c)
	}
	t.mu.Unlock()
	for _, c := range conns {
		c.nc.Close()
	}
}

func (t *tvmState) counts() (servers, pending int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, q := range t.queues {
		servers += len(q.values)
		pending += len(q.requests)
	}
	return servers, pending
}

func (t *tvmState) servers() []proto.TVMServerSummary {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []proto.TVMServerSummary
	for c := range t.conns {
		for _, v := range c.puts {
			free := 0
			if c.pending[v.matchKey] {
				free = 1
			}
			pending := 0
			if q := t.queues[v.key]; q != nil {
				pending = len(q.requests)
			}
			out = append(out, proto.TVMServerSummary{Key: v.key, Addr: net.JoinHostPort(v.addr, strconv.Itoa(v.port)), Free: free, Pending: pending})
		}
	}
	slices.SortFunc(out, func(a, b proto.TVMServerSummary) int { return strings.Compare(a.Key+a.Addr, b.Key+b.Addr) })
	return out
}

// serveTVM accepts TVM-protocol connections until ctx ends, then closes
// them all and waits for their goroutines.
func (s *Server) serveTVM(ctx context.Context) {
	var wg sync.WaitGroup
	stop := context.AfterFunc(ctx, func() {
		s.tvmLn.Close()
		s.tvm.closeAll()
	})
	defer stop()
	var backoff time.Duration
	for {
		nc, err := s.tvmLn.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				break
			}
			// Transient failures (too many open files) must not stop the
			// listener for good: back off and retry, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("tvm tracker accept failed", "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
			}
			continue
		}
		backoff = 0
		wg.Go(func() { s.serveTVMConn(ctx, nc) })
	}
	s.tvm.closeAll()
	wg.Wait()
	s.tvm.refusals.Close()
}

func (s *Server) serveTVMConn(ctx context.Context, nc net.Conn) {
	log := s.log.With("tvm_peer", nc.RemoteAddr().String())
	host, _, _ := net.SplitHostPort(nc.RemoteAddr().String())
	c := &tvmConn{nc: nc, host: host, info: map[string]any{"addr": []any{host, 0}}, pending: map[string]bool{}}
	s.tvm.mu.Lock()
	if s.tvm.closed {
		s.tvm.mu.Unlock()
		nc.Close()
		return
	}
	if len(s.tvm.conns) >= tvmMaxConns {
		s.tvm.mu.Unlock()
		s.tvm.refusals.Note(s.log, host, "tvm tracker: too many connections, refusing", "limit", tvmMaxConns)
		nc.Close()
		return
	}
	// A replicated tracker's followers forward their peers' connections
	// from their own address: there the cap would be per follower.
	if s.tvm.byPeer[host] >= s.cfg.TVMMaxConnsPerPeer && !s.cfg.replicated() {
		s.tvm.mu.Unlock()
		s.tvm.refusals.Note(s.log, host, "tvm tracker: a peer holds too many connections, refusing", "limit_per_peer", s.cfg.TVMMaxConnsPerPeer)
		nc.Close()
		return
	}
	s.tvm.conns[c] = struct{}{}
	s.tvm.byPeer[host]++
	s.tvm.mu.Unlock()
	defer s.tvmConnClosed(c)

	nc.SetDeadline(time.Now().Add(proto.DefaultHandshakeTimeout))
	var hdr [4]byte
	if _, err := io.ReadFull(nc, hdr[:]); err != nil {
		log.Warn("tvm tracker handshake", "err", err)
		return
	}
	if magic := int32(binary.LittleEndian.Uint32(hdr[:])); magic != tvmMagic {
		log.Warn("tvm tracker handshake: wrong magic, closing", "magic", magic)
		return
	}
	if _, err := nc.Write(hdr[:]); err != nil {
		return
	}
	nc.SetDeadline(time.Time{})
	in := &countingReader{r: nc}
	for {
		// A connection that sends nothing for TVMIdleTimeout is closed,
		// unless it waits for a server (TVM's REQUEST is answered only
		// when one is free); one that stops in the middle of a frame is
		// closed too.
		nc.SetReadDeadline(time.Now().Add(s.cfg.TVMIdleTimeout))
		before := in.n
		b, err := readTVMFrame(in)
		var ne net.Error
		if err != nil && errors.As(err, &ne) && ne.Timeout() && in.n == before && s.tvm.waiting(c) {
			continue
		}
		if err != nil && errors.As(err, &ne) && ne.Timeout() {
			log.Debug("tvm tracker: closing an idle connection", "idle_timeout", s.cfg.TVMIdleTimeout)
			return
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && ctx.Err() == nil {
				log.Warn("tvm tracker: closing connection", "err", err)
			}
			return
		}
		m, err := decodeTVMMessage(b)
		if err != nil {
			log.Warn("tvm tracker: closing connection", "err", err)
			return
		}
		if !s.tvmHandle(c, m) {
			return
		}
	}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// waiting reports whether c has a request queued for a server.
func (t *tvmState) waiting(c *tvmConn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, q := range t.queues {
		for _, r := range q.requests {
			if r.conn == c {
				return true
			}
		}
	}
	return false
}

// tvmReply writes one frame to c; it reports whether that worked.
func (c *tvmConn) reply(v any) bool {
	b, err := encodeTVMFrame(v)
	if err != nil {
		return false
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err = c.nc.Write(b)
	return err == nil
}

// tvmHandle serves one message; false closes the connection.
func (s *Server) tvmHandle(c *tvmConn, m tvmMessage) bool {
	switch m.Code {
	case tvmPing:
		return c.reply(tvmSuccess)
	case tvmPut:
		addr := m.Addr
		if addr == "" {
			addr = c.host
		}
		v := &tvmValue{conn: c, key: m.Key, addr: addr, port: m.Port, matchKey: m.MatchKey}
		s.tvm.mu.Lock()
		if len(c.pending) >= tvmMaxPending || (len(c.puts) >= tvmMaxPuts && !slices.ContainsFunc(c.puts, func(o *tvmValue) bool { return o.key == v.key })) {
			s.tvm.mu.Unlock()
			s.log.Warn("tvm tracker: a connection passed its limits, closing it", "pending", len(c.pending), "keys", len(c.puts))
			c.reply(tvmFail)
			return false
		}
		c.pending[m.MatchKey] = true
		// A TVM server puts itself again, with a new match key, after
		// every session: it is the same server (one connection, one key),
		// so its last put replaces the earlier ones in the list of
		// servers, which would otherwise grow with every session.
		c.puts = slices.DeleteFunc(c.puts, func(o *tvmValue) bool { return o.key == v.key })
		c.puts = append(c.puts, v)
		s.tvm.queue(m.Key).values = append(s.tvm.queue(m.Key).values, v)
		s.tvm.mu.Unlock()
		if !c.reply(tvmSuccess) {
			return false
		}
		s.tvmSchedule(m.Key)
		return true
	case tvmRequest:
		s.tvm.mu.Lock()
		s.tvm.seq++
		q := s.tvm.queue(m.Key)
		r := &tvmReq{conn: c, priority: m.Priority, seq: s.tvm.seq}
		i := sort.Search(len(q.requests), func(i int) bool {
			x := q.requests[i]
			return x.priority < r.priority || (x.priority == r.priority && x.seq > r.seq)
		})
		q.requests = slices.Insert(q.requests, i, r)
		s.tvm.mu.Unlock()
		s.tvmSchedule(m.Key)
		return true
	case tvmGetPendingMatchkeys:
		s.tvm.mu.Lock()
		keys := make([]string, 0, len(c.pending))
		for k := range c.pending {
			keys = append(keys, k)
		}
		s.tvm.mu.Unlock()
		slices.Sort(keys)
		return c.reply(keys)
	case tvmStop:
		if s.cfg.TVMStopKey == "" || m.StopKey != s.cfg.TVMStopKey {
			return c.reply(tvmFail)
		}
		c.reply(tvmSuccess)
		s.log.Info("stop requested over the TVM tracker protocol")
		s.runMu.Lock()
		if s.runCancel != nil {
			s.runCancel()
		}
		s.runMu.Unlock()
		return true
	case tvmUpdateInfo:
		if a, ok := m.Info["addr"].([]any); ok && len(a) > 0 && a[0] == nil {
			a[0] = c.host
		}
		s.tvm.mu.Lock()
		for k, v := range m.Info {
			if _, ok := c.info[k]; !ok && len(c.info) >= tvmMaxInfoKeys {
				continue
			}
			c.info[k] = v
		}
		s.tvm.mu.Unlock()
		return c.reply(tvmSuccess)
	case tvmSummary:
		return c.reply([]any{tvmSuccess, s.tvmSummary()})
	}
	return false
}

// tvmSchedule hands free TVM servers of key to waiting requests, like TVM's
// PriorityScheduler: a request whose connection is gone does not consume
// the server.
func (s *Server) tvmSchedule(key string) {
	for {
		s.tvm.mu.Lock()
		q := s.tvm.queues[key]
		if q == nil || len(q.values) == 0 || len(q.requests) == 0 {
			s.tvm.mu.Unlock()
			return
		}
		v, r := q.values[0], q.requests[0]
		q.values, q.requests = q.values[1:], q.requests[1:]
		closed := r.conn.closed
		// The match key stops being pending before the client can learn
		// it, so GET_PENDING_MATCHKEYS never shows a handed-out key.
		delete(v.conn.pending, v.matchKey)
		s.tvm.mu.Unlock()
		if !closed && r.conn.reply([]any{tvmSuccess, []any{v.addr, v.port, v.matchKey}}) {
			continue
		}
		s.tvm.mu.Lock()
		if !v.conn.closed {
			v.conn.pending[v.matchKey] = true
			q.values = append(q.values, v)
		}
		s.tvm.mu.Unlock()
	}
}

// tvmConnClosed forgets a connection's servers and requests.
func (s *Server) tvmConnClosed(c *tvmConn) {
	c.nc.Close()
	s.tvm.mu.Lock()
	defer s.tvm.mu.Unlock()
	c.closed = true
	if _, ok := s.tvm.conns[c]; ok {
		delete(s.tvm.conns, c)
		if s.tvm.byPeer[c.host]--; s.tvm.byPeer[c.host] <= 0 {
			delete(s.tvm.byPeer, c.host)
		}
	}
	for key, q := range s.tvm.queues {
		q.values = slices.DeleteFunc(q.values, func(v *tvmValue) bool { return v.conn == c })
		q.requests = slices.DeleteFunc(q.requests, func(r *tvmReq) bool { return r.conn == c })
		if len(q.values) == 0 && len(q.requests) == 0 {
			delete(s.tvm.queues, key)
		}
	}
}

// tvmSummary is SUMMARY's answer: {"queue_info": {key: {"free", "pending"}},
// "server_info": [info of every connection whose key starts with "server"]}.
// kiln's own devices stay out of it: a TVM peer cannot lease them (they
// speak kiln's protocol, not TVM's), and the TVM protocol has no
// authentication, so their keys and addresses must not reach it.
func (s *Server) tvmSummary() map[string]any {
	qinfo := map[string]map[string]int{}
	var sinfo []any
	s.tvm.mu.Lock()
	for key, q := range s.tvm.queues {
		qinfo[key] = map[string]int{"free": len(q.values), "pending": len(q.requests)}
	}
	for c := range s.tvm.conns {
		if k, _ := c.info["key"].(string); strings.HasPrefix(k, "server") {
			info := make(map[string]any, len(c.info))
			for k, v := range c.info {
				info[k] = v
			}
			sinfo = append(sinfo, info)
		}
	}
	s.tvm.mu.Unlock()
	if sinfo == nil {
		sinfo = []any{}
	}
	return map[string]any{"queue_info": qinfo, "server_info": sinfo}
}
