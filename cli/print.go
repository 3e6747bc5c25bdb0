package cli

import (
	"fmt"
	"os"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/compiler/script"
)

func printCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "print",
		Usage:     "parse an IRModule in TVMScript syntax and print it back",
		UsageText: "kiln print FILE",
		Description: `Parses FILE (an @I.ir_module class or bare @T.prim_func / @R.function
definitions, in TVMScript syntax) and prints the module as kiln's printer
writes it: the canonical form, which parses back to the same module. A syntax
error names the file, line and column and shows the line with a caret.

Examples:
   kiln print matmul.py`,
		OnUsageError: usageError,
		Action:       runPrint,
	}
}

func runPrint(c *ucli.Context) error {
	if c.NArg() != 1 {
		return fmt.Errorf("print: want one file, got %d arguments (see \"kiln print --help\")", c.NArg())
	}
	path := c.Args().First()
	src, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("print: %w", err)
	}
	mod, err := script.Parse(path, string(src))
	if err != nil {
		return err
	}
	_, err = fmt.Fprint(c.App.Writer, script.Print(mod))
	return err
}
