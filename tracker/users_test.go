package tracker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestUserTokens: a named user token admits its user in its own role only,
// the fleet token still admits any role, and revoking the user refuses new
// connections and closes the user's open ones.
func TestUserTokens(t *testing.T) {
	cfg := fastConfig(t)
	cfg.Token = "fleet"
	cfg.UsersFile = filepath.Join(t.TempDir(), "users")
	alice, err := CreateUserToken(cfg.UsersFile, "alice", "client")
	check.NoError(t, err)
	bob, err := CreateUserToken(cfg.UsersFile, "bob", "client")
	check.NoError(t, err)
	st, err := os.Stat(cfg.UsersFile)
	check.NoError(t, err)
	check.Equal(t, st.Mode().Perm(), os.FileMode(0o600))
	text, err := os.ReadFile(cfg.UsersFile)
	check.NoError(t, err)
	check.True(t, !strings.Contains(string(text), alice), "the users file holds a token, not its hash")

	a := startTracker(t, cfg)
	ctx := testCtx(t)
	dial := func(tok string, role proto.Role) (*proto.Client, error) {
		c, err := proto.Dial(ctx, a.Addr(), proto.DialOptions{Role: role, Token: tok, Logger: quietLogger()})
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
		return c, err
	}

	// Alice as a client: admitted.
	tc, err := client.DialTracker(ctx, a.Addr(), client.TrackerOptions{Token: alice, Logger: quietLogger()})
	check.NoError(t, err)
	defer tc.Close()
	_, err = tc.Query(ctx, 0)
	check.NoError(t, err)

	// Alice as a device or a compiler node: refused, naming the role.
	_, err = dial(alice, proto.RoleDevice)
	check.Error(t, err, `user "alice"`, "role client, not device")
	_, err = dial(alice, proto.RoleCompiler)
	check.Error(t, err, "not compiler")
	// A made-up token: refused as a wrong token.
	_, err = dial("kiln-0000", proto.RoleClient)
	check.ErrorIs(t, err, proto.ErrUnauthorized)
	// The fleet token still takes any role.
	_, err = dial("fleet", proto.RoleDevice)
	check.NoError(t, err)

	// Revoke alice: her open connection is closed, a new one refused; bob
	// is untouched.
	n, err := RevokeUser(cfg.UsersFile, "alice")
	check.NoError(t, err)
	check.Equal(t, n, 1)
	eventually(t, "alice's connection is closed", func() bool {
		_, err := tc.Query(ctx, 0)
		return err != nil
	})
	_, err = dial(alice, proto.RoleClient)
	check.ErrorIs(t, err, proto.ErrUnauthorized)
	_, err = dial(bob, proto.RoleClient)
	check.NoError(t, err)
	_, err = RevokeUser(cfg.UsersFile, "alice")
	check.ErrorIs(t, err, proto.ErrNotFound)
}

// TestUsersFileErrors: a bad users file stops the tracker from starting,
// naming the line; bad names and roles are refused when creating a token.
func TestUsersFileErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad")
	check.NoError(t, os.WriteFile(bad, []byte("# users\nalice client\n"), 0o600))
	cfg := fastConfig(t)
	cfg.Token = "fleet"
	cfg.UsersFile = bad
	_, err := New(cfg)
	check.Error(t, err, "bad:2", "USER ROLE SHA256")
	_, err = CreateUserToken(filepath.Join(dir, "u"), "al ice", "client")
	check.Error(t, err, `"al ice"`)
	_, err = CreateUserToken(filepath.Join(dir, "u"), "alice", "admin")
	check.Error(t, err, `role "admin"`, "client, device or compiler")
}
