package tracker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker/store"
)

// Identities. A connection is admitted as one of:
//
//   - the fleet token (Config.Token): the legacy shared secret, any role,
//     acting as an administrator (Conn.User "");
//   - a named user token: its user, as a client only (Conn.User "alice");
//   - a join token: a device or compiler node about to join, which may
//     call tracker.join and nothing else (Conn.User "join:ID");
//   - a node credential: one node, in the role of the join token it came
//     from, which may register only under its own node id (Conn.User
//     "node:ID").
//
// User names cannot hold ':', so the kinds cannot be confused.

const (
	joinPrefix = "join:"
	nodePrefix = "node:"
)

// CredentialPrefix starts every node credential.
const CredentialPrefix = "kiln-node-"

// credential is a node credential as tracker.db keeps it (by node id).
type credential struct {
	NodeID string     `msgpack:"node_id"`
	Role   proto.Role `msgpack:"role"`
	Hash   string     `msgpack:"hash"` // hex sha256 of the credential
	Issued time.Time  `msgpack:"issued"`
	JoinID string     `msgpack:"join_id"` // the join token it was exchanged for
	// Expires is when it stops admitting its node unless renewed: each
	// use (a hello, a heartbeat) moves it to CredentialTTL from then.
	// Records written before it existed have none; they get one at load.
	Expires time.Time `msgpack:"expires,omitempty"`
}

// creds is the tracker's node credentials, loaded from tracker.db.
type creds struct {
	mu     sync.Mutex
	byHash map[string]*credential
	byNode map[string]*credential
	// joining holds the node ids a tracker.join is writing now, and
	// joiningBy how many of those each join token id makes.
	joining   map[string]bool
	joiningBy map[string]int
}

func (cs *creds) init() {
	cs.byHash = make(map[string]*credential)
	cs.byNode = make(map[string]*credential)
	cs.joining = make(map[string]bool)
	cs.joiningBy = make(map[string]int)
}

// usesLocked is how many credentials join token id has minted, or is
// minting now.
func (cs *creds) usesLocked(id string) int {
	n := cs.joiningBy[id]
	for _, c := range cs.byNode {
		if c.JoinID == id {
			n++
		}
	}
	return n
}

func (cs *creds) add(c *credential) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.addLocked(c)
}

func (cs *creds) addLocked(c *credential) {
	if old := cs.byNode[c.NodeID]; old != nil {
		delete(cs.byHash, old.Hash)
	}
	cs.byHash[c.Hash] = c
	cs.byNode[c.NodeID] = c
}

func (cs *creds) lookup(token string) (*credential, bool) {
	if !strings.HasPrefix(token, CredentialPrefix) {
		return nil, false
	}
	h := sha256.Sum256([]byte(token))
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c, ok := cs.byHash[hex.EncodeToString(h[:])]
	return c, ok
}

// identity splits a connection's user into its kind ("admin", "user",
// "join" or "node") and name.
func identity(c *proto.Conn) (kind, name string) {
	u := c.User()
	switch {
	case u == "":
		return "admin", ""
	case strings.HasPrefix(u, joinPrefix):
		return "join", u[len(joinPrefix):]
	case strings.HasPrefix(u, nodePrefix):
		return "node", u[len(nodePrefix):]
	}
	return "user", u
}

// who names the identity on c in an error: user "alice", node "device-1",
// join token j1 or the fleet token.
func who(c *proto.Conn) string {
	switch kind, name := identity(c); kind {
	case "user":
		return fmt.Sprintf("user %q", name)
	case "node":
		return fmt.Sprintf("node %q", name)
	case "join":
		return "join token " + name
	}
	return "the fleet token"
}

// credentialNode returns the node id c's credential is bound to ("" when c
// holds no node credential).
func credentialNode(c *proto.Conn) string {
	if kind, name := identity(c); kind == "node" {
		return name
	}
	return ""
}

// authenticate admits the fleet token (any role, as administrator), named
// user tokens (client only), join tokens (their role, until they expire)
// and node credentials (their role, until revoked).
func (s *Server) authenticate(token string, role proto.Role) (string, error) {
	if s.cfg.Token != "" && proto.TokenEqual(token, s.cfg.Token) {
		return "", nil
	}
	user, err := s.authenticateFile(token, role)
	if errors.Is(err, proto.ErrUnauthorized) {
		// A token made a moment ago: read the file now rather than at the
		// next tick (a stat when nothing changed).
		if changed, lerr := s.users.load(); lerr == nil && changed {
			user, err = s.authenticateFile(token, role)
		}
	}
	return user, err
}

// authenticateFile admits the users file's tokens and node credentials.
func (s *Server) authenticateFile(token string, role proto.Role) (string, error) {
	if t, ok := s.users.lookup(token); ok {
		if t.role != role {
			return "", fmt.Errorf("the token of user %q is for role %s, not %s (a user token registers nothing; nodes join with a join token)", t.user, t.role, role)
		}
		return t.user, nil
	}
	if j, ok := s.users.lookupJoin(token); ok {
		if now := time.Now(); !now.Before(j.expires) {
			return "", fmt.Errorf("join token %s expired at %s; make a new one (kiln token create --role %s --ttl 1h)", j.id, j.expires.Format(time.RFC3339), j.role)
		}
		if j.role != role {
			return "", fmt.Errorf("join token %s is for role %s, not %s", j.id, j.role, role)
		}
		if err := s.joinUsable(j); err != nil {
			return "", err
		}
		return joinPrefix + j.id, nil
	}
	if c, ok := s.creds.lookup(token); ok {
		if since := s.users.revokedSince(c.NodeID); !since.IsZero() && !c.Issued.After(since) {
			return "", fmt.Errorf("the credential of node %q was revoked at %s; join again with a new join token", c.NodeID, since.Format(time.RFC3339))
		}
		if c.Role != role {
			return "", fmt.Errorf("the credential of node %q is for role %s, not %s", c.NodeID, c.Role, role)
		}
		if !s.renewCredential(c.NodeID, time.Now()) {
			return "", fmt.Errorf("the credential of node %q expired, unused for %s (the tracker's --credential-ttl); join again with a join token", c.NodeID, s.cfg.CredentialTTL)
		}
		return nodePrefix + c.NodeID, nil
	}
	return "", proto.ErrUnauthorized
}

// stillValid reports whether the identity c was admitted with still holds
// after the users file changed.
func (s *Server) stillValid(c *proto.Conn) bool {
	kind, name := identity(c)
	switch kind {
	case "user":
		return s.users.has(name)
	case "join":
		return s.users.hasJoin(name)
	case "node":
		s.creds.mu.Lock()
		cr := s.creds.byNode[name]
		live := cr != nil && time.Now().Before(cr.Expires)
		s.creds.mu.Unlock()
		since := s.users.revokedSince(name)
		return live && (since.IsZero() || cr.Issued.After(since))
	}
	return true
}

// reloadUsers reads the users file again when it changed and closes the
// connections whose user token, join token or node credential it no
// longer admits.
func (s *Server) reloadUsers() {
	if _, err := s.users.load(); err != nil {
		s.log.Error("users file not reloaded; the last good one stays in force", "err", err)
		return
	}
	s.users.mu.Lock()
	gen := s.users.gen
	s.users.mu.Unlock()
	if gen == s.usersGen {
		return
	}
	s.usersGen = gen
	s.log.Info("users file reloaded", "path", s.users.path)
	s.closeInvalid()
	s.mu.Lock()
	s.releaseRevokedLocked()
	s.mu.Unlock()
}

// closeInvalid closes the connections whose identity no longer holds.
func (s *Server) closeInvalid() {
	s.mu.Lock()
	var gone []*proto.Conn
	for c := range s.userConns {
		if !s.stillValid(c) {
			gone = append(gone, c)
			delete(s.userConns, c)
		}
	}
	s.mu.Unlock()
	for _, c := range gone {
		s.log.Info("closing a connection whose token or credential was revoked", "identity", c.User(), "remote", c.RemoteAddr())
		c.Close()
	}
}

// gate refuses what a connection's identity may not call: a connection
// admitted with a join token may only join.
func gate(c *proto.Conn, method string) error {
	kind, name := identity(c)
	if kind == "join" && method != proto.MethodTrackerJoin {
		return fmt.Errorf("%s: a connection admitted with join token %s may only call %s; dial again with the credential it returns: %w", method, name, proto.MethodTrackerJoin, proto.ErrUnauthorized)
	}
	if kind != "join" && method == proto.MethodTrackerJoin {
		return fmt.Errorf("%s: only a connection admitted with a join token may join: %w", method, proto.ErrBadRequest)
	}
	return nil
}

// handleJoin exchanges the connection's join token for a new node
// credential, durable before it is returned. The tracker assigns the node
// id: a join token proves only that its holder may join, never which node
// it is, so it can never take the id of a node that is registered, has a
// credential or holds a lease (the request's node_id is not honoured). A
// node that restarts keeps its id by presenting the credential it got.
func (s *Server) handleJoin(ctx context.Context, c *proto.Conn, a proto.JoinArgs) (any, error) {
	_, joinID := identity(c)
	role := c.Role()
	nr := proto.NodeDevice
	if role == proto.RoleCompiler {
		nr = proto.NodeCompiler
	}
	j, ok := s.users.joinByID(joinID)
	if !ok {
		return nil, fmt.Errorf("join: join token %s was removed: %w", joinID, proto.ErrUnauthorized)
	}
	token, hash := newSecret(CredentialPrefix)
	s.mu.Lock()
	s.creds.mu.Lock()
	if used := s.creds.usesLocked(joinID); j.maxUses > 0 && used >= j.maxUses {
		s.creds.mu.Unlock()
		s.mu.Unlock()
		return nil, fmt.Errorf("join: %w: %w", usedUp(j, used), proto.ErrUnauthorized)
	}
	id := ""
	for range 8 {
		if cand := randomID(string(nr)+"-", 6); !s.idTakenLocked(cand) {
			id = cand
			break
		}
	}
	if id == "" {
		s.creds.mu.Unlock()
		s.mu.Unlock()
		return nil, fmt.Errorf("join: no free node id found; try again: %w", proto.ErrBusy)
	}
	// Reserve the id and the use, so two joins cannot both take them.
	s.creds.joining[id] = true
	s.creds.joiningBy[joinID]++
	s.creds.mu.Unlock()
	s.mu.Unlock()
	// The reservation ends as the credential takes its place, in one
	// step, so that the join is never counted twice nor not at all.
	var cr *credential
	defer func() {
		s.creds.mu.Lock()
		if cr != nil {
			s.creds.addLocked(cr)
		}
		delete(s.creds.joining, id)
		if s.creds.joiningBy[joinID]--; s.creds.joiningBy[joinID] <= 0 {
			delete(s.creds.joiningBy, joinID)
		}
		s.creds.mu.Unlock()
	}()
	if a.NodeID != "" && a.NodeID != id {
		s.log.Info("join: the node asked for an id; the tracker assigns ids", "asked", a.NodeID, "node", id, "join_token", joinID)
	}
	now := time.Now().UTC()
	rec := &credential{NodeID: id, Role: role, Hash: hash, Issued: now, JoinID: joinID, Expires: now.Add(s.cfg.CredentialTTL)}
	if err := s.st.Wait(s.st.Apply(store.Put(store.Creds, rec.NodeID, rec))); err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	cr = rec
	s.log.Info("node joined", "node", cr.NodeID, "role", role, "join_token", joinID, "remote", c.RemoteAddr())
	return proto.JoinReply{NodeID: cr.NodeID, Role: role, Credential: token}, nil
}

// idTakenLocked reports whether a node id is in use in any way: a node is
// registered under it (lost nodes stay until forgotten), a credential or a
// join in progress names it, or a lease is out on it. It runs with s.mu
// and s.creds.mu held.
func (s *Server) idTakenLocked(id string) bool {
	if s.nodes[id] != nil || s.creds.byNode[id] != nil || s.creds.joining[id] {
		return true
	}
	for _, l := range s.leases {
		if l.NodeID == id {
			return true
		}
	}
	return false
}

// usedUp is the refusal of a join token that admitted its last node.
func usedUp(j joinToken, used int) error {
	return fmt.Errorf("join token %s has admitted %d node(s), its limit (kiln token create --max-uses); make a new one", j.id, used)
}

// joinUsable refuses a join token that has admitted as many nodes as it
// may (handleJoin checks again as it reserves the use).
func (s *Server) joinUsable(j joinToken) error {
	if j.maxUses == 0 {
		return nil
	}
	s.creds.mu.Lock()
	used := s.creds.usesLocked(j.id)
	s.creds.mu.Unlock()
	if used >= j.maxUses {
		return usedUp(j, used)
	}
	return nil
}

// renewCredential moves the expiry of node's credential to CredentialTTL
// from now, and reports false when it had expired already. The store is
// written only once half the life is gone, not at every heartbeat.
func (s *Server) renewCredential(node string, now time.Time) bool {
	s.creds.mu.Lock()
	defer s.creds.mu.Unlock()
	c := s.creds.byNode[node]
	if c == nil || !now.Before(c.Expires) {
		return false
	}
	if c.Expires.Sub(now) < s.cfg.CredentialTTL/2 {
		c.Expires = now.Add(s.cfg.CredentialTTL).UTC()
		// A renewal the store loses costs nothing: the next use renews
		// again, long before the old expiry.
		rec := *c
		s.st.Apply(store.Put(store.Creds, rec.NodeID, &rec))
	}
	return true
}

// expireCredentials drops the credentials that expired: their
// connections are closed, and their records go once the join token that
// minted them can mint no more (until then they count its uses).
func (s *Server) expireCredentials(now time.Time) {
	s.creds.mu.Lock()
	var expired []*credential
	for _, c := range s.creds.byNode {
		if !now.Before(c.Expires) {
			expired = append(expired, c)
		}
	}
	var gone []store.Change
	for _, c := range expired {
		if j, ok := s.users.joinByID(c.JoinID); ok && now.Before(j.expires) {
			continue
		}
		delete(s.creds.byNode, c.NodeID)
		delete(s.creds.byHash, c.Hash)
		gone = append(gone, store.Delete(store.Creds, c.NodeID))
		s.log.Info("node credential expired", "node", c.NodeID, "expired", c.Expires)
	}
	if len(gone) > 0 {
		s.st.Apply(gone...)
	}
	s.creds.mu.Unlock()
	if len(expired) > 0 {
		s.closeInvalid()
	}
}
