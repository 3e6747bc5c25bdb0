package cli

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/tracker"
)

// tokenCommand manages the tracker's named user tokens, join tokens and
// node revocations.
func tokenCommand() *ucli.Command {
	fileFlag := &ucli.StringFlag{Name: "users-file", Required: true, Usage: "the tracker's --users-file"}
	return &ucli.Command{
		Name:  "token",
		Usage: "create and revoke user tokens, join tokens and node credentials in a tracker's --users-file",
		Description: `A tracker started with --users-file FILE admits, beside the fleet token:

  - named user tokens (--user NAME --role client): its user, as a client
    only; a user token registers nothing;
  - join tokens (--role device|compiler --ttl D [--max-uses N], no
    --user): short-lived, for bootstrap only, admitting at most N nodes
    (default 1 for --role compiler, no limit for --role device, whose
    boards often share one token; 0 is no limit). A node presents one once (kiln rpcserver
    --tracker-token-file / kiln compiler --token-file, with
    --credential-file F) and gets its own credential, bound to its node
    id and to the join token's role, which it keeps in F and presents
    from then on. A device credential cannot take build jobs, a compiler
    credential cannot register a device, and neither can register under
    another node's id.

FILE holds only the tokens' hashes; credentials live in the tracker's
tracker.db. The tracker re-reads FILE when it changes: a revoked user's or
node's connections are closed and new ones refused within a second.

Examples:
   kiln token create --users-file /etc/kiln/users --user alice --role client > alice.token
   kiln token create --users-file /etc/kiln/users --role device --ttl 1h > join.token
   kiln token list --users-file /etc/kiln/users
   kiln token revoke --users-file /etc/kiln/users --user alice
   kiln token revoke --users-file /etc/kiln/users --node device-3fa29c01a2b4
   kiln token revoke --users-file /etc/kiln/users --join j5c1e09aa`,
		Subcommands: []*ucli.Command{
			{
				Name:  "create",
				Usage: "print a new user token or join token (shown once) and add its hash to the users file",
				UsageText: "kiln token create --users-file FILE --user NAME [--role client]\n" +
					"   kiln token create --users-file FILE --role device|compiler [--ttl 1h] [--max-uses N]",
				Flags: []ucli.Flag{
					fileFlag,
					&ucli.StringFlag{Name: "user", Usage: "user name (letters, digits and ._@-) of a named user token; leave it out for a join token"},
					&ucli.StringFlag{Name: "role", Value: "client", Usage: "client (a named user token), or device or compiler (a join token)"},
					&ucli.DurationFlag{Name: "ttl", Value: time.Hour, Usage: fmt.Sprintf("life of a join token (at most %v)", tracker.MaxJoinTTL)},
					&ucli.IntFlag{Name: "max-uses", Usage: "how many nodes a join token admits (0: no limit until it expires; default 1 for --role compiler, 0 for --role device)"},
				},
				OnUsageError: usageError,
				Action: func(c *ucli.Context) error {
					if err := noArgs(c); err != nil {
						return err
					}
					path, user, role := c.String("users-file"), c.String("user"), c.String("role")
					if user != "" {
						if c.IsSet("ttl") || c.IsSet("max-uses") {
							return errors.New("token create: --ttl and --max-uses are for join tokens; a named user token lasts until it is revoked")
						}
						tok, err := tracker.CreateUserToken(path, user, role)
						if err != nil {
							return fmt.Errorf("token create: %w", err)
						}
						fmt.Fprintln(c.App.Writer, tok)
						return nil
					}
					if role == "client" {
						return errors.New("token create: a client token names its user (--user NAME); --role device or compiler without --user makes a join token")
					}
					uses := c.Int("max-uses")
					if !c.IsSet("max-uses") && role == "compiler" {
						uses = 1
					}
					tok, id, exp, err := tracker.CreateJoinToken(path, role, c.Duration("ttl"), uses)
					if err != nil {
						return fmt.Errorf("token create: %w", err)
					}
					fmt.Fprintln(c.App.Writer, tok)
					admits := "any number of nodes"
					if uses > 0 {
						admits = fmt.Sprintf("at most %d node(s)", uses)
					}
					fmt.Fprintf(c.App.ErrWriter, "join token %s for role %s, valid until %s, admits %s\n", id, role, exp.Format(time.RFC3339), admits)
					return nil
				},
			},
			{
				Name:         "list",
				Usage:        "list the users, join tokens (with their expiry) and node revocations in the users file; no token is shown",
				UsageText:    "kiln token list --users-file FILE",
				Flags:        []ucli.Flag{fileFlag},
				OnUsageError: usageError,
				Action: func(c *ucli.Context) error {
					if err := noArgs(c); err != nil {
						return err
					}
					entries, err := tracker.ListUsersFile(c.String("users-file"))
					if err != nil {
						return fmt.Errorf("token list: %w", err)
					}
					w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					fmt.Fprintln(w, "KIND\tNAME\tROLE\tDETAILS")
					now := time.Now()
					for _, e := range entries {
						details := ""
						switch e.Kind {
						case "join":
							details = "expires " + e.When.Format(time.RFC3339)
							if !now.Before(e.When) {
								details = "expired " + e.When.Format(time.RFC3339)
							}
							if e.MaxUses > 0 {
								details += fmt.Sprintf(", admits at most %d node(s)", e.MaxUses)
							}
						case "revoked":
							details = "credentials issued up to " + e.When.Format(time.RFC3339) + " refused"
						}
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", e.Kind, e.Name, e.Role, details)
					}
					return w.Flush()
				},
			},
			{
				Name:      "revoke",
				Usage:     "remove a user's tokens or a join token, or revoke a node's credential",
				UsageText: "kiln token revoke --users-file FILE (--user NAME | --join ID | --node NODE-ID)",
				Flags: []ucli.Flag{
					fileFlag,
					&ucli.StringFlag{Name: "user", Usage: "remove every token of this user"},
					&ucli.StringFlag{Name: "join", Usage: "remove this join token (its id, as create printed it); nodes that joined with it keep their credentials"},
					&ucli.StringFlag{Name: "node", Usage: "revoke the credential this node holds now (the node may join again with a join token, under a new node id)"},
				},
				OnUsageError: usageError,
				Action: func(c *ucli.Context) error {
					if err := noArgs(c); err != nil {
						return err
					}
					path := c.String("users-file")
					set := 0
					for _, f := range []string{"user", "join", "node"} {
						if c.String(f) != "" {
							set++
						}
					}
					if set != 1 {
						return errors.New("token revoke: give exactly one of --user, --join and --node")
					}
					switch {
					case c.String("user") != "":
						n, err := tracker.RevokeUser(path, c.String("user"))
						if err != nil {
							return fmt.Errorf("token revoke: %w", err)
						}
						fmt.Fprintf(c.App.ErrWriter, "revoked %d token(s) of %s\n", n, c.String("user"))
					case c.String("join") != "":
						if err := tracker.RevokeJoin(path, c.String("join")); err != nil {
							return fmt.Errorf("token revoke: %w", err)
						}
						fmt.Fprintf(c.App.ErrWriter, "removed join token %s\n", c.String("join"))
					default:
						if err := tracker.RevokeNode(path, c.String("node")); err != nil {
							return fmt.Errorf("token revoke: %w", err)
						}
						fmt.Fprintf(c.App.ErrWriter, "revoked the credential of node %s\n", c.String("node"))
					}
					return nil
				},
			},
		},
	}
}
