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
	"strings"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// The users file (Config.UsersFile) holds named user tokens, one a line:
//
//	USER ROLE SHA256-OF-TOKEN
//
// ROLE is client, device or compiler; '#' starts a comment. The file holds
// only the tokens' hashes: CreateUserToken prints a token once and appends
// its line, RevokeUser removes a user's lines. The tracker reads the file
// again when it changes, so a revocation takes effect within a tick and
// the revoked user's connections are closed.

// userName is what a user name may be.
var userName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// userToken is one line of the users file.
type userToken struct {
	user string
	role proto.Role
}

// users is the users file as last read.
type users struct {
	path string

	mu      sync.Mutex
	byHash  map[string]userToken
	modTime time.Time
	size    int64
}

// parseUsers reads a users file's text.
func parseUsers(path string, text []byte) (map[string]userToken, error) {
	m := map[string]userToken{}
	sc := bufio.NewScanner(bytes.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			return nil, fmt.Errorf("users file %s:%d: want USER ROLE SHA256, got %d fields", path, n, len(f))
		}
		if !userName.MatchString(f[0]) {
			return nil, fmt.Errorf("users file %s:%d: user name %q: want letters, digits and ._@- (at most 64)", path, n, f[0])
		}
		role, err := userRole(f[1])
		if err != nil {
			return nil, fmt.Errorf("users file %s:%d: %w", path, n, err)
		}
		if len(f[2]) != 64 {
			return nil, fmt.Errorf("users file %s:%d: %q is not a sha256 in hex", path, n, f[2])
		}
		if _, err := hex.DecodeString(f[2]); err != nil {
			return nil, fmt.Errorf("users file %s:%d: %q is not a sha256 in hex", path, n, f[2])
		}
		m[strings.ToLower(f[2])] = userToken{user: f[0], role: role}
	}
	return m, sc.Err()
}

// userRole parses a role a user token may carry.
func userRole(s string) (proto.Role, error) {
	for _, r := range []proto.Role{proto.RoleClient, proto.RoleDevice, proto.RoleCompiler} {
		if r.String() == s {
			return r, nil
		}
	}
	return 0, fmt.Errorf("role %q: want client, device or compiler", s)
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
	u.byHash, u.modTime, u.size = m, st.ModTime(), st.Size()
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

// authenticate admits the fleet token (any role, no user name) and the
// users file's tokens (their own role only).
func (s *Server) authenticate(token string, role proto.Role) (string, error) {
	if s.cfg.Token != "" && proto.TokenEqual(token, s.cfg.Token) {
		return "", nil
	}
	if s.users != nil {
		if t, ok := s.users.lookup(token); ok {
			if t.role != role {
				return "", fmt.Errorf("the token of user %q is for role %s, not %s", t.user, t.role, role)
			}
			return t.user, nil
		}
	}
	return "", proto.ErrUnauthorized
}

// reloadUsers reads the users file again when it changed and closes the
// connections of users who no longer have a token.
func (s *Server) reloadUsers() {
	changed, err := s.users.load()
	if err != nil {
		s.log.Error("users file not reloaded; the last good one stays in force", "err", err)
		return
	}
	if !changed {
		return
	}
	s.log.Info("users file reloaded", "path", s.users.path)
	s.mu.Lock()
	var gone []*proto.Conn
	for c := range s.userConns {
		if !s.users.has(c.User()) {
			gone = append(gone, c)
			delete(s.userConns, c)
		}
	}
	s.mu.Unlock()
	for _, c := range gone {
		s.log.Info("closing the connection of a revoked user", "user", c.User(), "remote", c.RemoteAddr())
		c.Close()
	}
}

// CreateUserToken makes a new token for user with role, appends its hash
// to the users file at path (created 0600 when missing) and returns the
// token, which is not stored anywhere else.
func CreateUserToken(path, user, role string) (string, error) {
	if !userName.MatchString(user) {
		return "", fmt.Errorf("user name %q: want letters, digits and ._@- (at most 64)", user)
	}
	if _, err := userRole(role); err != nil {
		return "", err
	}
	if text, err := os.ReadFile(path); err == nil {
		if _, err := parseUsers(path, text); err != nil {
			return "", err
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("users file: %w", err)
	}
	b := make([]byte, 32)
	rand.Read(b)
	token := "kiln-" + hex.EncodeToString(b)
	h := sha256.Sum256([]byte(token))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return "", fmt.Errorf("users file: %w", err)
	}
	_, err = fmt.Fprintf(f, "%s %s %s\n", user, role, hex.EncodeToString(h[:]))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("users file: %w", err)
	}
	return token, nil
}

// RevokeUser removes every token of user from the users file at path and
// returns how many it removed; a running tracker closes the user's
// connections within a tick.
func RevokeUser(path, user string) (int, error) {
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
		if f := strings.Fields(line); len(f) == 3 && f[0] == user {
			removed++
			continue
		}
		out.WriteString(line)
	}
	if removed == 0 {
		return 0, fmt.Errorf("users file %s: no token of user %q: %w", path, user, proto.ErrNotFound)
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
