package tracker

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker/store"
)

// lease is a granted lease.
type lease struct {
	proto.Lease
	// tokenHash is the hex sha256 of Token: what the store keeps, and what
	// a presented token is compared with. Token itself is known only to
	// the tracker that granted the lease (it is "" in one loaded from the
	// store, until a retried request is delivered a fresh one).
	tokenHash string
	User      string `msgpack:"user"`
	Granted   time.Time
	// RequestKey is the RequestKey of the request it was granted to.
	RequestKey string
	// durable receives the result of persisting the grant; nil once read.
	durable <-chan error `msgpack:"-"`
	// holder is the client connection the lease was delivered or last
	// renewed on (nil for in-process requests and for a lease restored
	// from the store until it is renewed). On a single tracker, when it
	// closes the lease is released at once, as TVM's tracker frees a
	// server whose client's connection drops. A replica's term keeps the
	// lease to its TTL instead: a follower that forwarded the connection
	// may have died, or the client is failing over to another replica,
	// and only a renewal that stops coming says that the holder is gone.
	holder *proto.Conn `msgpack:"-"`
}

// ticket is a queued lease request.
type ticket struct {
	id             string
	key            string
	sel            *Selector
	queue          *queue
	priority       int
	seq            uint64
	user           string
	requestKey     string
	since          time.Time
	deadline       time.Time
	ttl            time.Duration
	sessionTimeout time.Duration
	arch           string      // the artifact's architecture; "" for any
	conn           *proto.Conn // nil for in-process requests

	lease *lease        // set when granted
	err   error         // set when dropped
	done  chan struct{} // closed when granted or dropped
}

// queue is the waiting requests for one key (and selector), ordered by
// priority (higher first) and then arrival.
type queue struct {
	name    string
	key     string
	tickets []*ticket
	changed chan struct{} // closed and replaced when positions change
}

func queueName(key, sel string) string {
	if key == "" {
		key = "*"
	}
	if sel == "" {
		return key
	}
	return key + " [" + sel + "]"
}

func (q *queue) insert(t *ticket) {
	i, _ := slices.BinarySearchFunc(q.tickets, t, func(a, b *ticket) int {
		if a.priority != b.priority {
			return b.priority - a.priority
		}
		return int(a.seq) - int(b.seq)
	})
	q.tickets = slices.Insert(q.tickets, i, t)
}

func (q *queue) position(t *ticket) int {
	for i, x := range q.tickets {
		if x == t {
			return i + 1
		}
	}
	return 0
}

func (q *queue) remove(t *ticket) {
	if i := slices.Index(q.tickets, t); i >= 0 {
		q.tickets = slices.Delete(q.tickets, i, i+1)
		notify(&q.changed)
	}
}

// leaseRecord is a lease as stored.
type leaseRecord struct {
	// Lease is stored without its Token: TokenHash stands for it.
	Lease     proto.Lease `msgpack:"lease"`
	TokenHash string      `msgpack:"token_sha256,omitempty"`
	User      string      `msgpack:"user"`
	Granted   time.Time   `msgpack:"granted"`
	// RequestKey is the idempotency key of the request it was granted to.
	RequestKey string `msgpack:"request_key,omitempty"`
}

func (s *Server) persistLeaseLocked(l *lease) <-chan error {
	rec := leaseRecord{Lease: l.Lease, TokenHash: l.tokenHash, User: l.User, Granted: l.Granted, RequestKey: l.RequestKey}
	rec.Lease.Token = "" // a secret: the store keeps only its hash
	return s.st.Apply(store.Put(store.Leases, rec.Lease.ID, rec))
}

func (s *Server) deleteLeaseLocked(id string) {
	s.st.Apply(store.Delete(store.Leases, id))
}

// enqueueLocked creates a ticket for a and tries to grant it at once.
func (s *Server) enqueueLocked(a proto.LeaseRequestArgs, sel *Selector, conn *proto.Conn, now time.Time) *ticket {
	ttl := a.TTL
	if ttl <= 0 {
		ttl = s.cfg.LeaseTTL
	}
	ttl = min(ttl, s.cfg.MaxLeaseTTL)
	s.seq++
	t := &ticket{
		id: randomID("t-", 8), key: a.Key, sel: sel, priority: a.Priority, seq: s.seq,
		user: a.User, requestKey: a.RequestKey, since: now, deadline: a.Deadline, ttl: ttl, sessionTimeout: a.SessionTimeout,
		arch: a.Arch, conn: conn, done: make(chan struct{}),
	}
	s.m.leaseRequests.Inc()
	s.tickets[t.id] = t
	if n := s.findDeviceLocked(t); n != nil {
		s.grantLocked(t, n, now)
		return t
	}
	name := queueName(a.Key, sel.String())
	q := s.queues[name]
	if q == nil {
		q = &queue{name: name, key: a.Key, changed: make(chan struct{})}
		s.queues[name] = q
	}
	t.queue = q
	q.insert(t)
	notify(&q.changed)
	return t
}

// matches reports whether device n serves t: its attributes satisfy t's
// selector, and it runs t's architecture (or names none).
func (t *ticket) matches(n *node) bool {
	return t.sel.Match(n.flat) && archServes(n, t.arch)
}

// archServes reports whether device n runs artifacts built for arch.
func archServes(n *node, arch string) bool {
	have := n.flat["arch"]
	return arch == "" || have == "" || have == arch
}

// unservedLocked refuses a request that no registered device can serve:
// every device its key and selector match is of another architecture than
// its artifact, or (with FailUnserved) none matches at all.
func (s *Server) unservedLocked(a proto.LeaseRequestArgs, sel *Selector) error {
	m := s.nodes
	if a.Key != "" {
		m = s.byKey[a.Key]
	}
	var matched int
	var arches []string
	for _, n := range m {
		if n.role != proto.NodeDevice || !sel.Match(n.flat) {
			continue
		}
		if archServes(n, a.Arch) {
			return nil
		}
		matched++
		if !slices.Contains(arches, n.flat["arch"]) {
			arches = append(arches, n.flat["arch"])
		}
	}
	which := "registered device"
	switch {
	case a.Key != "" && !sel.Empty():
		which = fmt.Sprintf("device registered under key %q that matches selector %q", a.Key, sel)
	case a.Key != "":
		which = fmt.Sprintf("device registered under key %q", a.Key)
	case !sel.Empty():
		which = fmt.Sprintf("registered device that matches selector %q", sel)
	}
	if matched > 0 {
		slices.Sort(arches)
		return fmt.Errorf("the artifact is built for %s, but every %s is %s: build it for their architecture, or ask for a device of its own: %w",
			a.Arch, which, strings.Join(arches, " or "), proto.ErrBadRequest)
	}
	if a.FailUnserved {
		return fmt.Errorf("no %s: %w", which, proto.ErrNotFound)
	}
	return nil
}

// findDeviceLocked returns a free device for t, or nil.
func (s *Server) findDeviceLocked(t *ticket) *node {
	pick := func(m map[string]*node) *node {
		for _, n := range m {
			if n.free() && t.matches(n) {
				return n
			}
		}
		return nil
	}
	if t.key != "" {
		return pick(s.byKey[t.key])
	}
	return pick(s.nodes)
}

// offerLocked grants free device n to the best waiting ticket it matches.
func (s *Server) offerLocked(n *node) {
	var best *ticket
	for _, q := range s.queues {
		if q.key != "" && q.key != n.key {
			continue
		}
		for _, t := range q.tickets {
			if t.matches(n) {
				if best == nil || t.priority > best.priority || (t.priority == best.priority && t.seq < best.seq) {
					best = t
				}
				break
			}
		}
	}
	if best != nil {
		s.grantLocked(best, n, time.Now())
	}
}

func (s *Server) grantLocked(t *ticket, n *node, now time.Time) {
	l := &lease{
		Lease: proto.Lease{
			ID: randomID("l-", 8), NodeID: n.id, Key: n.key, Addr: n.addr,
			Expires: now.Add(t.ttl), TTL: t.ttl, SessionTimeout: t.sessionTimeout, Attrs: n.attrs,
		},
		User: t.user, Granted: now, RequestKey: t.requestKey, holder: t.conn,
	}
	s.newLeaseTokenLocked(l)
	l.durable = s.persistLeaseLocked(l)
	s.leases[l.ID] = l
	if l.RequestKey != "" {
		s.byRequest[idemKey{l.User, l.RequestKey}] = l
	}
	n.leases[l.ID] = l
	t.lease = l
	if t.queue != nil {
		t.queue.remove(t)
		s.dropQueueIfEmptyLocked(t.queue)
	}
	close(t.done)
	s.m.leasesGranted.Inc()
	s.m.leaseWait.Observe(now.Sub(t.since).Seconds())
	s.log.Debug("lease granted", "lease", l.ID, "node", n.id, "key", n.key, "ticket", t.id, "waited", now.Sub(t.since))
}

func (s *Server) dropQueueIfEmptyLocked(q *queue) {
	if len(q.tickets) == 0 && s.queues[q.name] == q {
		delete(s.queues, q.name)
	}
}

// dropTicketLocked ends a waiting ticket with err; a lease granted to it
// but never delivered is released.
func (s *Server) dropTicketLocked(t *ticket, err error) {
	delete(s.tickets, t.id)
	if t.lease != nil {
		if l := s.leases[t.lease.ID]; l != nil {
			s.log.Debug("releasing a lease granted to a dropped request", "lease", l.ID, "ticket", t.id)
			s.releaseLocked(l)
		}
		return
	}
	if t.queue != nil {
		t.queue.remove(t)
		s.dropQueueIfEmptyLocked(t.queue)
	}
	if t.err == nil {
		t.err = err
		close(t.done)
	}
}

// releaseLocked ends l and offers its device again.
func (s *Server) releaseLocked(l *lease) {
	delete(s.leases, l.ID)
	delete(s.byToken, l.tokenHash)
	if k := (idemKey{l.User, l.RequestKey}); l.RequestKey != "" && s.byRequest[k] == l {
		delete(s.byRequest, k)
	}
	s.deleteLeaseLocked(l.ID)
	s.m.leasesReleased.Inc()
	if n := s.nodes[l.NodeID]; n != nil && n.leases[l.ID] == l {
		delete(n.leases, l.ID)
		n.activeLeases = slices.DeleteFunc(n.activeLeases, func(id string) bool { return id == l.ID })
		s.nodeChangedLocked(n)
	}
}

// releaseRevokedLocked ends the leases (and the waiting requests) of
// users who no longer have a token in the users file: a revoked user's
// sessions end within a heartbeat, when each device hears that the lease
// ended, instead of living on until the lease's TTL.
func (s *Server) releaseRevokedLocked() {
	gone := map[string]bool{}
	revoked := func(user string) bool {
		if user == "" {
			return false // the fleet token's, or a tracker without a users file
		}
		if r, ok := gone[user]; ok {
			return r
		}
		gone[user] = !s.users.has(user)
		return gone[user]
	}
	for _, l := range s.leases {
		if revoked(l.User) {
			s.log.Info("lease ended: its user's token was revoked", "lease", l.ID, "user", l.User, "node", l.NodeID)
			s.releaseLocked(l)
		}
	}
	for _, t := range s.tickets {
		if t.lease == nil && revoked(t.user) {
			s.dropTicketLocked(t, fmt.Errorf("lease request: the token of user %q was revoked: %w", t.user, proto.ErrUnauthorized))
		}
	}
}

// changedQueuesLocked wakes every waiter, since positions or the set of
// serving devices may have changed.
func (s *Server) changedQueuesLocked() {
	for _, q := range s.queues {
		notify(&q.changed)
	}
}

func (s *Server) expireLeasesLocked(now time.Time) {
	for _, l := range s.leases {
		if now.After(l.Expires) {
			s.log.Info("lease expired", "lease", l.ID, "node", l.NodeID, "key", l.Key)
			s.m.leasesExpired.Inc()
			s.releaseLocked(l)
		}
	}
}

func (s *Server) expireTicketsLocked(now time.Time) {
	for _, t := range s.tickets {
		if !t.deadline.IsZero() && now.After(t.deadline) && t.lease == nil {
			s.dropTicketLocked(t, s.deadlineErrLocked(t, now))
		}
	}
}

func (s *Server) deadlineErrLocked(t *ticket, now time.Time) error {
	served := "no live device serves it"
	if s.servedLocked(t.key, t.sel) {
		served = "every matching device stayed busy"
	}
	pos := 0
	if t.queue != nil {
		pos = t.queue.position(t)
	}
	return fmt.Errorf("lease request for %s: gave up at its deadline after waiting %s at queue position %d (%s): %w",
		describe(t.key, t.sel), now.Sub(t.since).Round(time.Millisecond), pos, served, proto.ErrDeadline)
}

func describe(key string, sel *Selector) string {
	switch {
	case key != "" && !sel.Empty():
		return fmt.Sprintf("key %q with selector %q", key, sel.String())
	case key != "":
		return fmt.Sprintf("key %q", key)
	case !sel.Empty():
		return fmt.Sprintf("selector %q", sel.String())
	}
	return "any device"
}

// ticketReply reports t's state; for a granted ticket it waits until the
// lease is durable and marks it delivered.
func (s *Server) ticketReply(ctx context.Context, t *ticket) (any, error) {
	s.mu.Lock()
	if t.err != nil {
		s.mu.Unlock()
		return nil, t.err
	}
	if l := t.lease; l != nil {
		delete(s.tickets, t.id)
		return s.deliverLocked(t.id, l)
	}
	rep := proto.LeaseTicket{Ticket: t.id, Position: t.queue.position(t), Queue: t.queue.name, Served: s.servedLocked(t.key, t.sel)}
	s.mu.Unlock()
	return rep, nil
}

// deliverLocked answers lease l, granted to ticket id, once it is
// durable. It unlocks s.mu.
func (s *Server) deliverLocked(id string, l *lease) (any, error) {
	if l.Token == "" {
		// Loaded from the store, which keeps no token, and not one this
		// tracker's key makes: the request sent again (its client never
		// had the first answer) gets a new one.
		s.newLeaseTokenLocked(l)
		l.durable = s.persistLeaseLocked(l)
	}
	durable := l.durable
	l.durable = nil
	rep := proto.LeaseTicket{Ticket: id, Served: true, Lease: new(l.Lease)}
	s.mu.Unlock()
	if durable != nil {
		if err := s.st.Wait(durable); err != nil {
			s.mu.Lock()
			if s.leases[l.ID] == l {
				s.releaseLocked(l)
			}
			s.mu.Unlock()
			return nil, fmt.Errorf("lease request %s: persist lease: %w", id, err)
		}
	}
	return rep, nil
}

// waitTicket waits up to wait for t to be granted or dropped or its queue
// to change, then reports it.
func (s *Server) waitTicket(ctx context.Context, t *ticket, wait time.Duration) (any, error) {
	if wait <= 0 || wait > s.cfg.LeaseWait {
		wait = s.cfg.LeaseWait
	}
	s.mu.Lock()
	var changed chan struct{}
	if t.queue != nil {
		changed = t.queue.changed
	}
	deadline := t.deadline
	s.mu.Unlock()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var dl <-chan time.Time
	if !deadline.IsZero() {
		dt := time.NewTimer(time.Until(deadline))
		defer dt.Stop()
		dl = dt.C
	}
	select {
	case <-t.done:
	case <-changed:
	case <-timer.C:
	case now := <-dl:
		s.mu.Lock()
		if t.lease == nil && t.err == nil {
			s.dropTicketLocked(t, s.deadlineErrLocked(t, now))
		}
		s.mu.Unlock()
	case <-ctx.Done():
		return nil, fmt.Errorf("lease request %s: %w", t.id, ctx.Err())
	}
	return s.ticketReply(ctx, t)
}

func (s *Server) handleLeaseRequest(ctx context.Context, c *proto.Conn, a proto.LeaseRequestArgs) (any, error) {
	if err := s.writable(); err != nil {
		return nil, fmt.Errorf("lease request: %w", err)
	}
	switch kind, name := identity(c); kind {
	case "user":
		a.User = name // a named user is who their token says, not what they declare
	case "node":
		// A node leases nothing: a device credential could otherwise
		// take devices in any user's name.
		return nil, fmt.Errorf("lease request: node %q: a node credential requests no leases (a client does, with its own token): %w", name, proto.ErrUnauthorized)
	}
	sel, err := ParseSelector(a.Selector)
	if err != nil {
		return nil, fmt.Errorf("lease request: %w", err)
	}
	if a.Deadline.IsZero() {
		if d, ok := ctx.Deadline(); ok {
			a.Deadline = d
		}
	}
	s.mu.Lock()
	if l := s.retriedLocked(a); l != nil {
		l.holder = c
		return s.deliverLocked("", l)
	}
	if err := s.unservedLocked(a, sel); err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("lease request: %w", err)
	}
	t := s.enqueueLocked(a, sel, c, time.Now())
	s.mu.Unlock()
	return s.waitTicket(ctx, t, a.Wait)
}

// retriedLocked handles a request sent again with its RequestKey (its
// client's connection failed): a lease already granted to the key is
// returned, and taken from a ticket still waiting on the old connection
// so that the connection's end does not release it; a ticket of the key
// still waiting there is dropped, the new request takes its place.
func (s *Server) retriedLocked(a proto.LeaseRequestArgs) *lease {
	if a.RequestKey == "" {
		return nil
	}
	l := s.byRequest[idemKey{a.User, a.RequestKey}]
	for _, t := range s.tickets {
		if t.requestKey != a.RequestKey || t.user != a.User {
			continue
		}
		if t.lease != nil && t.lease == l {
			delete(s.tickets, t.id)
			continue
		}
		s.dropTicketLocked(t, fmt.Errorf("lease request %s: sent again on another connection: %w", t.id, proto.ErrCancelled))
	}
	return l
}

func (s *Server) lookupTicket(id string, c *proto.Conn) (*ticket, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tickets[id]
	if t == nil || (t.conn != nil && t.conn != c) {
		return nil, fmt.Errorf("lease request %q: no such waiting request on this connection: %w", id, proto.ErrNotFound)
	}
	return t, nil
}

func (s *Server) handleLeaseWait(ctx context.Context, c *proto.Conn, a proto.LeaseWaitArgs) (any, error) {
	t, err := s.lookupTicket(a.Ticket, c)
	if err != nil {
		return nil, err
	}
	return s.waitTicket(ctx, t, a.Wait)
}

func (s *Server) handleLeaseCancel(ctx context.Context, c *proto.Conn, a proto.LeaseWaitArgs) (any, error) {
	t, err := s.lookupTicket(a.Ticket, c)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.dropTicketLocked(t, fmt.Errorf("lease request %s: cancelled by the client: %w", t.id, proto.ErrCancelled))
	s.mu.Unlock()
	return nil, nil
}

func (s *Server) leaseByIDLocked(what string, a proto.LeaseRenewArgs) (*lease, error) {
	l := s.leases[a.ID]
	if l == nil || !l.tokenIs(a.Token) {
		return nil, fmt.Errorf("%s lease %q: no such lease (expired, released or wrong token): %w", what, a.ID, proto.ErrSessionExpired)
	}
	return l, nil
}

func (s *Server) handleLeaseRenew(ctx context.Context, c *proto.Conn, a proto.LeaseRenewArgs) (any, error) {
	s.mu.Lock()
	l, err := s.leaseByIDLocked("renew", a)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	l.Expires = time.Now().Add(l.TTL)
	if c.Role() == proto.RoleClient {
		l.holder = c
	}
	durable := s.persistLeaseLocked(l)
	out := l.Lease
	out.Token = a.Token // the token it was named by (a loaded lease knows only its hash)
	s.mu.Unlock()
	if err := <-durable; err != nil {
		return nil, fmt.Errorf("renew lease %q: %w", a.ID, err)
	}
	return out, nil
}

func (s *Server) handleLeaseRelease(ctx context.Context, c *proto.Conn, a proto.LeaseRenewArgs) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := s.leaseByIDLocked("release", a)
	if err != nil {
		return nil, err
	}
	s.releaseLocked(l)
	return nil, nil
}

func (s *Server) handleLeaseVerify(ctx context.Context, c *proto.Conn, a proto.LeaseVerifyArgs) (any, error) {
	if c.Role() != proto.RoleDevice {
		return nil, fmt.Errorf("verify lease: only device daemons verify leases: %w", proto.ErrBadRequest)
	}
	if bound := credentialNode(c); bound != "" && bound != a.NodeID {
		return nil, fmt.Errorf("verify lease: this connection's credential is for node %q, not %q (a device verifies only its own leases): %w", bound, a.NodeID, proto.ErrUnauthorized)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.byToken[tokenHash(a.Token)]
	if l == nil || a.Token == "" {
		return nil, fmt.Errorf("verify lease: unknown token (never issued, released or expired): %w", proto.ErrNotFound)
	}
	if l.NodeID != a.NodeID {
		return nil, fmt.Errorf("verify lease %s: issued for node %q, not %q: %w", l.ID, l.NodeID, a.NodeID, proto.ErrBadRequest)
	}
	if time.Now().After(l.Expires) {
		return nil, fmt.Errorf("verify lease %s: expired at %s: %w", l.ID, l.Expires.Format(time.RFC3339), proto.ErrSessionExpired)
	}
	return proto.LeaseInfo{ID: l.ID, Key: l.Key, User: l.User, Expires: l.Expires, SessionTimeout: l.SessionTimeout}, nil
}
