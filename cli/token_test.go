package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestTokenCommands creates and revokes named user tokens through the CLI:
// the token is printed once, the file holds only its hash, and a revoked
// user's line is gone.
func TestTokenCommands(t *testing.T) {
	users := filepath.Join(t.TempDir(), "users")
	out, errOut, err := runApp(t, "token", "create", "--users-file", users, "--user", "alice", "--role", "client")
	check.NoError(t, err, errOut)
	tok := strings.TrimSpace(out)
	check.True(t, strings.HasPrefix(tok, "kiln-") && len(tok) == 5+64, tok)
	_, _, err = runApp(t, "token", "create", "--users-file", users, "--user", "board-7", "--role", "device")
	check.Error(t, err, "for clients only", "kiln token create --role device --ttl 1h")
	_, _, err = runApp(t, "token", "create", "--users-file", users, "--user", "bob")
	check.NoError(t, err)
	text, err := os.ReadFile(users)
	check.NoError(t, err)
	check.True(t, !strings.Contains(string(text), tok), "the users file holds the token itself")
	check.True(t, strings.HasPrefix(string(text), "alice client "), string(text))

	_, errOut, err = runApp(t, "token", "revoke", "--users-file", users, "--user", "alice")
	check.NoError(t, err)
	check.True(t, strings.Contains(errOut, "revoked 1 token(s) of alice"), errOut)
	text, err = os.ReadFile(users)
	check.NoError(t, err)
	check.True(t, !strings.Contains(string(text), "alice") && strings.Contains(string(text), "bob client "), string(text))

	_, _, err = runApp(t, "token", "revoke", "--users-file", users, "--user", "alice")
	check.Error(t, err, `no token of user "alice"`)
	_, _, err = runApp(t, "token", "create", "--users-file", users, "--user", "mallory", "--role", "admin")
	check.Error(t, err, `role "admin"`)
}

// TestJoinTokenCommands creates a join token (printed once, its hash and
// expiry in the file), removes it, and revokes a node's credential.
func TestJoinTokenCommands(t *testing.T) {
	users := filepath.Join(t.TempDir(), "users")
	out, errOut, err := runApp(t, "token", "create", "--users-file", users, "--role", "compiler", "--ttl", "30m")
	check.NoError(t, err, errOut)
	tok := strings.TrimSpace(out)
	check.True(t, strings.HasPrefix(tok, "kiln-join-"), tok)
	check.True(t, strings.Contains(errOut, "for role compiler, valid until"), errOut)
	id := strings.Fields(errOut)[2]
	text, err := os.ReadFile(users)
	check.NoError(t, err)
	check.True(t, strings.HasPrefix(string(text), "@join "+id+" compiler ") && !strings.Contains(string(text), tok), string(text))
	// A compiler join token admits one node unless told otherwise; a
	// device one admits as many as --max-uses says (no limit without it).
	check.True(t, strings.HasSuffix(strings.TrimSpace(string(text)), " 1") && strings.Contains(errOut, "admits at most 1 node(s)"), string(text)+errOut)
	_, errOut, err = runApp(t, "token", "create", "--users-file", users, "--role", "device", "--max-uses", "8")
	check.NoError(t, err, errOut)
	check.True(t, strings.Contains(errOut, "admits at most 8 node(s)"), errOut)
	devID := strings.Fields(errOut)[2]
	_, errOut, err = runApp(t, "token", "create", "--users-file", users, "--role", "device")
	check.NoError(t, err, errOut)
	check.True(t, strings.Contains(errOut, "admits any number of nodes"), errOut)
	anyID := strings.Fields(errOut)[2]
	_, _, err = runApp(t, "token", "create", "--users-file", users, "--role", "device", "--max-uses", "-1")
	check.Error(t, err, "want 0 (no limit) or more")
	for _, j := range []string{devID, anyID} {
		_, _, err = runApp(t, "token", "revoke", "--users-file", users, "--join", j)
		check.NoError(t, err)
	}

	_, _, err = runApp(t, "token", "create", "--users-file", users, "--role", "client")
	check.Error(t, err, "--user NAME")
	_, _, err = runApp(t, "token", "create", "--users-file", users, "--role", "device", "--ttl", "720h")
	check.Error(t, err, "at most 168h")
	_, _, err = runApp(t, "token", "create", "--users-file", users, "--user", "alice", "--ttl", "1h")
	check.Error(t, err, "--ttl and --max-uses are for join tokens")

	out, _, err = runApp(t, "token", "list", "--users-file", users)
	check.NoError(t, err)
	check.True(t, strings.Contains(out, "join") && strings.Contains(out, id) && strings.Contains(out, "compiler") && strings.Contains(out, "expires ") && strings.Contains(out, "admits at most 1 node(s)") && !strings.Contains(out, tok), out)
	_, errOut, err = runApp(t, "token", "revoke", "--users-file", users, "--join", id)
	check.NoError(t, err)
	check.True(t, strings.Contains(errOut, "removed join token "+id), errOut)
	_, errOut, err = runApp(t, "token", "revoke", "--users-file", users, "--node", "device-1")
	check.NoError(t, err)
	check.True(t, strings.Contains(errOut, "revoked the credential of node device-1"), errOut)
	text, err = os.ReadFile(users)
	check.NoError(t, err)
	check.True(t, !strings.Contains(string(text), "@join") && strings.HasPrefix(string(text), "@revoked device-1 "), string(text))
	out, _, err = runApp(t, "token", "list", "--users-file", users)
	check.NoError(t, err)
	check.True(t, strings.Contains(out, "revoked  device-1") && strings.Contains(out, "refused"), out)
	_, _, err = runApp(t, "token", "revoke", "--users-file", users, "--node", "device-1", "--user", "x")
	check.Error(t, err, "exactly one of")
}
