package tracker

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// The users file (Config.UsersFile) holds named user tokens, join tokens
// and node revocations, one a line:
//
//	USER client SHA256-OF-TOKEN
//	@join ID ROLE SHA256-OF-TOKEN EXPIRES [MAX-USES]
//	@revoked NODE-ID SINCE
//
// A named user token admits its user as a client. A join token (ROLE
// device or compiler, EXPIRES in RFC 3339) admits a node only until it
// expires and only to tracker.join, which exchanges it for a per-node
// credential kept in tracker.db, at most MAX-USES times (0, or a line
// without it, written before the field existed: no limit but EXPIRES). A revocation refuses every credential of
// NODE-ID issued at or before SINCE. '#' starts a comment. The file holds
// only the tokens' hashes: CreateUserToken and CreateJoinToken print a
// token once and append its line; RevokeUser, RevokeJoin and RevokeNode
// edit the file. The tracker reads the file again when it changes, so a
// revocation takes effect within a tick and the revoked connections are
// closed.

// userName is what a user name, a join token id or a node id may be.
var userName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// userToken is a named user's line of the users file.
type userToken struct {
	user string
	role proto.Role
}

// joinToken is a join token's line of the users file.
type joinToken struct {
	id      string
	role    proto.Role
	expires time.Time
	maxUses int // 0: any number of joins until it expires
}

// usersFile is what a users file holds.
type usersFile struct {
	byHash  map[string]userToken
	joins   map[string]joinToken // by the token's sha256
	revoked map[string]time.Time // node id → credentials issued up to then are revoked
}

// users is the users file as last read.
type users struct {
	path string

	mu sync.Mutex
	usersFile
	modTime time.Time
	size    int64
	gen     uint64 // counts the reads that found a change
}

// parseUsers reads a users file's text.
func parseUsers(path string, text []byte) (usersFile, error) {
	m := usersFile{byHash: map[string]userToken{}, joins: map[string]joinToken{}, revoked: map[string]time.Time{}}
	sc := bufio.NewScanner(bytes.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		bad := func(format string, a ...any) (usersFile, error) {
			return usersFile{}, fmt.Errorf("users file %s:%d: %s", path, n, fmt.Sprintf(format, a...))
		}
		switch f[0] {
		case "@join":
			if len(f) != 5 && len(f) != 6 {
				return bad("want @join ID ROLE SHA256 EXPIRES [MAX-USES], got %d fields", len(f))
			}
			if !userName.MatchString(f[1]) {
				return bad("join token id %q: want letters, digits and ._@- (at most 64)", f[1])
			}
			role, err := nodeRole(f[2])
			if err != nil {
				return bad("%v", err)
			}
			if !isSHA256(f[3]) {
				return bad("%q is not a sha256 in hex", f[3])
			}
			exp, err := time.Parse(time.RFC3339, f[4])
			if err != nil {
				return bad("join token expiry %q: want RFC 3339 (2006-01-02T15:04:05Z)", f[4])
			}
			uses := 0
			if len(f) == 6 {
				if uses, err = strconv.Atoi(f[5]); err != nil || uses < 0 {
					return bad("join token max uses %q: want a whole number, 0 for no limit", f[5])
				}
			}
			m.joins[strings.ToLower(f[3])] = joinToken{id: f[1], role: role, expires: exp, maxUses: uses}
		case "@revoked":
			if len(f) != 3 {
				return bad("want @revoked NODE-ID SINCE, got %d fields", len(f))
			}
			if !userName.MatchString(f[1]) {
				return bad("node id %q: want letters, digits and ._@- (at most 64)", f[1])
			}
			since, err := time.Parse(time.RFC3339Nano, f[2])
			if err != nil {
				return bad("revocation time %q: want RFC 3339", f[2])
			}
			if since.After(m.revoked[f[1]]) {
				m.revoked[f[1]] = since
			}
		default:
			if len(f) != 3 {
				return bad("want USER ROLE SHA256, got %d fields", len(f))
			}
			if !userName.MatchString(f[0]) {
				return bad("user name %q: want letters, digits and ._@- (at most 64)", f[0])
			}
			role, err := userRole(f[1])
			if err != nil {
				return bad("%v", err)
			}
			if !isSHA256(f[2]) {
				return bad("%q is not a sha256 in hex", f[2])
			}
			m.byHash[strings.ToLower(f[2])] = userToken{user: f[0], role: role}
		}
	}
	return m, sc.Err()
}

func isSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// userRole parses the role of a named user token: client only, since a
// node's identity comes from a join token and the credential it is
// exchanged for.
func userRole(s string) (proto.Role, error) {
	switch s {
	case proto.RoleClient.String():
		return proto.RoleClient, nil
	case proto.RoleDevice.String(), proto.RoleCompiler.String():
		return 0, fmt.Errorf("role %q: a named user token is for clients only; a node joins with a join token (kiln token create --role %s --ttl 1h)", s, s)
	}
	return 0, fmt.Errorf("role %q: a named user token takes role client", s)
}

// nodeRole parses the role of a join token.
func nodeRole(s string) (proto.Role, error) {
	switch s {
	case proto.RoleDevice.String():
		return proto.RoleDevice, nil
	case proto.RoleCompiler.String():
		return proto.RoleCompiler, nil
	}
	return 0, fmt.Errorf("role %q: a join token takes role device or compiler", s)
}

// load reads the file when it changed since the last read; changed says
// whether it did.
func (u *users) load() (changed bool, err error) {
	st, err := os.Stat(u.path)
	if err != nil {
		return false, fmt.Errorf("users file: %w", err)
	}
	u.mu.Lock()
	same := st.ModTime().Equal(u.modTime) && st.Size() == u.size && u.byHash != nil
	u.mu.Unlock()
	if same {
		return false, nil
	}
	text, err := os.ReadFile(u.path)
	if err != nil {
		return false, fmt.Errorf("users file: %w", err)
	}
	m, err := parseUsers(u.path, text)
	if err != nil {
		return false, err
	}
	u.mu.Lock()
	u.usersFile, u.modTime, u.size = m, st.ModTime(), st.Size()
	u.gen++
	u.mu.Unlock()
	return true, nil
}

// lookup returns the user a token belongs to.
func (u *users) lookup(token string) (userToken, bool) {
	h := sha256.Sum256([]byte(token))
	u.mu.Lock()
	defer u.mu.Unlock()
	t, ok := u.byHash[hex.EncodeToString(h[:])]
	return t, ok
}

// lookupJoin returns the join token a token is.
func (u *users) lookupJoin(token string) (joinToken, bool) {
	h := sha256.Sum256([]byte(token))
	u.mu.Lock()
	defer u.mu.Unlock()
	t, ok := u.joins[hex.EncodeToString(h[:])]
	return t, ok
}

// has reports whether user still has a token.
func (u *users) has(user string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, t := range u.byHash {
		if t.user == user {
			return true
		}
	}
	return false
}

// hasJoin reports whether the join token id is still in the file.
func (u *users) hasJoin(id string) bool {
	_, ok := u.joinByID(id)
	return ok
}

// joinByID returns the join token id.
func (u *users) joinByID(id string) (joinToken, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, t := range u.joins {
		if t.id == id {
			return t, true
		}
	}
	return joinToken{}, false
}

// revokedSince returns when node's credentials were last revoked (zero:
// never).
func (u *users) revokedSince(node string) time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.revoked[node]
}

// readUsersFile reads and checks the users file at path; a missing file
// is an empty one.
func readUsersFile(path string) ([]byte, error) {
	text, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("users file: %w", err)
	}
	if _, err := parseUsers(path, text); err != nil {
		return nil, err
	}
	return text, nil
}

// appendUsersLine appends one line to the users file at path (created
// 0600 when missing), after checking what is there, holding the file's
// lock.
func appendUsersLine(path, line string) error {
	unlock, err := lockUsersFile(path)
	if err != nil {
		return err
	}
	defer unlock()
	return appendUsersLineLocked(path, line)
}

// appendUsersLineLocked is appendUsersLine with the lock held.
func appendUsersLineLocked(path, line string) error {
	if _, err := readUsersFile(path); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("users file: %w", err)
	}
	_, err = fmt.Fprintln(f, line)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("users file: %w", err)
	}
	return nil
}

// newSecret returns prefix followed by 32 random bytes in hex, and the
// hex sha256 of the whole.
func newSecret(prefix string) (token, hash string) {
	b := make([]byte, 32)
	rand.Read(b)
	token = prefix + hex.EncodeToString(b)
	h := sha256.Sum256([]byte(token))
	return token, hex.EncodeToString(h[:])
}

// CreateUserToken makes a new token for user with role (client: nodes
// join with CreateJoinToken instead), appends its hash to the users file
// at path (created 0600 when missing) and returns the token, which is not
// stored anywhere else.
func CreateUserToken(path, user, role string) (string, error) {
	if !userName.MatchString(user) {
		return "", fmt.Errorf("user name %q: want letters, digits and ._@- (at most 64)", user)
	}
	if _, err := userRole(role); err != nil {
		return "", err
	}
	token, hash := newSecret("kiln-")
	if err := appendUsersLine(path, fmt.Sprintf("%s %s %s", user, role, hash)); err != nil {
		return "", err
	}
	return token, nil
}

// JoinTokenPrefix starts every join token, so a node can tell one from a
// fleet token or a credential.
const JoinTokenPrefix = "kiln-join-"

// MaxJoinTTL is the longest life a join token may have.
const MaxJoinTTL = 7 * 24 * time.Hour

// CreateJoinToken makes a join token for role (device or compiler) that
// expires after ttl and admits at most maxUses joins (0: any number until
// it expires), appends its hash to the users file at path and returns the
// token and its id (for RevokeJoin). A node presents it once to exchange
// it for its own credential; each node it admits may call tracker.join
// only.
func CreateJoinToken(path, role string, ttl time.Duration, maxUses int) (token, id string, expires time.Time, err error) {
	if _, err := nodeRole(role); err != nil {
		return "", "", time.Time{}, err
	}
	if ttl <= 0 || ttl > MaxJoinTTL {
		return "", "", time.Time{}, fmt.Errorf("join token ttl %v: want more than 0 and at most %v", ttl, MaxJoinTTL)
	}
	if maxUses < 0 {
		return "", "", time.Time{}, fmt.Errorf("join token max uses %d: want 0 (no limit) or more", maxUses)
	}
	unlock, err := lockUsersFile(path)
	if err != nil {
		return "", "", time.Time{}, err
	}
	defer unlock()
	// Expired join tokens admit nobody: their lines go when a new one comes.
	if _, err := os.Stat(path); err == nil {
		now := time.Now()
		if _, err := removeLinesLocked(path, func(f []string) bool {
			if len(f) < 5 || f[0] != "@join" {
				return false
			}
			exp, err := time.Parse(time.RFC3339, f[4])
			return err == nil && !now.Before(exp)
		}); err != nil {
			return "", "", time.Time{}, err
		}
	}
	b := make([]byte, 4)
	rand.Read(b)
	id = "j" + hex.EncodeToString(b)
	token, hash := newSecret(JoinTokenPrefix)
	expires = time.Now().Add(ttl).UTC().Truncate(time.Second)
	if err := appendUsersLineLocked(path, fmt.Sprintf("@join %s %s %s %s %d", id, role, hash, expires.Format(time.RFC3339), maxUses)); err != nil {
		return "", "", time.Time{}, err
	}
	return token, id, expires, nil
}

// RevokeNode revokes every credential node holds now: the tracker refuses
// them and closes the node's connections within a tick. Its machine may
// join again with a join token, under a new node id.
func RevokeNode(path, node string) error {
	if !userName.MatchString(node) {
		return fmt.Errorf("node id %q: want letters, digits and ._@- (at most 64)", node)
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("users file: %w", err)
	}
	return appendUsersLine(path, fmt.Sprintf("@revoked %s %s", node, time.Now().UTC().Format(time.RFC3339Nano)))
}

// RevokeUser removes every token of user from the users file at path and
// returns how many it removed; a running tracker closes the user's
// connections within a tick.
func RevokeUser(path, user string) (int, error) {
	n, err := removeLines(path, func(f []string) bool { return len(f) == 3 && f[0] == user })
	if err == nil && n == 0 {
		err = fmt.Errorf("users file %s: no token of user %q: %w", path, user, proto.ErrNotFound)
	}
	return n, err
}

// RevokeJoin removes the join token id from the users file at path; nodes
// that joined with it keep their credentials (revoke those with
// RevokeNode).
func RevokeJoin(path, id string) error {
	n, err := removeLines(path, func(f []string) bool { return len(f) >= 5 && f[0] == "@join" && f[1] == id })
	if err == nil && n == 0 {
		err = fmt.Errorf("users file %s: no join token %q: %w", path, id, proto.ErrNotFound)
	}
	return err
}

// removeLines rewrites the users file at path without the lines whose
// fields drop says, holding the file's lock, and returns how many it
// removed.
func removeLines(path string, drop func(fields []string) bool) (int, error) {
	unlock, err := lockUsersFile(path)
	if err != nil {
		return 0, err
	}
	defer unlock()
	return removeLinesLocked(path, drop)
}

// removeLinesLocked is removeLines with the lock held.
func removeLinesLocked(path string, drop func(fields []string) bool) (int, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("users file: %w", err)
	}
	if _, err := parseUsers(path, text); err != nil {
		return 0, err
	}
	var out strings.Builder
	removed := 0
	for _, line := range strings.SplitAfter(string(text), "\n") {
		if drop(strings.Fields(line)) {
			removed++
			continue
		}
		out.WriteString(line)
	}
	if removed == 0 {
		return 0, nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(out.String()), 0o600); err != nil {
		return 0, fmt.Errorf("users file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, fmt.Errorf("users file: %w", err)
	}
	return removed, nil
}

// UsersFileEntry is one line of a users file as ListUsersFile shows it;
// no token or hash is shown.
type UsersFileEntry struct {
	Kind string    `json:"kind"` // "user", "join" or "revoked"
	Name string    `json:"name"` // the user, the join token's id or the node id
	Role string    `json:"role,omitempty"`
	When time.Time `json:"when,omitzero"` // a join token's expiry, a revocation's time
	// MaxUses is how many nodes a join token admits (0: no limit).
	MaxUses int `json:"max_uses,omitempty"`
}

// ListUsersFile returns the entries of the users file at path in file
// order.
func ListUsersFile(path string) ([]UsersFileEntry, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("users file: %w", err)
	}
	if _, err := parseUsers(path, text); err != nil {
		return nil, err
	}
	var out []UsersFileEntry
	for _, line := range strings.Split(string(text), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 0 || strings.HasPrefix(f[0], "#"):
		case f[0] == "@join":
			exp, _ := time.Parse(time.RFC3339, f[4])
			e := UsersFileEntry{Kind: "join", Name: f[1], Role: f[2], When: exp}
			if len(f) == 6 {
				e.MaxUses, _ = strconv.Atoi(f[5])
			}
			out = append(out, e)
		case f[0] == "@revoked":
			since, _ := time.Parse(time.RFC3339Nano, f[2])
			out = append(out, UsersFileEntry{Kind: "revoked", Name: f[1], When: since})
		default:
			out = append(out, UsersFileEntry{Kind: "user", Name: f[0], Role: f[1]})
		}
	}
	return out, nil
}
