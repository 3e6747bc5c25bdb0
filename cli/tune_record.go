package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler/tune"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/rpcserver/timer"
)

// tuneRecordFlags are kiln tune's flags for the tracker's results store.
func tuneRecordFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.BoolFlag{Name: "record", Usage: "with --tracker: record every measured candidate in the tracker's results store (kiln results; the console's tuning page plots the run)"},
		&ucli.StringFlag{Name: "label", Usage: "with --record: the run's label (default tune-YYYYMMDD-HHMMSS, the start time)"},
		&ucli.BoolFlag{Name: "share", Usage: "with --record: let every user of the fleet see the run's results"},
	}
}

// tuneRecorder records each valid trial of a tuning run as a result with
// source "tune", the run's label and the task's name as function.
type tuneRecorder struct {
	tr     *client.Tracker
	db     *tune.Database
	tasks  map[string]*tune.Task
	target string
	label  string
	share  bool
	errw   io.Writer
	n      int
	failed bool
}

// newTuneRecorder dials the tracker at addr when --record asks for it (nil
// otherwise).
func newTuneRecorder(ctx context.Context, c *ucli.Context, addr string, opts client.TrackerOptions, db *tune.Database, tasks []*tune.Task, target string) (*tuneRecorder, error) {
	if !c.Bool("record") {
		if c.IsSet("label") || c.IsSet("share") {
			return nil, fmt.Errorf("tune: --label and --share go with --record")
		}
		return nil, nil
	}
	if addr == "" {
		return nil, fmt.Errorf("tune: --record needs --tracker: the results are recorded in that tracker's results store (an in-process fleet's would vanish with it)")
	}
	label := c.String("label")
	if label == "" {
		label = "tune-" + time.Now().UTC().Format("20060102-150405")
	}
	if len(label) > proto.MaxResultLabel {
		return nil, fmt.Errorf("tune: --label of %d bytes, at most %d", len(label), proto.MaxResultLabel)
	}
	tr, err := client.DialTracker(ctx, addr, opts)
	if err != nil {
		return nil, fmt.Errorf("tune: --record: %w", err)
	}
	r := &tuneRecorder{tr: tr, db: db, tasks: map[string]*tune.Task{}, target: target, label: label, share: c.Bool("share"), errw: c.App.ErrWriter}
	for _, t := range tasks {
		r.tasks[t.Name] = t
	}
	return r, nil
}

// progress wraps a tuning run's Progress callback: after each trial it
// records the trial's database record, when it has times.
func (r *tuneRecorder) progress(next func(tune.Progress)) func(tune.Progress) {
	if r == nil {
		return next
	}
	return func(p tune.Progress) {
		if p.Last != nil && p.Last.Seconds > 0 {
			r.record(p.Last.Task)
		}
		if next != nil {
			next(p)
		}
	}
}

func (r *tuneRecorder) record(task string) {
	t := r.tasks[task]
	if t == nil {
		return
	}
	recs := r.db.Records(t.Workload.Hash)
	if len(recs) == 0 || len(recs[len(recs)-1].Times) == 0 {
		return
	}
	rec := recs[len(recs)-1]
	res := proto.Result{
		Label: r.label, Shared: r.share, Source: proto.ResultSourceTune, Function: task, Target: r.target,
		DeviceKey: rec.Device["key"], KilnVersion: Version(), Time: timeOf(rec.Times),
	}
	res.DeviceAttrs.CPUModel = rec.Device["model"]
	res.DeviceAttrs.CPUCores, _ = strconv.Atoi(rec.Device["cores"])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.tr.RecordResult(ctx, res); err != nil {
		if !r.failed {
			fmt.Fprintf(r.errw, "tune: --record: %v (tuning goes on; later failures are not reported)\n", err)
		}
		r.failed = true
		return
	}
	r.n++
}

// timeOf is a time evaluator's statistics and validity report of a
// candidate's repeats, as the tuning database kept them.
func timeOf(xs []float64) proto.TimeResult {
	sum := timer.Summarize(xs)
	rep := timer.Assess(xs, proto.MachineState{Unread: []string{"machine state (recorded from the tuning database)"}}, 0)
	return proto.TimeResult{Results: sum.Results, Mean: sum.Mean, Median: sum.Median, Min: sum.Min, Max: sum.Max, Std: sum.Std, Number: 1, Report: &rep}
}

func (r *tuneRecorder) close() {
	if r == nil {
		return
	}
	if r.n > 0 {
		fmt.Fprintf(r.errw, "tune: recorded %d trials in the tracker's results store under label %q (kiln results list --label %s)\n", r.n, r.label, r.label)
	}
	r.tr.Close()
}
