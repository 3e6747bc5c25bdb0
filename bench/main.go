// Command bench runs kiln's benchmarks: go run ./bench <name> [--json] [--quick].
//
// Each benchmark lives in its own file and registers itself from init with
// register; it returns a result that prints as one JSON object (--json) or
// one readable line. Benchmarks measure; they never assert timings.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime/pprof"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
)

// benchmark is one entry of the registry.
type benchmark struct {
	name    string // the command-line name
	summary string // one line for the list
	// run measures. quick asks for a tiny configuration that only checks the
	// benchmark works (tests use it); figures from it mean nothing.
	run func(ctx context.Context, opt options) (result, error)
}

// options are what every benchmark receives.
type options struct {
	quick bool
	// model picks the model of the onnx benchmark (--model).
	model string
	// trials is the tune benchmark's budget (--trials; 0: its default).
	trials int
	// part picks a part of the tune benchmark (--part): "scaling" (the
	// matmul's search, then the devices' throughput with 1 and 2
	// daemons) or "others" (the convolution and the softmax alone); ""
	// runs all of it.
	part string
	// kernels, when not nil, receives the onnx benchmark's time per
	// kernel (--kernels).
	kernels io.Writer
	// contention also times the onnx benchmark's models beside CPU-bound
	// processes (--contention).
	contention bool
	// target is the CPU the matmul, onnx and tune benchmarks build for
	// (--target; "": the host), see benchTarget.
	target string
}

// result is a benchmark's report. It marshals to one JSON object that has
// a "name" field; Line renders it for people.
type result interface {
	Line() string
}

var registry = map[string]benchmark{}

// register adds a benchmark; a duplicate name is a broken build.
func register(b benchmark) {
	if _, dup := registry[b.name]; dup {
		panic(fmt.Sprintf("bench: benchmark %q registered twice", b.name))
	}
	registry[b.name] = b
}

func names() []string {
	out := make([]string, 0, len(registry))
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

// run parses args (flags may come before or after the benchmark's name),
// runs one benchmark and writes its result to stdout.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print one JSON object instead of a readable line")
	quick := fs.Bool("quick", false, "tiny configuration that only checks the benchmark runs (figures are meaningless)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the benchmark to this file (for go tool pprof)")
	model := fs.String("model", "", "the onnx benchmark's model: resnet18, mobilenet_v2, squeezenet1_1, transformer or all (default all)")
	contention := fs.Bool("contention", false, "the onnx benchmark: also time each model (kiln and ONNX Runtime alike) beside one and two CPU-bound processes, and in one of two sessions on one device daemon")
	perKernel := fs.Bool("kernels", false, "the onnx benchmark: also print kiln's time per kernel of each model to stderr, the most expensive first")
	trials := fs.Int("trials", 0, "the tune benchmark's trial budget for the matmul (default 256; the convolutions and the softmax get an eighth)")
	part := fs.String("part", "", "the tune benchmark: only this part: scaling (the matmul's search, then trials per minute with 1 and 2 daemons) or others (the convolution, the depthwise convolution and the softmax, --trials each)")
	target := fs.String("target", "", benchTargetHelp)
	fs.Usage = func() { usage(fs) }
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		// Without a name, the list of benchmarks is the answer.
		fs.SetOutput(stdout)
		usage(fs)
		return nil
	}
	name := fs.Arg(0)
	if err := fs.Parse(fs.Args()[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q after benchmark %q", fs.Arg(0), name)
	}
	b, ok := registry[name]
	if !ok {
		return fmt.Errorf("unknown benchmark %q (have %s)", name, strings.Join(names(), ", "))
	}
	if *cpuProfile != "" {
		stopProfile, err := startCPUProfile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stopProfile()
	}
	opt := options{quick: *quick, model: *model, trials: *trials, part: *part, contention: *contention, target: *target}
	if *perKernel {
		opt.kernels = stderr
	}
	res, err := b.run(ctx, opt)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(res); err != nil {
			return fmt.Errorf("%s: write result: %w", name, err)
		}
		return nil
	}
	_, err = fmt.Fprintln(stdout, res.Line())
	return err
}

func usage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprintf(w, "usage: go run ./bench <name> [--json] [--quick]\n\nbenchmarks:\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, n := range names() {
		fmt.Fprintf(tw, "  %s\t%s\n", n, registry[n].summary)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nflags:\n")
	fs.PrintDefaults()
}

// startCPUProfile starts a CPU profile written to path; the returned
// function stops it and closes the file.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile %q: %w", path, err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// median returns the median of xs (0 for none); xs is reordered.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	m := len(xs) / 2
	if len(xs)%2 == 1 {
		return xs[m]
	}
	return (xs[m-1] + xs[m]) / 2
}

// round keeps d decimals, so JSON stays readable.
func round(x float64, d int) float64 {
	p := math.Pow(10, float64(d))
	return math.Round(x*p) / p
}
