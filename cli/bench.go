package cli

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

func benchCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "bench",
		Usage:     "time one function of a .kiln artifact with the time evaluator, here or on a leased device",
		UsageText: "kiln bench ARTIFACT --func NAME [--input NAME=FILE.npy]... [--number N --repeat R --min-repeat-ms M --cooldown-ms C --cache-flush-bytes B] [--json] [--tracker HOST:PORT --key KEY]",
		Description: `Runs TVM's time evaluator on the function: one untimed warm-up call, then
--repeat measurements; in each, the number of calls grows (x1.618, or to reach
--min-repeat-ms) until the batch lasts at least --min-repeat-ms, and the
figure is the batch's mean seconds per call. Tensors not given with --input
are allocated zero-filled (kiln run wants the inputs, or --allow-missing).
Prints every repeat and the statistics (mean,
median, min, max, std, number); with --json one object:
   {"results": [s, ...], "mean": s, "median": s, "min": s, "max": s, "std": s, "number": n, "device": "cpu:0"}

With --tracker the evaluator runs on the leased device itself, so the RPC round
trip is not in the figures. An artifact built for cuda is timed on the GPU
(this machine's, or a leased device daemon's with a CUDA device), each repeat
between two CUDA events on the default stream; --cache-flush-bytes is refused
there. A device whose daemon runs under an emulator
(kiln rpcserver --emulated, or a qemu --worker-wrapper) adds
"emulated": "qemu-aarch64" to the object, and a note to the table: such
times are the emulator's, not the board's.

Examples:
   kiln bench matmul.kiln --func matmul --repeat 10 --min-repeat-ms 100
   kiln bench matmul.kiln --func matmul --tracker 127.0.0.1:9190 --key cpu --json`,
		Flags: append(callFlags(), append([]ucli.Flag{
			&ucli.IntFlag{Name: "number", Value: 1, Usage: "calls per measurement to start with"},
			&ucli.IntFlag{Name: "repeat", Value: 5, Usage: "measurements (one figure each)"},
			&ucli.IntFlag{Name: "min-repeat-ms", Value: 100, Usage: "shortest a measurement may last, in ms"},
			&ucli.IntFlag{Name: "cooldown-ms", Usage: "pause between repeats, in ms"},
			&ucli.IntFlag{Name: "repeats-to-cooldown", Value: 1, Usage: "repeats between pauses"},
			&ucli.Int64Flag{Name: "cache-flush-bytes", Usage: "flush the caches with a copy of this many bytes before each measurement"},
			&ucli.BoolFlag{Name: "json", Usage: "print one JSON object instead of the table"},
		}, remoteFlags()...)...),
		OnUsageError: usageError,
		Action:       runBench,
	}
}

func runBench(c *ucli.Context) error {
	path, a, fi, call, err := loadCall(c, "bench")
	if err != nil {
		return err
	}
	o := proto.TimeOptions{
		Number: c.Int("number"), Repeat: c.Int("repeat"), MinRepeatMS: c.Int("min-repeat-ms"),
		CooldownIntervalMS: c.Int("cooldown-ms"), RepeatsToCooldown: c.Int("repeats-to-cooldown"),
		CacheFlushBytes: c.Int64("cache-flush-bytes"),
	}
	if o.Number < 1 || o.Repeat < 1 || o.MinRepeatMS < 0 || o.CooldownIntervalMS < 0 || o.CacheFlushBytes < 0 {
		return fmt.Errorf("bench: --number and --repeat must be at least 1; --min-repeat-ms, --cooldown-ms and --cache-flush-bytes not negative")
	}
	r, err := openRunner(c, path, a, fi)
	if err != nil {
		return fmt.Errorf("bench %s: %w", path, err)
	}
	defer r.close()
	spin := startProgress(c, "timing "+call.fn.Name+" on "+r.where())
	ctx, cancel := stepContext(c)
	res, err := r.time(ctx, call, o)
	cancel()
	spin.done()
	if err != nil {
		return fmt.Errorf("bench %s: %w", path, err)
	}
	if c.Bool("json") {
		return json.NewEncoder(c.App.Writer).Encode(res)
	}
	w := c.App.Writer
	fmt.Fprintf(w, "%s on %s: %d repeats of %d calls\n", fi.Name, r.where(), len(res.Results), res.Number)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "REPEAT\tPER CALL\t")
	for i, x := range res.Results {
		fmt.Fprintf(tw, "%d\t%s\t\n", i+1, fmtSeconds(x))
	}
	tw.Flush()
	fmt.Fprintf(w, "mean %s  median %s  min %s  max %s  std %s\n",
		fmtSeconds(res.Mean), fmtSeconds(res.Median), fmtSeconds(res.Min), fmtSeconds(res.Max), fmtSeconds(res.Std))
	if res.Emulated != "" {
		fmt.Fprintf(w, "note: the device runs under %s: these are emulated times, not the board's performance\n", res.Emulated)
	}
	return nil
}

// fmtSeconds prints a duration in seconds with a readable unit.
func fmtSeconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%.1fns", s*1e9)
	case d < time.Millisecond:
		return fmt.Sprintf("%.3fµs", s*1e6)
	case d < time.Second:
		return fmt.Sprintf("%.3fms", s*1e3)
	}
	return fmt.Sprintf("%.3fs", s)
}
