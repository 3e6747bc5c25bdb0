package cli

import (
	"fmt"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/tracker"
)

// tokenCommand manages the tracker's named user tokens.
func tokenCommand() *ucli.Command {
	fileFlag := &ucli.StringFlag{Name: "users-file", Required: true, Usage: "the tracker's --users-file"}
	userFlag := &ucli.StringFlag{Name: "user", Required: true, Usage: "user name (letters, digits and ._@-)"}
	return &ucli.Command{
		Name:  "token",
		Usage: "create and revoke named user tokens for a tracker's --users-file",
		Description: `A tracker started with --users-file FILE admits, beside the fleet token,
each token in FILE as its user, in its one role (client, device or
compiler): a token made for a client cannot register a device. FILE holds
only the tokens' hashes. The tracker re-reads it when it changes: a revoked
user's connections are closed and new ones refused within a second.

Examples:
   kiln token create --users-file /etc/kiln/users --user alice --role client > alice.token
   kiln token revoke --users-file /etc/kiln/users --user alice`,
		Subcommands: []*ucli.Command{
			{
				Name:         "create",
				Usage:        "print a new token for a user (shown once) and add its hash to the users file",
				UsageText:    "kiln token create --users-file FILE --user NAME --role client|device|compiler",
				Flags:        []ucli.Flag{fileFlag, userFlag, &ucli.StringFlag{Name: "role", Value: "client", Usage: "client, device or compiler"}},
				OnUsageError: usageError,
				Action: func(c *ucli.Context) error {
					if err := noArgs(c); err != nil {
						return err
					}
					tok, err := tracker.CreateUserToken(c.String("users-file"), c.String("user"), c.String("role"))
					if err != nil {
						return fmt.Errorf("token create: %w", err)
					}
					fmt.Fprintln(c.App.Writer, tok)
					return nil
				},
			},
			{
				Name:         "revoke",
				Usage:        "remove every token of a user from the users file",
				UsageText:    "kiln token revoke --users-file FILE --user NAME",
				Flags:        []ucli.Flag{fileFlag, userFlag},
				OnUsageError: usageError,
				Action: func(c *ucli.Context) error {
					if err := noArgs(c); err != nil {
						return err
					}
					n, err := tracker.RevokeUser(c.String("users-file"), c.String("user"))
					if err != nil {
						return fmt.Errorf("token revoke: %w", err)
					}
					fmt.Fprintf(c.App.ErrWriter, "revoked %d token(s) of %s\n", n, c.String("user"))
					return nil
				},
			},
		},
	}
}
