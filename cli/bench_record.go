package cli

import (
	"context"
	"fmt"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// recordFlags are kiln bench's flags for the tracker's results store.
func recordFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.BoolFlag{Name: "record", Value: true, Usage: "with --tracker: record the timing in the tracker's results store (kiln results); --record=false does not"},
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
	ctx, cancel := context.WithTimeout(c.Context, 30*time.Second)
	defer cancel()
	stored, err := r.tr.RecordResult(ctx, rec)
	if err != nil {
		return "", err
	}
	return stored.ID, nil
}
