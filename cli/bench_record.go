package cli

import (
	"context"
	"fmt"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/load"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/rpcserver/timer"
)

// recordFlags are kiln bench's flags for the tracker's results store.
func recordFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.BoolFlag{Name: "record", Value: true, Usage: "with --tracker: record the timing (with --profile, the profile per kernel) in the tracker's results store (kiln results); --record=false does not"},
		&ucli.StringFlag{Name: "label", Usage: "with --tracker: the recorded result's label (\"pr-123\"), which kiln results compare takes for the set that carries it"},
		&ucli.BoolFlag{Name: "share", Usage: "with --tracker: let every user of the fleet see the recorded result (default: only you and the fleet's administrators)"},
	}
}

// benchResult is what kiln bench records of a timing on a leased device.
func benchResult(c *ucli.Context, path string, a *artifact.Artifact, call *preparedCall, r *remoteRunner, res proto.TimeResult) (proto.Result, error) {
	sha, _, err := client.FileSHA256(path)
	if err != nil {
		return proto.Result{}, err
	}
	out := proto.Result{
		Label: c.String("label"), Shared: c.Bool("share"), Source: proto.ResultSourceBench,
		Artifact: sha, Function: call.fn.Name, Target: a.Manifest.Target,
		DeviceKey: r.lease.Key, NodeID: r.lease.NodeID, DeviceAttrs: r.lease.Attrs,
		KilnVersion: Version(), Inputs: callShapes(call), Time: res,
	}
	return out, nil
}

// callShapes says the tensor parameters' types and shapes, in order
// ("A:float32[256]").
func callShapes(call *preparedCall) []string {
	var out []string
	for _, p := range call.fn.Params {
		if p.Kind != abi.ParamTensor {
			continue
		}
		arr := call.arrays[p.Name]
		if arr == nil {
			continue
		}
		dims := ""
		for i, d := range arr.Shape() {
			if i > 0 {
				dims += ","
			}
			dims += fmt.Sprint(d)
		}
		out = append(out, fmt.Sprintf("%s:%s[%s]", p.Name, arr.DType(), dims))
	}
	return out
}

// checkRecordFlags refuses --label, --share and --record without
// --tracker: only timings on a leased device are recorded.
func checkRecordFlags(c *ucli.Context) error {
	if c.String("tracker") == "" && (c.IsSet("label") || c.IsSet("share") || (c.IsSet("record") && c.Bool("record"))) {
		return fmt.Errorf("bench: --record, --label and --share need --tracker: only timings on a leased device are recorded")
	}
	return nil
}

// recordBench records a timing taken on a leased device, when --record
// (the default with --tracker) asks for it; it returns the recorded
// result's id, "" when nothing was recorded.
func recordBench(c *ucli.Context, path string, a *artifact.Artifact, call *preparedCall, run runner, res proto.TimeResult) (string, error) {
	r, ok := run.(*remoteRunner)
	if !ok || !c.Bool("record") {
		return "", nil
	}
	rec, err := benchResult(c, path, a, call, r, res)
	if err != nil {
		return "", fmt.Errorf("record result: %w", err)
	}
	return storeResult(c, r, rec)
}

// recordProfile records a profile taken on a leased device, as
// recordBench does a timing: its Time is the whole model's time of each
// inference, its Kernels each kernel's time within each of them.
func recordProfile(c *ucli.Context, path string, a *artifact.Artifact, call *preparedCall, run runner, p *load.Profile) (string, error) {
	r, ok := run.(*remoteRunner)
	if !ok || !c.Bool("record") {
		return "", nil
	}
	if len(p.ModelSamples) == 0 {
		return "", fmt.Errorf("record result: the device's profile has no per-inference figures (its kiln predates them)")
	}
	within, err := parseShare(c.String("stable-within"))
	if err != nil {
		return "", fmt.Errorf("--stable-within: %w", err)
	}
	rec, err := benchResult(c, path, a, call, r, profileTime(p, within))
	if err != nil {
		return "", fmt.Errorf("record result: %w", err)
	}
	rec.Source = proto.ResultSourceProfile
	rec.Kernels = profileKernels(p)
	return storeResult(c, r, rec)
}

// profileTime is a profile's whole-model figures as a time evaluator's
// answer: one inference a repeat, with its validity report.
func profileTime(p *load.Profile, within float64) proto.TimeResult {
	var m proto.MachineState
	if p.Machine != nil {
		m = *p.Machine
	}
	rep := timer.Assess(p.ModelSamples, m, within)
	res := timer.Summarize(p.ModelSamples)
	res.Number, res.Report = 1, rep
	return res.Wire(p.Device)
}

// profileKernels is a profile's kernels as a result's, with their calls
// and model operators (at most proto.MaxKernelOps of each; at most
// proto.MaxResultKernels kernels, the most expensive).
func profileKernels(p *load.Profile) []proto.KernelTime {
	ks := p.Kernels[:min(len(p.Kernels), proto.MaxResultKernels)]
	out := make([]proto.KernelTime, len(ks))
	for i, k := range ks {
		kt := proto.KernelTime{Name: k.Name, Results: k.Samples, Calls: k.Calls}
		for _, o := range k.Ops[:min(len(k.Ops), proto.MaxKernelOps)] {
			kt.Ops = append(kt.Ops, o.Name+" ("+o.Op+")")
		}
		out[i] = kt
	}
	return out
}

// storeResult records rec in the tracker that granted r's lease and
// returns its id.
func storeResult(c *ucli.Context, r *remoteRunner, rec proto.Result) (string, error) {
	ctx, cancel := context.WithTimeout(c.Context, 30*time.Second)
	defer cancel()
	stored, err := r.tr.RecordResult(ctx, rec)
	if err != nil {
		return "", err
	}
	return stored.ID, nil
}
