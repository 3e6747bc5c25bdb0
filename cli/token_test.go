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
	check.True(t, !strings.Contains(string(text), "alice") && strings.Contains(string(text), "board-7 device "), string(text))

	_, _, err = runApp(t, "token", "revoke", "--users-file", users, "--user", "alice")
	check.Error(t, err, `no token of user "alice"`)
	_, _, err = runApp(t, "token", "create", "--users-file", users, "--user", "mallory", "--role", "admin")
	check.Error(t, err, `role "admin"`)
}
