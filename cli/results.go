package cli

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/rpcserver/timer"
)

// ErrRegression is what kiln results compare fails with when B is
// significantly slower than A beyond --threshold.
var ErrRegression = errors.New("significant regression")

func resultsCommand() *ucli.Command {
	tracker := append([]ucli.Flag{trackerFlag("HOST:PORT of the tracker whose results store to read", true)}, connFlags()...)
	filters := append([]ucli.Flag{
		&ucli.StringFlag{Name: "function", Usage: "only results of this function"},
		&ucli.StringFlag{Name: "key", Usage: "only results taken on devices of this key"},
		&ucli.StringSliceFlag{Name: "attr", Usage: "only results whose device has this attribute, NAME=VALUE (as selectors name them: cpu.avx2=true); repeatable"},
		&ucli.StringFlag{Name: "label", Usage: "only results with this label"},
		&ucli.StringFlag{Name: "owner", Usage: "only results this user recorded"},
		&ucli.StringFlag{Name: "source", Usage: "only results of this source: bench, time_evaluator, tune or profile"},
		&ucli.StringFlag{Name: "since", Usage: "only results recorded since then: a duration back from now (24h) or a time (2006-01-02, RFC 3339)"},
		&ucli.IntFlag{Name: "limit", Value: 100, Usage: "at most this many results, newest first (at most 1000)"},
	}, tracker...)
	return &ucli.Command{
		Name:  "results",
		Usage: "list, show, compare and export the timings recorded in a tracker's results store",
		Description: `kiln bench --tracker records every timing it takes in the tracker's results
store (see kiln bench --help): the artifact, function, target, device, kiln's
version, the inputs' shapes, every figure and the validity report, under a
label; kiln bench --profile records each inference's time and each kernel's
within it, which show lists and compare compares kernel by kernel. A result is its recorder's: other users see it only when it was
recorded with --share; the fleet token sees every result.

compare A B compares two results, or two labels (every result with the
label, pooled per function), per function and per kernel: the ratio of the
medians B/A with its 95% confidence interval (bootstrap), the Mann–Whitney U
test's two-sided p-value, and a verdict: slower or faster when p < 0.05 and
the ratio is beyond 1 ± --threshold, else no difference. It fails (exit
status 1) when anything is slower, so a CI pipeline can gate on it.

Examples:
   kiln results list --tracker 127.0.0.1:9190 --label pr-123
   kiln results show r-1a2b3c4d5e6f7a8b --tracker 127.0.0.1:9190
   kiln results compare main pr-123 --tracker 127.0.0.1:9190 --threshold 3%
   kiln results export --tracker 127.0.0.1:9190 --csv --since 168h > results.csv`,
		Subcommands: []*ucli.Command{
			{
				Name: "list", Usage: "list recorded results, newest first",
				UsageText: "kiln results list --tracker HOST:PORT [--function F] [--key K] [--attr NAME=VALUE]... [--label L] [--since 24h] [--json]",
				Flags:     append(filters, &ucli.BoolFlag{Name: "json", Usage: "print one JSON object"}),
				Action:    runResultsList, OnUsageError: usageError,
			},
			{
				Name: "show", Usage: "show one result with every figure and its validity report",
				UsageText: "kiln results show ID --tracker HOST:PORT [--json]",
				Flags:     append(slices.Clone(tracker), &ucli.BoolFlag{Name: "json", Usage: "print the result as JSON"}),
				Action:    runResultsShow, OnUsageError: usageError,
			},
			{
				Name: "compare", Usage: "compare two results or two labels; fails on a significant regression",
				UsageText: "kiln results compare A B --tracker HOST:PORT [--threshold 2%] [--json]",
				Flags: append(slices.Clone(tracker),
					&ucli.StringFlag{Name: "threshold", Value: "2%", Usage: "a ratio within 1 ± this is no difference, whatever the test says"},
					&ucli.BoolFlag{Name: "json", Usage: "print the comparisons as JSON"}),
				Action: runResultsCompare, OnUsageError: usageError,
			},
			{
				Name: "export", Usage: "write the results that pass the filters as CSV or JSON lines",
				UsageText: "kiln results export --tracker HOST:PORT (--csv | --json) [filters]",
				Flags: append(slices.Clone(filters),
					&ucli.BoolFlag{Name: "csv", Usage: "one CSV row a result, the figures joined by ';'"},
					&ucli.BoolFlag{Name: "json", Usage: "one JSON object a line"}),
				Action: runResultsExport, OnUsageError: usageError,
			},
		},
	}
}

func dialResults(c *ucli.Context) (*client.Tracker, error) {
	tok, tlsCfg, err := clientAuth(c)
	if err != nil {
		return nil, err
	}
	return client.DialTracker(c.Context, c.String("tracker"), client.TrackerOptions{Token: tok, TLS: tlsCfg})
}

// parseSince takes a duration back from now or a time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("--since %q: want a duration (24h) or a time (2006-01-02, RFC 3339)", s)
}

func listArgs(c *ucli.Context) (proto.ResultListArgs, error) {
	a := proto.ResultListArgs{Function: c.String("function"), DeviceKey: c.String("key"), Label: c.String("label"), Owner: c.String("owner"),
		Source: c.String("source"), Limit: c.Int("limit")}
	sources := []string{proto.ResultSourceBench, proto.ResultSourceTimer, proto.ResultSourceTune, proto.ResultSourceProfile}
	if a.Source != "" && !slices.Contains(sources, a.Source) {
		return a, fmt.Errorf("--source %q: want one of %s", a.Source, strings.Join(sources, ", "))
	}
	for _, kv := range c.StringSlice("attr") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return a, fmt.Errorf("--attr %q: want NAME=VALUE", kv)
		}
		if a.Attrs == nil {
			a.Attrs = map[string]string{}
		}
		a.Attrs[k] = v
	}
	var err error
	a.Since, err = parseSince(c.String("since"), time.Now())
	return a, err
}

func runResultsList(c *ucli.Context) error {
	if err := noArgs(c); err != nil {
		return err
	}
	a, err := listArgs(c)
	if err != nil {
		return fmt.Errorf("results list: %w", err)
	}
	tr, err := dialResults(c)
	if err != nil {
		return fmt.Errorf("results list: %w", err)
	}
	defer tr.Close()
	l, err := tr.ListResults(c.Context, a)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return json.NewEncoder(c.App.Writer).Encode(l)
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tRECORDED\tOWNER\tLABEL\tFUNCTION\tKEY\tNODE\tMEDIAN\tN\tVERDICT")
	for _, r := range l.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", r.ID, r.Recorded.Local().Format("2006-01-02 15:04:05"), dash(r.Owner), dash(r.Label),
			r.Function, dash(r.DeviceKey), dash(r.NodeID), fmtSeconds(r.Time.Median), len(r.Time.Results), verdictOf(r))
	}
	tw.Flush()
	if l.Total > len(l.Results) {
		fmt.Fprintf(c.App.Writer, "%d of %d results (--limit)\n", len(l.Results), l.Total)
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func verdictOf(r proto.Result) string {
	if r.Time.Report == nil {
		return "-"
	}
	return r.Time.Report.Verdict
}

func runResultsShow(c *ucli.Context) error {
	if c.NArg() != 1 {
		return fmt.Errorf("results show: want one result id, got %d arguments", c.NArg())
	}
	tr, err := dialResults(c)
	if err != nil {
		return fmt.Errorf("results show: %w", err)
	}
	defer tr.Close()
	r, err := tr.GetResult(c.Context, c.Args().First())
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return json.NewEncoder(c.App.Writer).Encode(r)
	}
	w := c.App.Writer
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, dash(v)) }
	row("id", r.ID)
	row("recorded", r.Recorded.Local().Format(time.RFC3339))
	row("owner", r.Owner)
	row("shared", strconv.FormatBool(r.Shared))
	row("label", r.Label)
	row("source", r.Source)
	row("function", r.Function)
	row("artifact", r.Artifact)
	row("target", r.Target)
	row("device", fmt.Sprintf("key %s, node %s", dash(r.DeviceKey), dash(r.NodeID)))
	row("attributes", formatAttrs(r.DeviceAttrs))
	row("kiln", r.KilnVersion)
	row("inputs", strings.Join(r.Inputs, " "))
	tw.Flush()
	fmt.Fprintf(w, "%d repeats of %d calls: mean %s  median %s  min %s  max %s  std %s\n", len(r.Time.Results), r.Time.Number,
		fmtSeconds(r.Time.Mean), fmtSeconds(r.Time.Median), fmtSeconds(r.Time.Min), fmtSeconds(r.Time.Max), fmtSeconds(r.Time.Std))
	figs := make([]string, len(r.Time.Results))
	for i, x := range r.Time.Results {
		figs[i] = fmtSeconds(x)
	}
	fmt.Fprintln(w, "figures: "+strings.Join(figs, " "))
	if r.Time.Report != nil {
		printReport(w, r.Time.Report)
	}
	printResultKernels(w, r)
	return nil
}

// printResultKernels lists a result's kernels: each one's median, its
// share of the kernels' medians, its calls and model operators, where
// the result says them.
func printResultKernels(w io.Writer, r proto.Result) {
	if len(r.Kernels) == 0 {
		return
	}
	per := "PER CALL"
	if r.Source == proto.ResultSourceProfile {
		per = "PER INFERENCE"
	}
	medians := make([]float64, len(r.Kernels))
	var sum float64
	for i, k := range r.Kernels {
		medians[i] = medianOf(k.Results)
		sum += medians[i]
	}
	fmt.Fprintf(w, "%d kernels (medians %s):\n", len(r.Kernels), strings.ToLower(per))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "KERNEL\t%s\tSHARE\tN\tCALLS\tOPERATORS\n", per)
	for i, k := range r.Kernels {
		share := "-"
		if sum > 0 {
			share = fmt.Sprintf("%.1f%%", 100*medians[i]/sum)
		}
		calls := "-"
		if k.Calls > 0 {
			calls = strconv.FormatInt(k.Calls, 10)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", k.Name, fmtSeconds(medians[i]), share, len(k.Results), calls, dash(strings.Join(k.Ops, ", ")))
	}
	tw.Flush()
}

func formatAttrs(a proto.NodeAttrs) string {
	flat := a.Flatten()
	keys := slices.Sorted(maps.Keys(flat))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + flat[k]
	}
	return strings.Join(parts, " ")
}

func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// resultSet is what a compare argument names: one result, or every
// result with a label.
func resultSet(c *ucli.Context, tr *client.Tracker, name string) ([]proto.Result, error) {
	r, err := tr.GetResult(c.Context, name)
	if err == nil {
		return []proto.Result{r}, nil
	}
	if !errors.Is(err, proto.ErrNotFound) {
		return nil, err
	}
	l, lerr := tr.ListResults(c.Context, proto.ResultListArgs{Label: name})
	if lerr != nil {
		return nil, lerr
	}
	if len(l.Results) == 0 {
		return nil, fmt.Errorf("%q is neither a result id nor a label of results you may see: %w", name, proto.ErrNotFound)
	}
	return l.Results, nil
}

// comparison is one line of kiln results compare.
type comparison = client.ResultComparison

func runResultsCompare(c *ucli.Context) error {
	if c.NArg() != 2 {
		return fmt.Errorf("results compare: want two result ids or labels, A (the baseline) and B, got %d arguments", c.NArg())
	}
	threshold, err := parseShare(c.String("threshold"))
	if err != nil {
		return fmt.Errorf("results compare: --threshold: %w", err)
	}
	tr, err := dialResults(c)
	if err != nil {
		return fmt.Errorf("results compare: %w", err)
	}
	defer tr.Close()
	nameA, nameB := c.Args().Get(0), c.Args().Get(1)
	setA, err := resultSet(c, tr, nameA)
	if err != nil {
		return fmt.Errorf("results compare: A: %w", err)
	}
	setB, err := resultSet(c, tr, nameB)
	if err != nil {
		return fmt.Errorf("results compare: B: %w", err)
	}
	cmps, onlyOne := client.CompareResults(setA, setB, threshold)
	var slower []string
	for _, x := range cmps {
		if x.Verdict == timer.Slower {
			slower = append(slower, x.Name())
		}
	}
	if c.Bool("json") {
		if err := json.NewEncoder(c.App.Writer).Encode(struct {
			A           string       `json:"a"`
			B           string       `json:"b"`
			Threshold   float64      `json:"threshold"`
			Comparisons []comparison `json:"comparisons"`
			Unmatched   []string     `json:"unmatched,omitempty"`
		}{nameA, nameB, threshold, cmps, onlyOne}); err != nil {
			return err
		}
	} else {
		printComparisons(c.App.Writer, cmps, onlyOne)
	}
	if len(cmps) == 0 {
		return fmt.Errorf("results compare: %s and %s have no function in common", nameA, nameB)
	}
	if len(slower) > 0 {
		return fmt.Errorf("results compare: %s is slower than %s beyond ±%s: %s: %w", nameB, nameA, timer.Percent(threshold), strings.Join(slower, ", "), ErrRegression)
	}
	return nil
}

func printComparisons(w io.Writer, cmps []comparison, onlyOne []string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FUNCTION\tKERNEL\tA MEDIAN\tB MEDIAN\tB/A\t95% CI\tP\tVERDICT")
	for _, x := range cmps {
		fmt.Fprintf(tw, "%s\t%s\t%s (n=%d)\t%s (n=%d)\t%s\t%s\t%s\t%s\n", x.Function, dash(x.Kernel),
			fmtSeconds(x.MedianA), x.NA, fmtSeconds(x.MedianB), x.NB, fmtRatio(x.Ratio),
			fmtRatio(x.RatioLow)+"–"+fmtRatio(x.RatioHigh), fmtP(x.P, x.Exact), x.Verdict)
	}
	tw.Flush()
	if len(onlyOne) > 0 {
		fmt.Fprintln(w, "only on one side: "+strings.Join(onlyOne, ", "))
	}
}

func fmtRatio(r float64) string {
	if r != r { // NaN: a median of zero
		return "-"
	}
	return strconv.FormatFloat(r, 'f', 3, 64)
}

func fmtP(p float64, exact bool) string {
	s := strconv.FormatFloat(p, 'g', 3, 64)
	if exact {
		s += " (exact)"
	}
	return s
}

func runResultsExport(c *ucli.Context) error {
	if err := noArgs(c); err != nil {
		return err
	}
	if c.Bool("csv") == c.Bool("json") {
		return errors.New("results export: give one of --csv and --json")
	}
	a, err := listArgs(c)
	if err != nil {
		return fmt.Errorf("results export: %w", err)
	}
	if !c.IsSet("limit") {
		a.Limit = 1000
	}
	tr, err := dialResults(c)
	if err != nil {
		return fmt.Errorf("results export: %w", err)
	}
	defer tr.Close()
	l, err := tr.ListResults(c.Context, a)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		for _, r := range l.Results {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	return writeResultsCSV(c.App.Writer, l.Results)
}

// resultsCSVHeader names writeResultsCSV's columns; times are in seconds.
var resultsCSVHeader = []string{"id", "recorded", "owner", "label", "source", "function", "target", "device_key", "node_id",
	"kiln_version", "artifact", "inputs", "n", "number", "mean", "median", "min", "max", "std", "verdict", "reason", "results"}

func writeResultsCSV(w io.Writer, rs []proto.Result) error {
	cw := csv.NewWriter(w)
	cw.Write(resultsCSVHeader)
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	for _, r := range rs {
		figs := make([]string, len(r.Time.Results))
		for i, x := range r.Time.Results {
			figs[i] = f(x)
		}
		verdict, reason := "", ""
		if r.Time.Report != nil {
			verdict, reason = r.Time.Report.Verdict, r.Time.Report.Reason
		}
		cw.Write([]string{r.ID, r.Recorded.UTC().Format(time.RFC3339Nano), r.Owner, r.Label, r.Source, r.Function, r.Target, r.DeviceKey, r.NodeID,
			r.KilnVersion, r.Artifact, strings.Join(r.Inputs, ";"), strconv.Itoa(len(r.Time.Results)), strconv.Itoa(r.Time.Number),
			f(r.Time.Mean), f(r.Time.Median), f(r.Time.Min), f(r.Time.Max), f(r.Time.Std), verdict, reason, strings.Join(figs, ";")})
	}
	cw.Flush()
	return cw.Error()
}
