package cli

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler"
	vmgen "github.com/kiln-ml/kiln/compiler/codegen/vm"
	"github.com/kiln-ml/kiln/compiler/frontend/onnx"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule/auto"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/compiler/tune"
	"github.com/kiln-ml/kiln/compiler/tune/rules"
	"github.com/kiln-ml/kiln/compilernode"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

func buildCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "build",
		Usage:     "compile an IRModule (TVMScript text) into a .kiln artifact, here or on the fleet",
		UsageText: "kiln build FILE [--target cpu] [-o out.kiln] [--tracker HOST:PORT] [--cc CC] [--cflags FLAGS] [--dump-ir after:PASS] [--input-shape NAME=DIMS]",
		Description: `Parses FILE (TVMScript: an @I.ir_module class or @T.prim_func definitions;
or an ONNX model, FILE.onnx, imported into one graph function "main" whose
inputs are named as in the model, with its weights bundled into the
artifact), lowers every PrimFunc, generates C for the kernel ABI, compiles it with the
system C compiler and writes a .kiln artifact (a zip: manifest.json, host.so).
Builds are cached by the IR's structural hash, the target, the C compiler's
identity and the flags (in $XDG_CACHE_HOME/kiln); --no-cache skips the cache.
--dump-ir prints the IR after the named passes: it lowers again instead of
reading the cache, and writes an artifact only when -o is given.

Every function not already scheduled (a parallel, vectorized or unrolled
loop, a thread binding, split or reordered loops, a cache stage: see
docs/first-kernel.md) gets kiln's default schedule, the one a graph's kernels
get; --no-default-schedule builds the functions as written. The build says
which schedule each function got: "default schedule (RULE)",
"unscheduled", "already scheduled (SIGN)", or with --tuning-db the record.

With --tracker the build goes through the fleet: the module is queued at the
tracker, a compiler node builds it, and the artifact is downloaded to -o,
with the job's progress shown as it changes. The --tuning-db of an ONNX
model or of a module with @R.function travels with it (one upload): the
node applies the same records a local build would to the kernels its
pipeline makes. A module of PrimFuncs is sent with the records applied.

Targets: cpu (aliases llvm, c), with -mcpu=NAME, -mtriple=TRIPLE for
cross-compilation and -mattr=+FEATURE,-FEATURE, e.g. --target "cpu
-mtriple=aarch64-linux-gnu -mcpu=cortex-a72" or "cpu
-mtriple=riscv64-linux-gnu -mattr=+v" (vector code as wide as the target's
registers: docs/targets.md); cuda
[-arch=sm_80|sm_86|sm_89|sm_90] for NVIDIA GPUs (needs NVRTC on the building
machine, not a GPU): kernels compiled to PTX and a cubin under device/, and a
host.so that launches them. Functions without a GPU schedule get the default
one.

An ONNX model's symbolic dimensions (a batch "N") must be given with
--input-shape NAME=D1xD2… (one flag per input); a model kiln cannot import
(an operator it does not support, an opset outside 1–21, or below opset 7
an operator whose meaning has changed since) is refused before anything
is built, naming the node, its op type and the opset.

Examples:
   kiln build matmul.py -o matmul.kiln
   kiln build resnet18.onnx -o resnet18.kiln --input-shape input=1x3x224x224
   kiln build matmul.py --dump-ir after:lower_blocks,after:make_packed_api
   kiln build matmul.py --cc clang --cflags "-O2 -march=x86-64-v3"
   kiln build matmul.py --tracker 127.0.0.1:9190 -o matmul.kiln
   kiln build matmul.py --tuning-db tuning.jsonl -o matmul.kiln
   kiln build resnet18.onnx --input-shape input=1x3x224x224 --tuning-db resnet18.jsonl

--tuning-db applies the best record of each kernel (for a module with
@R.function or an ONNX model, each fused kernel the pipeline makes, lowered
as kiln tune lowers it) and says which kernels it found no record for; those
keep the default schedule. A kernel with symbolic
sizes tuned with kiln tune --shape is specialized to the shape it was tuned
for (said on the error writer): the artifact then takes those sizes only.
Records of several shapes need --shape NAME=SIZE to pick one.`,
		Flags: append([]ucli.Flag{
			&ucli.StringFlag{Name: "target", Value: "cpu", Usage: "target string: cpu [-mcpu=NAME] [-mtriple=TRIPLE] [-mattr=+FEATURE,...], or cuda [-arch=sm_NN]"},
			&ucli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "artifact file to write (default: FILE with .kiln)"},
			&ucli.StringFlag{Name: "cc", Usage: "C compiler (default: $CC, then cc); local builds only"},
			&ucli.StringFlag{Name: "cflags", Usage: "C compiler flags replacing the defaults (-O3 -march=native), space separated"},
			&ucli.StringFlag{Name: "dump-ir", Usage: "print the IR after these passes: after:PASS[,after:PASS…] or all (" + strings.Join(transform.PassNames(), ", ") + ")"},
			&ucli.StringFlag{Name: "keep-source", Usage: "directory to keep the generated C source in"},
			&ucli.BoolFlag{Name: "no-cache", Usage: "do not read or write the build cache"},
			&ucli.StringFlag{Name: "pipeline", Usage: "graph-level pipeline for modules with @R.function (default O2; none to skip; zero, O0-O3)"},
			&ucli.StringFlag{Name: "params", Usage: "safetensors file of weights to bundle into the artifact (params.safetensors)"},
			&ucli.StringSliceFlag{Name: "input-shape", Usage: "ONNX models: NAME=D1xD2… fixes the shape of an input with symbolic dims (repeatable)"},
			trackerFlag("HOST:PORT of a tracker: build remotely on a compiler node", false),
			&ucli.BoolFlag{Name: "no-default-schedule", Usage: "build the functions as written: no default schedule for those not already scheduled (CPU)"},
			&ucli.StringFlag{Name: "tuning-db", Usage: "tuning database (JSON lines, from kiln tune): give each kernel its best record's schedule"},
			&ucli.StringSliceFlag{Name: "shape", Usage: "with --tuning-db: NAME=SIZE picks the shape a symbolic kernel is specialized to (repeatable, or comma-separated)"},
			&ucli.DurationFlag{Name: "timeout", Value: 10 * time.Minute, Usage: "give up on a remote build after this long"},
		}, connFlags()...),
		OnUsageError: usageError,
		Action:       runBuild,
	}
}

func runBuild(c *ucli.Context) error {
	if c.NArg() != 1 {
		return fmt.Errorf("build: want one file, got %d arguments (see \"kiln build --help\")", c.NArg())
	}
	path := c.Args().First()
	out := c.String("output")
	if out == "" {
		out = strings.TrimSuffix(path, filepath.Ext(path)) + ".kiln"
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	shapes, err := onnx.ParseInputShapes(c.StringSlice("input-shape"))
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	isModel := onnx.IsModelPath(path)
	if len(shapes) > 0 && !isModel {
		return fmt.Errorf("build: --input-shape is for ONNX models (FILE.onnx)")
	}
	target, err := compiler.ParseTarget(c.String("target"))
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	if len(c.StringSlice("shape")) > 0 && c.String("tuning-db") == "" {
		return fmt.Errorf("build: --shape picks the tuned shape of a symbolic kernel; it needs --tuning-db")
	}
	var applyDB func(*ir.IRModule) (*ir.IRModule, error)
	var layouts func(*compiler.Lowering) (map[string]string, error)
	notes := map[string]string{}
	if p := c.String("tuning-db"); p != "" {
		if applyDB, layouts, err = tuningDBSchedule(c, p, target, notes); err != nil {
			return fmt.Errorf("build: %w", err)
		}
	}
	if c.String("tracker") != "" {
		if applyDB != nil {
			var mod *ir.IRModule
			if !isModel {
				if mod, err = script.Parse(path, string(src)); err != nil {
					return err
				}
			}
			if isModel || vmgen.HasGraphFunctions(mod) {
				// Its kernels come from the import and graph pipeline on
				// the compiler node: the records travel with the model or
				// module, and the node applies them as a local build does.
				db, err := os.ReadFile(c.String("tuning-db"))
				if err != nil {
					return fmt.Errorf("build: --tuning-db: %w", err)
				}
				return buildRemote(c, path, src, out, shapes, db)
			}
			// The compiler node gets the module with the records applied.
			if mod, err = applyDB(mod); err != nil {
				return fmt.Errorf("build: %w", err)
			}
			src = []byte(script.Print(mod))
		}
		return buildRemote(c, path, src, out, shapes, nil)
	}
	st := startStages(c, "build", fmt.Sprintf("building %s for %s", path, target))
	defer st.done()
	var mod *ir.IRModule
	var weights []byte
	if isModel {
		end := st.start("import " + filepath.Base(path))
		if mod, weights, err = onnx.ImportFile(path, onnx.Options{InputShapes: shapes}); err != nil {
			return fmt.Errorf("build: %w", err)
		}
		end()
	} else if mod, err = script.Parse(path, string(src)); err != nil {
		return err
	}
	opts := compiler.BuildOptions{
		CC:                c.String("cc"),
		KeepSource:        c.String("keep-source"),
		NoCache:           c.Bool("no-cache"),
		NoDefaultSchedule: c.Bool("no-default-schedule"),
		Dump:              c.App.Writer,
		Progress:          st.stage,
	}
	if f := c.String("cflags"); f != "" {
		opts.CFlags = strings.Fields(f)
	}
	opts.Pipeline = c.String("pipeline")
	opts.Params = weights
	opts.Schedule, opts.Layouts = applyDB, layouts
	if p := c.String("params"); p != "" {
		if isModel {
			return fmt.Errorf("build: --params: an ONNX model's weights come from the model")
		}
		if opts.Params, err = os.ReadFile(p); err != nil {
			return fmt.Errorf("build: --params: %w", err)
		}
		if _, _, err := ndarray.ReadSafetensors(bytes.NewReader(opts.Params), int64(len(opts.Params))); err != nil {
			return fmt.Errorf("build: --params %s: %w", p, err)
		}
	}
	if d := c.String("dump-ir"); d != "" {
		if opts.DumpIR, err = transform.ParseDumpIR(d); err != nil {
			return fmt.Errorf("build: %w", err)
		}
	}
	res, err := compiler.BuildWithResult(c.Context, mod, target, opts)
	st.done()
	if err != nil {
		return fmt.Errorf("build %s: %w", path, err)
	}
	how := fmt.Sprintf("lowered in %s, compiled in %s", res.Lower.Round(time.Millisecond), res.Compile.Round(time.Millisecond))
	if len(opts.DumpIR) > 0 {
		// A dump is a look at the lowering: it never reads the build cache
		// (the passes must run to be printed), and it leaves an existing
		// artifact alone unless -o asks for one.
		if !c.IsSet("output") {
			fmt.Fprintf(c.App.ErrWriter, "printed the IR (lowered in %s, not from the build cache); no artifact written: give -o FILE to write one\n", res.Lower.Round(time.Millisecond))
			return nil
		}
		how += ", IR dumped, not from the build cache"
	}
	if err := res.Artifact.Save(out); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	if res.Cached {
		how = "from the build cache"
	}
	reportSchedules(c.App.ErrWriter, res.Schedules, notes)
	fmt.Fprintf(c.App.ErrWriter, "built %s: %d function(s) for %s, %s\n", out, len(res.Artifact.Manifest.Functions), target, how)
	return nil
}

// buildRemote queues the module at the tracker, shows the job's progress
// and downloads the artifact. db, when set, is the tuning database of an
// ONNX model or of a TVMScript graph module, bundled with it (see
// compilernode.TunedBundle).
func buildRemote(c *ucli.Context, path string, src []byte, out string, shapes map[string][]int64, db []byte) error {
	ctx := c.Context
	tok, tlsCfg, err := clientAuth(c)
	if err != nil {
		return err
	}
	tr, err := client.DialTracker(ctx, c.String("tracker"), client.TrackerOptions{Token: tok, TLS: tlsCfg})
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	defer tr.Close()
	opts := map[string]string{}
	if c.String("params") != "" {
		return fmt.Errorf("build: --params cannot be sent to a remote build; bundle weights with a local build or pass --params to kiln run")
	}
	if c.String("cc") != "" {
		return fmt.Errorf("build: --cc cannot be sent to a remote build: compiler nodes use their own C compiler")
	}
	if err := compiler.CheckRemoteCFlags(strings.Fields(c.String("cflags"))); err != nil {
		return fmt.Errorf("build: --cflags: %w", err)
	}
	for _, k := range []string{"cflags", "pipeline"} {
		if v := c.String(k); v != "" {
			opts[k] = v
		}
	}
	if c.Bool("no-default-schedule") {
		opts["default-schedule"] = "none"
	}
	args := proto.BuildSubmitArgs{
		Name: filepath.Base(path), Module: string(src), Target: c.String("target"), Options: opts,
		RunTimeout: c.Duration("timeout"),
	}
	model := onnx.IsModelPath(path)
	if model {
		// Import here first, so a model kiln cannot import is refused
		// before it is queued; the compiler node imports the same bytes.
		if _, _, err := onnx.ImportBytes(path, src, onnx.Options{InputShapes: shapes}); err != nil {
			return fmt.Errorf("build: %w", err)
		}
		if len(shapes) > 0 {
			opts["input-shape"] = strings.Join(onnx.FormatInputShapes(shapes), ",")
		}
	}
	if model || db != nil {
		// A model (tens of MB do not fit one frame), or a module with its
		// tuning records, goes through the tracker's artifact store; the
		// job names it by sha256.
		args.Format = "onnx-artifact"
		if !model {
			args.Format = "tvmscript-artifact"
		}
		payload := src
		if db != nil {
			if payload, err = compilernode.TunedBundle(args.Format, src, db); err != nil {
				return fmt.Errorf("build: %w", err)
			}
			opts["tuning-db"] = compilernode.TunedBundleOption
			if sh := c.StringSlice("shape"); len(sh) > 0 {
				opts["shape"] = strings.Join(sh, ",")
			}
		}
		sum := sha256.Sum256(payload)
		sha := hex.EncodeToString(sum[:])
		if err := tr.UploadArtifact(ctx, sha, int64(len(payload)), bytes.NewReader(payload)); err != nil {
			return fmt.Errorf("build: upload the module: %w", err)
		}
		args.Module = sha
	}
	// Each change of the job is a line with the time since it was
	// submitted: queued, claimed by a node, its stages, done.
	st := startStages(c, "build", fmt.Sprintf("building %s on the fleet", path))
	defer st.done()
	node := ""
	var end func()
	job, art, err := tr.Build(ctx, args, func(j proto.BuildJob) {
		st.event(fmt.Sprintf("job %s queued at %s", j.ID, c.String("tracker")))
	}, func(j proto.BuildJob) {
		if j.Node != "" && j.Node != node {
			node = j.Node
			st.event(fmt.Sprintf("job %s claimed by compiler node %s", j.ID, j.Node))
		}
		line := fmt.Sprintf("job %s: %s", j.ID, j.State)
		if j.Node != "" {
			line += " on " + j.Node
		}
		if j.Progress > 0 {
			line += fmt.Sprintf(" %3.0f%%", 100*j.Progress)
		}
		if j.Message != "" {
			line += ": " + j.Message
		}
		if j.State == proto.JobQueued && j.Position > 0 {
			line += fmt.Sprintf(" (position %d in the build queue, ETA %s)", j.Position, fmtETA(j.ETA))
		}
		st.event(line)
		if j.State == proto.JobSucceeded {
			end = st.start(fmt.Sprintf("download the artifact (%s)", humanBytes(j.ArtifactSize)))
		}
	})
	if end != nil {
		end()
	}
	if err != nil {
		return fmt.Errorf("build %s: %w", path, err)
	}
	st.done()
	w := c.App.ErrWriter
	if err := writeFileAtomic(out, art); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	fmt.Fprintf(w, "built %s on %s (%d bytes)\n", out, job.Node, len(art))
	return nil
}

// tuningDBSchedule reads a tuning database for target and returns the
// build hook that applies its best records. It warns on the error writer
// of what it could not use, and notes per kernel where its schedule came
// from (a tuned record, the default schedule as the best record, or no
// record) for reportSchedules. The second hook chooses each
// convolution's kernel layout and each dense layer's weight layout by the
// records (tune.ChooseLayouts), saying which one it took where that is
// not the default.
func tuningDBSchedule(c *ucli.Context, path string, target compiler.Target, notes map[string]string) (func(*ir.IRModule) (*ir.IRModule, error), func(*compiler.Lowering) (map[string]string, error), error) {
	db := tune.NewDatabase(target.String())
	warnings, err := db.Load(path)
	if err != nil {
		return nil, nil, fmt.Errorf("--tuning-db: %w", err)
	}
	w := c.App.ErrWriter
	for _, n := range warnings {
		fmt.Fprintf(w, "build: warning: %s\n", n)
	}
	shape, err := tune.ParseShape(c.StringSlice("shape"))
	if err != nil {
		return nil, nil, err
	}
	rt, err := target.TuneTarget()
	if err != nil {
		return nil, nil, err
	}
	layouts := tune.LayoutChooser(db, rt, shape, func(lc tune.LayoutChoice) {
		if lc.Layout != lc.DefaultLayout {
			how := "by the best records"
			if lc.HeadToHead {
				how = "timed head to head with the default"
			}
			fmt.Fprintf(w, "build: %s: %s %s, %s a run %s in %s (the default %s: %s)\n",
				lc.Site, siteLayout(lc.Site), lc.Layout, fmtSeconds(lc.Seconds), how, path, lc.DefaultLayout, fmtSeconds(lc.DefaultSeconds))
		}
	})
	return func(mod *ir.IRModule) (*ir.IRModule, error) {
		out, applied, err := tune.Apply(mod, db, rt, shape)
		if err != nil {
			return nil, err
		}
		for _, n := range slices.Sorted(maps.Keys(applied.Records)) {
			r := applied.Records[n]
			if sh := applied.Specialized[n]; sh != "" {
				fmt.Fprintf(w, "build: %s: specialized to %s, the shape it was tuned for (it takes those sizes only)\n", n, sh)
			}
			measured := fmt.Sprintf("%s a call when measured", fmtSeconds(r.Median()))
			if r.Schedule == tune.DefaultSchedule {
				// The search found nothing faster than the default
				// schedule: that is what the kernel has.
				notes[n] = fmt.Sprintf("default schedule%s, the best record in %s (%s)", defaultRule(mod.PrimFunc(n), applied.Specialized[n], rt), path, measured)
			} else {
				notes[n] = fmt.Sprintf("tuned, the best record in %s (workload %s, %d decisions, %s)", path, r.Workload.Hash, len(r.Decisions), measured)
			}
		}
		for _, n := range applied.Missing {
			notes[n] = fmt.Sprintf("no record in %s for target %q:", path, target.String())
		}
		return out, nil
	}, layouts, nil
}

// defaultRule is " (RULE)", the default rule that schedules f bound to
// shape (as tune.Apply binds it), or "" when none applies.
func defaultRule(f *ir.PrimFunc, shape string, rt rules.Target) string {
	if shape != "" {
		bind, err := tune.ParseShape([]string{shape})
		if err != nil {
			return ""
		}
		if f, err = tune.Bind(f, bind); err != nil {
			return ""
		}
	}
	if _, rule, err := auto.FuncRule(f, rt.AutoOptions()); err == nil && rule != "" {
		return " (" + rule + ")"
	}
	return ""
}

// maxScheduleLines bounds the per-function schedule lines of a build; a
// module with more functions (an ONNX model's fused kernels) gets one
// line per kind of schedule instead.
const maxScheduleLines = 8

// reportSchedules says on w which schedule each function was built with.
// notes, from tuningDBSchedule, replace the line of a function the
// tuning database gave its schedule (a note ending in ":" is followed
// by the schedule).
func reportSchedules(w io.Writer, scheds []compiler.FuncSchedule, notes map[string]string) {
	var groups []string
	byHow := map[string][]string{}
	for _, s := range scheds {
		how := s.String()
		if n, ok := notes[s.Name]; ok {
			if !strings.HasSuffix(n, ":") {
				fmt.Fprintf(w, "build: %s: %s\n", s.Name, n)
				continue
			}
			fmt.Fprintf(w, "build: %s: %s %s\n", s.Name, n, how)
			continue
		}
		if len(scheds) <= maxScheduleLines {
			fmt.Fprintf(w, "build: %s: %s\n", s.Name, how)
			continue
		}
		if byHow[how] == nil {
			groups = append(groups, how)
		}
		byHow[how] = append(byHow[how], s.Name)
	}
	for _, how := range groups {
		names := byHow[how]
		if len(names) == 1 {
			fmt.Fprintf(w, "build: %s: %s\n", names[0], how)
			continue
		}
		list := strings.Join(names[:min(len(names), 3)], ", ")
		if len(names) > 3 {
			list += fmt.Sprintf(" and %d more", len(names)-3)
		}
		fmt.Fprintf(w, "build: %d functions: %s (%s)\n", len(names), how, list)
	}
}

// writeFileAtomic writes through a temporary file and a rename, so a crash
// never leaves half a file under the name.
func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}

// siteLayout names what a layout site's layout lays out: a dense layer's
// weight, or a convolution's kernel.
func siteLayout(site string) string {
	if strings.HasPrefix(site, "dense ") {
		return "weight layout"
	}
	return "kernel layout"
}
