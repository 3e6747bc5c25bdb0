package cli

import (
	"fmt"
	"os"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/compiler/frontend/onnx"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/transform"
	"github.com/kiln-ml/kiln/compiler/script"
	lower "github.com/kiln-ml/kiln/compiler/transform"
)

func printCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "print",
		Usage:     "parse an IRModule in TVMScript syntax and print it back, optionally after graph-level passes",
		UsageText: "kiln print FILE [--passes P1,P2,…] [--pipeline NAME] [--dump-ir after:PASS] [--input-shape NAME=DIMS]",
		Description: `Parses FILE (an @I.ir_module class or bare @T.prim_func / @R.function
definitions, in TVMScript syntax; or an ONNX model, FILE.onnx, imported
into one graph function, its symbolic dims given with --input-shape) and prints the module as kiln's printer
writes it: the canonical form, which parses back to the same module. A syntax
error names the file, line and column and shows the line with a caret.

--pipeline runs a named pass pipeline first (` + strings.Join(transform.PipelineNames(), ", ") + `),
then --passes runs the listed graph-level passes in order (` + strings.Join(transform.Names(), ", ") + `).
The module is verified after every pass.

--dump-ir after:PASS[,after:PASS…] (or all) lowers the module's PrimFuncs
with the lowering pipeline instead and prints the IR after each named pass
(` + strings.Join(lower.PassNames(), ", ") + `).

Examples:
   kiln print matmul.py
   kiln print mlp.py --pipeline zero
   kiln print mlp.py --passes LegalizeOps,AnnotateTIROpPattern,FuseOps
   kiln print matmul.py --dump-ir after:lower_blocks,after:make_packed_api
   kiln print model.onnx --input-shape x=1x3x224x224`,
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "passes", Usage: "comma-separated graph-level passes to run before printing"},
			&ucli.StringFlag{Name: "pipeline", Usage: "named pass pipeline to run before printing (" + strings.Join(transform.PipelineNames(), ", ") + ")"},
			&ucli.StringFlag{Name: "dump-ir", Usage: "print the IR after lowering passes: after:PASS[,after:PASS…] or all"},
			&ucli.StringSliceFlag{Name: "input-shape", Usage: "ONNX models: NAME=D1xD2… fixes the shape of an input with symbolic dims (repeatable)"},
		},
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
	var mod *ir.IRModule
	if onnx.IsModelPath(path) {
		shapes, err := onnx.ParseInputShapes(c.StringSlice("input-shape"))
		if err != nil {
			return fmt.Errorf("print: %w", err)
		}
		if mod, _, err = onnx.ImportFile(path, onnx.Options{InputShapes: shapes}); err != nil {
			return fmt.Errorf("print: %w", err)
		}
	} else if mod, err = script.Parse(path, string(src)); err != nil {
		return err
	}
	if name := c.String("pipeline"); name != "" {
		if mod, err = transform.RunPipeline(mod, name); err != nil {
			return fmt.Errorf("print: %w", err)
		}
	}
	if list := c.String("passes"); list != "" {
		var names []string
		for _, n := range strings.Split(list, ",") {
			if n = strings.TrimSpace(n); n != "" {
				names = append(names, n)
			}
		}
		if mod, err = transform.Run(mod, names); err != nil {
			return fmt.Errorf("print: %w", err)
		}
	}
	if d := c.String("dump-ir"); d != "" {
		after, err := lower.ParseDumpIR(d)
		if err != nil {
			return fmt.Errorf("print: %w", err)
		}
		if _, err := lower.LowerModule(mod, lower.Options{DumpAfter: after, Dump: c.App.Writer, Verify: true}); err != nil {
			return fmt.Errorf("print: %w", err)
		}
		return nil
	}
	_, err = fmt.Fprint(c.App.Writer, script.Print(mod))
	return err
}
