package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/rpcserver/timer"
)

func benchCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "bench",
		Usage:     "time one function of a .kiln artifact with the time evaluator, here or on a leased device",
		UsageText: "kiln bench ARTIFACT --func NAME [--input NAME=FILE.npy]... [--number N --repeat R --min-repeat-ms M --cooldown-ms C --cache-flush-bytes B] [--stable-within P%] [--until-stable [--max-time D]] [--json] [--profile [--rounds N] [--trace FILE]] [--tracker HOST:PORT --key KEY [--label L] [--share] [--record=false]]",
		Description: `Runs TVM's time evaluator on the function: one untimed warm-up call, then
--repeat measurements; in each, the number of calls grows (x1.618, or to reach
--min-repeat-ms) until the batch lasts at least --min-repeat-ms, and the
figure is the batch's mean seconds per call. Tensors not given with --input
are allocated zero-filled (kiln run wants the inputs, or --allow-missing).
Prints every repeat and the statistics (mean,
median, min, max, std, number); with --json one object:
   {"results": [s, ...], "mean": s, "median": s, "min": s, "max": s, "std": s, "number": n, "device": "cpu:0", "report": {...}}

Every timing carries a validity report, computed on the device next to the
figures: the spread (coefficient of variation, min, median, max, the number
of samples, the median's distribution-free 95% confidence interval), the
machine's state while it ran (load average, CPU frequency and governor and
thermal zone temperatures where the board exposes them, other sessions on
the device, emulated or not) and a verdict: "stable" when the median's
interval is within --stable-within (2%) of it, else "noisy" with the reason.
At least 6 repeats are needed for an interval. --until-stable runs batches
of --repeat repeats, pooling their figures, until the verdict is stable or
the next batch would pass --max-time, and says which; the object then has
"until_stable": {"stable": bool, "batches": n, "seconds": s}.

With --tracker the evaluator runs on the leased device itself, so the RPC round
trip is not in the figures. An artifact built for cuda is timed on the GPU
(this machine's, or a leased device daemon's with a CUDA device), each repeat
between two CUDA events on the default stream; --cache-flush-bytes is refused
there. A device whose daemon runs under an emulator
(kiln rpcserver --emulated, or a qemu --worker-wrapper) adds
"emulated": "qemu-aarch64" to the object, and a note to the table: such
times are the emulator's, not the board's.

With --tracker the timing is recorded in the tracker's results store (turn
that off with --record=false): the artifact's sha256, the function, target,
device key, node and attributes, kiln's version, the inputs' shapes, every
figure and the validity report, under --label; the output says its id and
--json adds "recorded": ID. It is yours: other users see it with --share.
kiln results lists, shows, compares and exports recorded results.

With --profile (a graph-level artifact, such as an ONNX model's), kiln bench
profiles the graph function instead, where it runs (on the leased device with
--tracker): --rounds inferences after two warm-ups, every kernel call timed.
It prints each kernel's time per inference (the median call times its calls,
steadier on a shared machine than the mean), its share, its calls per
inference and the model operators it computes (ONNX node names and op types,
carried through fusion), the most expensive first, then the kernels' sum beside
the whole model's median inference (the difference is the VM's own work).
--json prints the profile as one object; --trace FILE writes the calls of one
inference as Chrome trace-event JSON, which Perfetto and chrome://tracing open.

Examples:
   kiln bench matmul.kiln --func matmul --repeat 10 --min-repeat-ms 100
   kiln bench matmul.kiln --func matmul --repeat 10 --until-stable --max-time 30s --stable-within 1%
   kiln bench matmul.kiln --func matmul --tracker 127.0.0.1:9190 --key cpu --json
   kiln bench model.kiln --input x=x.npy --profile --trace model.trace.json`,
		Flags: append(callFlags(), append([]ucli.Flag{
			&ucli.IntFlag{Name: "number", Value: 1, Usage: "calls per measurement to start with"},
			&ucli.IntFlag{Name: "repeat", Value: 5, Usage: "measurements (one figure each)"},
			&ucli.IntFlag{Name: "min-repeat-ms", Value: 100, Usage: "shortest a measurement may last, in ms"},
			&ucli.IntFlag{Name: "cooldown-ms", Usage: "pause between repeats, in ms"},
			&ucli.IntFlag{Name: "repeats-to-cooldown", Value: 1, Usage: "repeats between pauses"},
			&ucli.Int64Flag{Name: "cache-flush-bytes", Usage: "flush the caches with a copy of this many bytes before each measurement"},
			&ucli.StringFlag{Name: "stable-within", Value: "2%", Usage: "the verdict is stable when the median's 95% confidence interval is within this share of it"},
			&ucli.BoolFlag{Name: "until-stable", Usage: "repeat batches of --repeat repeats, pooling them, until the verdict is stable or --max-time"},
			&ucli.DurationFlag{Name: "max-time", Value: 30 * time.Second, Usage: "with --until-stable: the time the batches may take"},
			&ucli.BoolFlag{Name: "json", Usage: "print one JSON object instead of the table"},
		}, append(append(remoteFlags(), recordFlags()...), profileFlags()...)...)...),
		OnUsageError: usageError,
		Action:       runBench,
	}
}

func runBench(c *ucli.Context) error {
	if err := checkRecordFlags(c); err != nil {
		return err
	}
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
	if o.StableWithin, err = parseShare(c.String("stable-within")); err != nil {
		return fmt.Errorf("bench: --stable-within: %w", err)
	}
	if c.Bool("until-stable") && c.Duration("max-time") <= 0 {
		return fmt.Errorf("bench: --max-time must be positive")
	}
	r, err := openRunner(c, path, a, fi)
	if err != nil {
		return fmt.Errorf("bench %s: %w", path, err)
	}
	defer r.close()
	if c.Bool("profile") || c.IsSet("trace") {
		return runProfile(c, path, a, r, call)
	}
	spin := startProgress(c, "timing "+call.fn.Name+" on "+r.where())
	res, until, err := benchTime(c, r, call, o)
	spin.done()
	if err != nil {
		return fmt.Errorf("bench %s: %w", path, err)
	}
	recorded, recErr := recordBench(c, path, a, call, r, res)
	if recErr != nil {
		recErr = fmt.Errorf("bench %s: timed, but not recorded: %w", path, recErr)
	}
	if c.Bool("json") {
		if err := json.NewEncoder(c.App.Writer).Encode(struct {
			proto.TimeResult
			UntilStable *untilStable `json:"until_stable,omitempty"`
			Recorded    string       `json:"recorded,omitempty"`
		}{res, until, recorded}); err != nil {
			return err
		}
		return recErr
	}
	defer func() {
		if recorded != "" {
			fmt.Fprintf(c.App.Writer, "recorded as %s (kiln results show %s)\n", recorded, recorded)
		}
	}()
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
	if res.Report != nil {
		printReport(w, res.Report)
	}
	if until != nil {
		batches := fmt.Sprintf("%d batches", until.Batches)
		if until.Batches == 1 {
			batches = "1 batch"
		}
		if until.Stable {
			fmt.Fprintf(w, "until stable: stable after %s (%d repeats) in %.1fs\n", batches, len(res.Results), until.Seconds)
		} else {
			fmt.Fprintf(w, "until stable: not stable within --max-time %s (%s, %d repeats in %.1fs)\n", c.Duration("max-time"), batches, len(res.Results), until.Seconds)
		}
	}
	if res.Emulated != "" {
		fmt.Fprintf(w, "note: the device runs under %s: these are emulated times, not the board's performance\n", res.Emulated)
	}
	return recErr
}

// untilStable says how kiln bench --until-stable ended.
type untilStable struct {
	// Stable is true when the pooled timing's verdict is stable, false
	// when --max-time ended the batches first.
	Stable  bool    `json:"stable"`
	Batches int     `json:"batches"`
	Seconds float64 `json:"seconds"`
}

// benchTime runs the timing; with --until-stable, batches of it pooled
// until the verdict is stable or the next batch, taking as long as the
// batches so far on average, would end past --max-time.
func benchTime(c *ucli.Context, r runner, call *preparedCall, o proto.TimeOptions) (proto.TimeResult, *untilStable, error) {
	start := time.Now()
	batch := func() (proto.TimeResult, error) {
		ctx, cancel := stepContext(c)
		defer cancel()
		return r.time(ctx, call, o)
	}
	res, err := batch()
	if err != nil || !c.Bool("until-stable") {
		return res, nil, err
	}
	u := &untilStable{Batches: 1}
	for res.Report == nil || res.Report.Verdict != proto.VerdictStable {
		took := time.Since(start)
		if took+took/time.Duration(u.Batches) > c.Duration("max-time") {
			break
		}
		// The calls per measurement the last batch grew to are where the
		// next one starts.
		o.Number = max(o.Number, res.Number)
		next, err := batch()
		if err != nil {
			return proto.TimeResult{}, nil, err
		}
		res = timer.Pool(o.StableWithin, res, next)
		u.Batches++
	}
	u.Stable = res.Report != nil && res.Report.Verdict == proto.VerdictStable
	u.Seconds = time.Since(start).Seconds()
	return res, u, nil
}

// parseShare parses a share given in percent ("2%", "0.5%" or "2").
func parseShare(s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(s), "%")), 64)
	if err != nil || v <= 0 || v >= 100 {
		return 0, fmt.Errorf("%q is not a percentage above 0 and below 100 (e.g. 2%%)", s)
	}
	return v / 100, nil
}

// printReport prints a timing's validity report: its spread, the
// machine's state and the verdict.
func printReport(w io.Writer, rep *proto.TimeReport) {
	spread := fmt.Sprintf("spread: cv %s, min %s, median %s, max %s (n=%d)",
		timer.Percent(rep.CV), fmtSeconds(rep.Min), fmtSeconds(rep.Median), fmtSeconds(rep.Max), rep.N)
	if rep.N >= timer.MinSamples {
		spread += fmt.Sprintf("; median's 95%% CI %s–%s (±%s)", fmtSeconds(rep.CILow), fmtSeconds(rep.CIHigh), timer.Percent(rep.CIHalf))
	}
	fmt.Fprintln(w, spread)
	fmt.Fprintln(w, "machine: "+describeMachine(rep.Machine))
	if rep.Verdict == proto.VerdictStable {
		fmt.Fprintf(w, "verdict: stable (median's 95%% CI within ±%s)\n", timer.Percent(rep.StableWithin))
	} else {
		fmt.Fprintf(w, "verdict: %s: %s\n", rep.Verdict, rep.Reason)
	}
}

// describeMachine says a machine state in one line.
func describeMachine(m proto.MachineState) string {
	var parts []string
	if !slices.Contains(m.Unread, "load average") {
		parts = append(parts, fmt.Sprintf("load average %.2f on %d CPUs", m.LoadAvg, m.CPUs))
	}
	if m.FreqMaxMHz > 0 {
		f := fmt.Sprintf("CPU %.2f–%.2f GHz", m.FreqMinMHz/1000, m.FreqMaxMHz/1000)
		if len(m.Governors) > 0 {
			f += " (governor " + strings.Join(m.Governors, ", ") + ")"
		}
		parts = append(parts, f)
	}
	if len(m.TempsC) > 0 {
		hot := ""
		for _, z := range slices.Sorted(maps.Keys(m.TempsC)) {
			if hot == "" || m.TempsC[z] > m.TempsC[hot] {
				hot = z
			}
		}
		parts = append(parts, fmt.Sprintf("hottest %s %.0f°C", hot, m.TempsC[hot]))
	}
	switch m.OtherSessions {
	case 1:
		parts = append(parts, "1 other session")
	default:
		parts = append(parts, fmt.Sprintf("%d other sessions", m.OtherSessions))
	}
	if m.Emulated != "" {
		parts = append(parts, "emulated ("+m.Emulated+")")
	} else {
		parts = append(parts, "not emulated")
	}
	if len(m.Unread) > 0 {
		parts = append(parts, "not readable: "+strings.Join(m.Unread, ", "))
	}
	return strings.Join(parts, "; ")
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
