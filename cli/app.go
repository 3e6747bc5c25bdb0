// Package cli owns kiln's command-line interface: the urfave/cli/v2 app and
// one file per command (version, devices, and later tracker, rpcserver,
// compiler, build, run, bench, print, demo).
//
// Commands write their output to the app's Writer and return errors instead
// of printing them; cmd/kiln prints the error and sets the exit status. The
// CLI sees only kiln's public packages (client, devices, …), never a
// daemon's internals, and nothing imports cli.
package cli

import (
	"fmt"
	"os"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/compiler"
	// Backends that `kiln devices` lists.
	_ "github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/devices/cuda"
)

// Builds for cuda compile their kernels with this machine's NVRTC.
func init() { compiler.RegisterCUDACompiler(cuda.NVRTC{}) }

// App builds a fresh kiln CLI application writing to os.Stdout and
// os.Stderr. Callers (tests) may replace its Writer and ErrWriter before
// Run. Errors are returned from Run, never printed or turned into os.Exit.
func App() *ucli.App {
	app := &ucli.App{
		Name:      "kiln",
		HelpName:  "kiln",
		Usage:     "compile and run tensor programs on local and remote devices",
		UsageText: "kiln [global options] command [command options] [arguments...]",
		Version:   Version(),
		Description: strings.TrimSpace(`
kiln compiles tensor programs (IRModules, ONNX models) into artifacts and runs
them on CPUs and NVIDIA GPUs, locally or on a fleet of device daemons behind a
tracker. One binary plays every role.

Examples:
   kiln devices           list this machine's devices and their attributes
   kiln devices --json    the same, as one JSON document
   kiln version           build, Go and ABI versions
   kiln help devices      help for one command`),
		Commands: []*ucli.Command{
			versionCommand(),
			devicesCommand(),
			runCommand(),
			printCommand(),
			buildCommand(),
			tuneCommand(),
			benchCommand(),
			resultsCommand(),
			demoCommand(),
			queryCommand(),
			tokenCommand(),
			trackerCommand(),
			rpcserverCommand(),
			proxyCommand(),
			compilerCommand(),
			compilerJobCommand(),
			rpcserverWorkerCommand(),
		},
		Writer:    os.Stdout,
		ErrWriter: os.Stderr,
		// Errors go back to the caller of Run; cmd/kiln prints them and exits.
		ExitErrHandler: func(*ucli.Context, error) {},
		OnUsageError:   usageError,
		Action:         rootAction,
	}
	for _, cmd := range app.Commands {
		checkRequired(cmd)
	}
	return app
}

// checkRequired moves the check of cmd's required flags into its Before
// hook: urfave/cli prints the whole help before a missing flag's error,
// where one line naming the flag and one hint is what a user needs.
func checkRequired(cmd *ucli.Command) {
	var required []*ucli.StringFlag
	for _, f := range cmd.Flags {
		if sf, ok := f.(*ucli.StringFlag); ok && sf.Required {
			sf.Required = false
			required = append(required, sf)
		}
	}
	if len(required) == 0 {
		return
	}
	before := cmd.Before
	cmd.Before = func(c *ucli.Context) error {
		for _, f := range required {
			if !c.IsSet(f.Name) {
				return fmt.Errorf("%s: missing --%s (%s); see \"kiln %s --help\"", cmd.Name, f.Name, f.Usage, cmd.Name)
			}
		}
		if before != nil {
			return before(c)
		}
		return nil
	}
}

// rootAction runs when no command matched: without arguments it shows help,
// with one it reports the unknown command.
func rootAction(c *ucli.Context) error {
	if !c.Args().Present() {
		return ucli.ShowAppHelp(c)
	}
	return fmt.Errorf("unknown command %q (run \"kiln help\" for the list)", c.Args().First())
}

// usageError turns a flag parsing error into an error naming the command.
func usageError(c *ucli.Context, err error, isSubcommand bool) error {
	if isSubcommand && c.Command != nil && c.Command.Name != "" {
		return fmt.Errorf("%s: %w (see %q)", c.Command.Name, err, "kiln "+c.Command.Name+" --help")
	}
	return fmt.Errorf("%w (see %q)", err, "kiln --help")
}

// noArgs fails a command that takes no positional arguments but got some.
func noArgs(c *ucli.Context) error {
	if c.Args().Present() {
		return fmt.Errorf("%s: unexpected argument %q", c.Command.FullName(), c.Args().First())
	}
	return nil
}
