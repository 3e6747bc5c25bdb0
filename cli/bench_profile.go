package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/load"
)

// profileFlags are kiln bench's flags of a per-kernel profile.
func profileFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.BoolFlag{Name: "profile", Usage: "profile the graph function instead: each kernel's time per inference, its share, calls and the model operators it computes, beside the whole model's time"},
		&ucli.IntFlag{Name: "rounds", Value: 20, Usage: "with --profile: inferences measured (after two warm-ups)"},
		&ucli.StringFlag{Name: "trace", Usage: "with --profile: write the calls of one inference to `FILE` as Chrome trace-event JSON (opens in Perfetto or chrome://tracing)"},
	}
}

// runProfile is kiln bench --profile: the profile is measured where the
// runner runs (on the leased device with --tracker) and printed here;
// one on a leased device is recorded in the tracker's results store as
// kiln bench's timings are (--record, --label, --share).
func runProfile(c *ucli.Context, path string, a *artifact.Artifact, r runner, call *preparedCall) error {
	if !call.vm {
		return fmt.Errorf("bench %s: --profile is for graph-level artifacts (with a VM executable): it times the kernels of a graph function; this one has kernels only, time them with kiln bench --func", path)
	}
	if c.Int("rounds") < 1 {
		return fmt.Errorf("bench %s: --rounds must be at least 1", path)
	}
	ctx, cancel := stepContext(c)
	defer cancel()
	spin := startProgress(c, "profiling "+call.fn.Name+" on "+r.where())
	p, err := r.profile(ctx, call, c.Int("rounds"))
	spin.done()
	if err != nil {
		return fmt.Errorf("bench %s: profile: %w", path, err)
	}
	if file := c.String("trace"); file != "" {
		if err := writeTrace(file, p); err != nil {
			return fmt.Errorf("bench %s: --trace: %w", path, err)
		}
	}
	recorded, recErr := recordProfile(c, path, a, call, r, p)
	if recErr != nil {
		recErr = fmt.Errorf("bench %s: profiled, but not recorded: %w", path, recErr)
	}
	if c.Bool("json") {
		if err := json.NewEncoder(c.App.Writer).Encode(struct {
			*load.Profile
			Recorded string `json:"recorded,omitempty"`
		}{p, recorded}); err != nil {
			return err
		}
		return recErr
	}
	printProfile(c.App.Writer, p, r.where())
	if recorded != "" {
		fmt.Fprintf(c.App.Writer, "recorded as %s (kiln results show %s)\n", recorded, recorded)
	}
	return recErr
}

// printProfile prints a profile's table, the most expensive kernel first,
// and its sum beside the whole model's time.
func printProfile(w io.Writer, p *load.Profile, where string) {
	fmt.Fprintf(w, "%s on %s: profile of %d inferences, %d kernels\n", p.Function, where, p.Rounds, len(p.Kernels))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KERNEL\tPER INFERENCE\tSHARE\tCALLS\tOPERATORS")
	for _, k := range p.Kernels {
		var ops []string
		for _, o := range k.Ops {
			ops = append(ops, fmt.Sprintf("%s (%s)", o.Name, o.Op))
		}
		if len(ops) == 0 {
			ops = []string{"-"}
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f%%\t%d\t%s\n", k.Name, fmtSeconds(k.Seconds), 100*k.Share, k.Calls, strings.Join(ops, ", "))
	}
	tw.Flush()
	fmt.Fprintf(w, "kernels %s per inference (sum of the above); whole model %s (median inference)", fmtSeconds(p.KernelSeconds), fmtSeconds(p.ModelSeconds))
	if rest := p.ModelSeconds - p.KernelSeconds; p.ModelSeconds > 0 && rest > 0 {
		fmt.Fprintf(w, "; the other %s (%.1f%%) is the VM's own work", fmtSeconds(rest), 100*rest/p.ModelSeconds)
	}
	fmt.Fprintln(w)
}

// traceEvent is one event of Chrome's trace-event format (a complete
// event, ph "X", its times in microseconds).
type traceEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat"`
	Ph   string         `json:"ph"`
	TS   float64        `json:"ts"`
	Dur  float64        `json:"dur"`
	PID  int            `json:"pid"`
	TID  int            `json:"tid"`
	Args map[string]any `json:"args"`
}

// writeTrace writes the profile's inference as a trace-event file: the
// inference, and each kernel call inside it with its model operators.
func writeTrace(file string, p *load.Profile) error {
	ops := map[string]string{}
	for _, k := range p.Kernels {
		var s []string
		for _, o := range k.Ops {
			s = append(s, o.Name+" ("+o.Op+")")
		}
		ops[k.Name] = strings.Join(s, ", ")
	}
	events := make([]traceEvent, 0, len(p.Trace))
	for _, e := range p.Trace {
		ev := traceEvent{Name: e.Name, Cat: "function", Ph: "X", TS: e.StartUS, Dur: e.DurUS, PID: 1, TID: 1,
			Args: map[string]any{"device": p.Device}}
		if e.Kernel {
			ev.Cat, ev.Args = "kernel", map[string]any{"operators": ops[e.Name]}
		}
		events = append(events, ev)
	}
	b, err := json.MarshalIndent(struct {
		TraceEvents     []traceEvent `json:"traceEvents"`
		DisplayTimeUnit string       `json:"displayTimeUnit"`
	}{events, "ms"}, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(file, append(b, '\n'), 0o644)
}
