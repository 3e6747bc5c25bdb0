package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// Run runs app on args (args[0] is the program name) with flags allowed
// after positional arguments, as in `kiln run out.kiln --func f`: urfave/cli
// stops reading flags at the first positional argument, so Run moves the
// command's flags in front of its positional arguments first.
func Run(ctx context.Context, app *ucli.App, args []string) error {
	return withHint(app.RunContext(ctx, Intersperse(app, args)))
}

// withHint adds to an error what a user can do about it, where the CLI
// knows: the flag that gives a missing token.
func withHint(err error) error {
	if err != nil && errors.Is(err, proto.ErrUnauthorized) && strings.Contains(err.Error(), "no token was given") {
		return fmt.Errorf("%w (pass --token-file FILE or set KILN_TOKEN_FILE)", err)
	}
	return err
}

// Intersperse reorders the arguments of a command so its flags come before
// its positional arguments. Anything after "--" stays positional, and
// arguments of an unknown command are left as they are.
func Intersperse(app *ucli.App, args []string) []string {
	if len(args) < 3 {
		return args
	}
	cmd, prefix := app.Command(args[1]), 2
	if cmd != nil && len(cmd.Subcommands) > 0 {
		// A subcommand's flags move in front of its arguments too.
		var sub *ucli.Command
		for _, sc := range cmd.Subcommands {
			if sc.HasName(args[2]) {
				sub = sc
			}
		}
		cmd, prefix = sub, 3
	}
	if cmd == nil || len(cmd.Subcommands) > 0 {
		return args
	}
	takesValue := map[string]bool{}
	for _, f := range cmd.Flags {
		_, isBool := f.(*ucli.BoolFlag)
		for _, n := range f.Names() {
			takesValue[n] = !isBool
		}
	}
	var flags, pos []string
	rest := args[prefix:]
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			pos = append(pos, rest[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if takesValue[name] && !hasValue && i+1 < len(rest) {
			flags = append(flags, rest[i+1])
			i++
		}
	}
	out := append(append([]string{}, args[:prefix]...), flags...)
	if len(pos) > 0 {
		out = append(out, "--")
		out = append(out, pos...)
	}
	return out
}
