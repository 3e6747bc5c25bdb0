package tracker

import (
	"context"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// connNodeKey is the proto.Conn value naming the node registered on it.
type connNodeKey struct{}

// node is a registered device daemon or compiler node.
type node struct {
	id         string
	role       proto.NodeRole
	key, addr  string
	remote     string // the host the node's registration came from
	attrs      proto.NodeAttrs
	flat       map[string]string
	conn       *proto.Conn
	registered time.Time
	lastSeen   time.Time
	lost       bool
	lostSince  time.Time
	quarantine bool
	failures   []time.Time
	lastErr    string
	load       string
	// activeLeases are the leases the daemon says it serves; one the
	// tracker does not hold as a live lease on this node keeps it busy.
	activeLeases []string
	// unleased counts the sessions the daemon says it serves under no
	// lease; they take capacity as leases do.
	unleased int
	leases   map[string]*lease // the leases out on this device, by id
	// capacity is how many leases may be out on this device at once: its
	// max_sessions when it registered as sandboxed, else 1.
	capacity int
	jobs     map[string]*job // jobs running on this compiler node
}

// stale reports whether the daemon serves a lease the tracker does not
// hold on n (a session whose lease ended, not yet stopped).
func (n *node) stale() bool {
	for _, id := range n.activeLeases {
		if n.leases[id] == nil {
			return true
		}
	}
	return false
}

// setActive records the leases a registration or heartbeat names.
func (n *node) setActive(one string, all []string) {
	switch {
	case len(all) > 0:
		n.activeLeases = slices.Clone(all)
	case one != "":
		n.activeLeases = []string{one}
	default:
		n.activeLeases = nil
	}
}

// leaseIDs returns the ids of the leases out on n, sorted.
func (n *node) leaseIDs() []string {
	ids := make([]string, 0, len(n.leases))
	for id := range n.leases {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// capacityOf is how many concurrent leases a device registering with a
// may hold: its max_sessions when its sessions are sandboxed, else one.
func capacityOf(a proto.RegisterArgs) int {
	if a.Sandboxed && a.MaxSessions > 1 {
		return a.MaxSessions
	}
	return 1
}

func (n *node) state() proto.NodeState {
	switch {
	case n.lost:
		return proto.StateLost
	case n.quarantine:
		return proto.StateQuarantined
	case len(n.leases)+n.unleased >= max(n.capacity, 1) || len(n.jobs) > 0 || n.stale():
		return proto.StateBusy
	}
	return proto.StateFree
}

// free reports whether a lease may be granted on n.
func (n *node) free() bool { return n.role == proto.NodeDevice && n.state() == proto.StateFree }

func (s *Server) handleRegister(ctx context.Context, c *proto.Conn, a proto.RegisterArgs) (any, error) {
	switch {
	case a.Role == proto.NodeDevice && c.Role() == proto.RoleDevice:
	case a.Role == proto.NodeCompiler && c.Role() == proto.RoleCompiler:
	default:
		return nil, fmt.Errorf("register: role %q on a %s connection: want device on a device connection or compiler on a compiler connection: %w", a.Role, c.Role(), proto.ErrBadRequest)
	}
	if bound := credentialNode(c); bound != "" {
		// A node credential names its node: the id is not the node's to choose.
		if a.NodeID != "" && a.NodeID != bound {
			return nil, fmt.Errorf("register: this connection's credential is for node %q, not %q: %w", bound, a.NodeID, proto.ErrUnauthorized)
		}
		a.NodeID = bound
	}
	if a.Role == proto.NodeDevice && a.Key == "" {
		return nil, fmt.Errorf("register: a device needs a key: %w", proto.ErrBadRequest)
	}
	addr, err := fillHost(a.Addr, c.RemoteAddr())
	if a.Role == proto.NodeDevice && err != nil {
		return nil, fmt.Errorf("register: %w", err)
	}
	if a.NodeID == "" {
		a.NodeID = randomID(string(a.Role)+"-", 6)
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[a.NodeID]
	if n != nil && n.conn != nil && n.conn != c && !n.lost {
		// A node may only change its own registration: a live node's id
		// claimed from another connection would let any member send
		// clients (and their hellos) to an address of its choosing. A
		// node that really moved to a new connection is let in once its
		// old one is gone (closed, or silent past the lost window).
		return nil, fmt.Errorf("register: node %q is registered and alive on another connection; a node may only change its own registration (if this is that node, retry once its old connection has closed): %w", a.NodeID, proto.ErrBusy)
	}
	remote := remoteHost(c.RemoteAddr())
	if n != nil && n.conn != c && (n.addr != addr || n.remote != remote) && now.Sub(n.lastSeen) <= s.cfg.LostAfter {
		// A dropped connection does not free the id at once: a node
		// restarting where it ran comes back at once, but a registration
		// from somewhere else waits until the old one has been silent
		// past the lost window, so one dropped connection cannot hand
		// the node's clients (and their hellos) to another address.
		return nil, fmt.Errorf("register: node %q was seen %s ago at %s from %s; a registration from %s at %s is refused until it has been silent for %s: %w",
			a.NodeID, now.Sub(n.lastSeen).Round(time.Millisecond), n.addr, n.remote, remote, addr, s.cfg.LostAfter, proto.ErrBusy)
	}
	if n == nil {
		n = &node{id: a.NodeID, registered: now, jobs: make(map[string]*job), leases: make(map[string]*lease)}
		s.nodes[n.id] = n
	} else if n.key != a.Key {
		s.unindexLocked(n)
	}
	n.role, n.key, n.addr, n.attrs = a.Role, a.Key, addr, a.Attrs
	n.flat = a.Attrs.Flatten()
	n.flat["key"] = a.Key
	n.conn, n.lastSeen, n.lost, n.remote = c, now, false, remote
	n.setActive(a.ActiveLease, a.ActiveLeases)
	n.capacity = capacityOf(a)
	if n.role == proto.NodeDevice {
		if s.byKey[n.key] == nil {
			s.byKey[n.key] = make(map[string]*node)
		}
		s.byKey[n.key][n.id] = n
		// A lease restored from the store, or granted before a reconnect.
		for _, l := range s.leases {
			if l.NodeID == n.id {
				n.leases[l.ID] = l
				l.Addr = addr
			}
		}
	}
	c.SetValue(connNodeKey{}, n.id)
	s.log.Info("node registered", "node", n.id, "role", n.role, "key", n.key, "addr", addr)
	s.nodeChangedLocked(n)
	return proto.RegisterReply{NodeID: n.id, HeartbeatInterval: s.cfg.HeartbeatInterval, LostAfter: s.cfg.LostAfter, Addr: addr}, nil
}

// fillHost fills an empty host in addr with the host the peer connects from.
func fillHost(addr string, remote net.Addr) (string, error) {
	if addr == "" {
		return "", fmt.Errorf("empty listen address: %w", proto.ErrBadRequest)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("listen address %q: %v: %w", addr, err, proto.ErrBadRequest)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		if rh, _, err := net.SplitHostPort(remote.String()); err == nil {
			host = rh
		}
	}
	return net.JoinHostPort(host, port), nil
}

// remoteHost is the host of a peer's address (the whole address when it
// has no port).
func remoteHost(remote net.Addr) string {
	if remote == nil {
		return ""
	}
	host, _, err := net.SplitHostPort(remote.String())
	if err != nil {
		return remote.String()
	}
	return host
}

func (s *Server) unindexLocked(n *node) {
	if m := s.byKey[n.key]; m != nil {
		delete(m, n.id)
		if len(m) == 0 {
			delete(s.byKey, n.key)
		}
	}
}

// ownNodeLocked returns the node id when c is the connection it registered
// on: a node may only heartbeat, report on or deregister itself (the
// Kubernetes NodeRestriction rule), never another node, and a node whose
// connection is gone must register again first.
func (s *Server) ownNodeLocked(id string, c *proto.Conn, what string) (*node, error) {
	n := s.nodes[id]
	if n == nil || n.conn != c {
		return nil, fmt.Errorf("%s: node %q is not registered on this connection (a node may only speak for itself; register again): %w", what, id, proto.ErrNotFound)
	}
	return n, nil
}

func (s *Server) handleHeartbeat(ctx context.Context, c *proto.Conn, a proto.HeartbeatArgs) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.ownNodeLocked(a.NodeID, c, "heartbeat")
	if err != nil {
		return nil, err
	}
	if bound := credentialNode(c); bound != "" {
		// A node that keeps its heartbeat keeps its credential.
		s.renewCredential(bound, time.Now())
	}
	was := n.state()
	n.lastSeen, n.load = time.Now(), a.Load
	n.setActive(a.ActiveLease, a.ActiveLeases)
	n.unleased = max(a.UnleasedSessions, 0)
	if n.lost {
		n.lost = false
		s.log.Info("node back", "node", n.id)
	}
	if n.state() != was {
		s.nodeChangedLocked(n)
	}
	// A session whose lease was released or expired must end, so that
	// the device goes to the lease's next holder.
	var ended []string
	for _, id := range n.activeLeases {
		if l := s.leases[id]; l == nil || l.NodeID != n.id {
			ended = append(ended, id)
		}
	}
	return proto.HeartbeatReply{
		State: n.state(), HeartbeatInterval: s.cfg.HeartbeatInterval, HealthCheck: n.quarantine && !n.lost,
		LeaseEnded: slices.Contains(ended, a.ActiveLease) && a.ActiveLease != "", EndedLeases: ended,
	}, nil
}

func (s *Server) handleDeregister(ctx context.Context, c *proto.Conn, a proto.DeregisterArgs) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.ownNodeLocked(a.NodeID, c, "deregister")
	if err != nil {
		return nil, err
	}
	s.log.Info("node deregistered", "node", n.id)
	s.forgetLocked(n, "deregistered")
	return nil, nil
}

// forgetLocked removes n from the registry, requeueing its jobs.
func (s *Server) forgetLocked(n *node, why string) {
	s.requeueNodeJobsLocked(n, why)
	s.unindexLocked(n)
	delete(s.nodes, n.id)
	if n.role == proto.NodeCompiler {
		s.noteUnbuildableLocked()
	}
	s.changedQueuesLocked()
}

func (s *Server) handleReport(ctx context.Context, c *proto.Conn, a proto.ReportArgs) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n *node
	switch {
	case a.NodeID != "":
		if c.Role() != proto.RoleDevice {
			return nil, fmt.Errorf("report: only a device daemon names itself by node id; a client names the device by its lease: %w", proto.ErrBadRequest)
		}
		own, err := s.ownNodeLocked(a.NodeID, c, "report")
		if err != nil {
			return nil, err
		}
		n = own
	case a.LeaseID != "":
		l := s.leases[a.LeaseID]
		if l == nil || !l.tokenIs(a.Token) {
			return nil, fmt.Errorf("report: lease %q: unknown lease or wrong token: %w", a.LeaseID, proto.ErrNotFound)
		}
		n = s.nodes[l.NodeID]
	default:
		return nil, fmt.Errorf("report: name a node or a lease: %w", proto.ErrBadRequest)
	}
	if n == nil {
		return nil, fmt.Errorf("report: node %q is not registered: %w", a.NodeID, proto.ErrNotFound)
	}
	now := time.Now()
	switch a.Kind {
	case proto.ReportFailure:
		n.failures = append(n.failures, now)
		n.lastErr = a.Message
		s.m.failures.Inc()
		s.pruneFailuresLocked(n, now)
		s.log.Warn("device failure reported", "node", n.id, "key", n.key, "failures", len(n.failures), "message", a.Message)
		if !n.quarantine && len(n.failures) >= s.cfg.QuarantineAfter {
			n.quarantine = true
			s.log.Warn("device quarantined", "node", n.id, "key", n.key, "failures", len(n.failures), "window", s.cfg.FailureWindow)
			s.nodeChangedLocked(n)
		}
	case proto.ReportHealth:
		if c.Role() != proto.RoleDevice {
			return nil, fmt.Errorf("report: only the device daemon reports its health check: %w", proto.ErrBadRequest)
		}
		if !a.OK {
			n.lastErr = "health check failed: " + a.Message
			s.log.Warn("device failed its health check", "node", n.id, "message", a.Message)
			return nil, nil
		}
		if n.quarantine {
			s.log.Info("device passed its health check: quarantine lifted", "node", n.id)
		}
		n.quarantine, n.failures, n.lastErr = false, nil, ""
		s.nodeChangedLocked(n)
	default:
		return nil, fmt.Errorf("report: unknown kind %q: %w", a.Kind, proto.ErrBadRequest)
	}
	return nil, nil
}

func (s *Server) pruneFailuresLocked(n *node, now time.Time) {
	i := 0
	for i < len(n.failures) && now.Sub(n.failures[i]) > s.cfg.FailureWindow {
		i++
	}
	n.failures = n.failures[i:]
}

func (s *Server) markLostLocked(n *node, why string, now time.Time) {
	if n.lost {
		return
	}
	n.lost, n.lostSince = true, now
	s.log.Warn("node lost", "node", n.id, "role", n.role, "key", n.key, "why", why)
	s.requeueNodeJobsLocked(n, "compiler node "+n.id+" lost: "+why)
	s.changedQueuesLocked()
}

func (s *Server) expireNodesLocked(now time.Time) {
	for _, n := range s.nodes {
		if !n.lost && now.Sub(n.lastSeen) > s.cfg.LostAfter {
			s.markLostLocked(n, fmt.Sprintf("no heartbeat for %s", now.Sub(n.lastSeen).Round(time.Millisecond)), now)
		}
		if n.lost && now.Sub(n.lostSince) > s.cfg.ForgetAfter {
			s.log.Info("forgetting lost node", "node", n.id)
			s.forgetLocked(n, "lost")
		}
	}
}

// nodeChangedLocked runs after n's state may have changed: a free device is
// offered to the queues, and queue positions are refreshed.
func (s *Server) nodeChangedLocked(n *node) {
	if n.free() {
		s.offerLocked(n)
	}
	s.changedQueuesLocked()
}

// served reports whether some live device matches key and sel.
func (s *Server) servedLocked(key string, sel *Selector) bool {
	match := func(m map[string]*node) bool {
		for _, n := range m {
			if n.role == proto.NodeDevice && !n.lost && sel.Match(n.flat) {
				return true
			}
		}
		return false
	}
	if key != "" {
		return match(s.byKey[key])
	}
	return match(s.nodes)
}
