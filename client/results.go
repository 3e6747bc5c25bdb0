package client

import (
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/rpcserver/timer"
)

// RecordResult stores a timing in the tracker's results store, owned by
// this connection's user, and returns it as stored (with its ID, owner
// and time of recording).
func (t *Tracker) RecordResult(ctx context.Context, r proto.Result) (proto.Result, error) {
	var out proto.Result
	if err := t.call(ctx, proto.MethodResultRecord, proto.ResultRecordArgs{Result: r}, &out); err != nil {
		return out, fmt.Errorf("record result of %q: %w", r.Function, err)
	}
	return out, nil
}

// ListResults returns the results this user may see that pass a's
// filters, newest first, and how many matched in all.
func (t *Tracker) ListResults(ctx context.Context, a proto.ResultListArgs) (proto.ResultList, error) {
	var out proto.ResultList
	if err := t.call(ctx, proto.MethodResultList, a, &out); err != nil {
		return out, fmt.Errorf("list results: %w", err)
	}
	return out, nil
}

// GetResult returns one result; one that does not exist, or that this
// user may not see, is an error wrapping proto.ErrNotFound.
func (t *Tracker) GetResult(ctx context.Context, id string) (proto.Result, error) {
	var out proto.Result
	if err := t.call(ctx, proto.MethodResultGet, proto.ResultGetArgs{ID: id}, &out); err != nil {
		return out, fmt.Errorf("result %s: %w", id, err)
	}
	return out, nil
}

// ResultComparison is one line of a comparison of two sets of results: a
// function's timings, or one of its kernels' (Kernel set).
type ResultComparison struct {
	Function string `json:"function"`
	Kernel   string `json:"kernel,omitempty"`
	timer.Comparison
}

// Name is "function" or "function/kernel".
func (x ResultComparison) Name() string {
	if x.Kernel != "" {
		return x.Function + "/" + x.Kernel
	}
	return x.Function
}

// pooledResults gathers a set's figures per function and per kernel
// ("function/kernel").
func pooledResults(rs []proto.Result) map[string][]float64 {
	out := map[string][]float64{}
	for _, r := range rs {
		out[r.Function] = append(out[r.Function], r.Time.Results...)
		for _, k := range r.Kernels {
			out[r.Function+"/"+k.Name] = append(out[r.Function+"/"+k.Name], k.Results...)
		}
	}
	return out
}

// CompareResults compares a's and b's figures (a is the baseline) per
// function and per kernel with timer.Compare; two single results are
// compared whatever their functions are named. It returns the comparisons
// in name order and the names only one side has.
func CompareResults(a, b []proto.Result, threshold float64) ([]ResultComparison, []string) {
	pa, pb := pooledResults(a), pooledResults(b)
	if len(a) == 1 && len(b) == 1 && a[0].Function != b[0].Function {
		pb = map[string][]float64{a[0].Function: b[0].Time.Results}
	}
	var names, onlyOne []string
	for n := range pa {
		if _, ok := pb[n]; ok {
			names = append(names, n)
		} else {
			onlyOne = append(onlyOne, n)
		}
	}
	for n := range pb {
		if _, ok := pa[n]; !ok {
			onlyOne = append(onlyOne, n)
		}
	}
	slices.Sort(names)
	slices.Sort(onlyOne)
	out := make([]ResultComparison, len(names))
	for i, n := range names {
		fn, kernel, _ := strings.Cut(n, "/")
		out[i] = ResultComparison{Function: fn, Kernel: kernel, Comparison: timer.Compare(pa[n], pb[n], threshold)}
	}
	return out, onlyOne
}

// Recording says where a time evaluator's result is recorded in the
// tracker's results store (kiln results), and with what.
type Recording struct {
	// Tracker receives the result; it is owned by this connection's user.
	Tracker *Tracker
	// Lease, when set, names the device that ran it: its key, node and
	// attributes.
	Lease *Lease
	// Label groups results ("pr-123"): kiln results compare takes a label
	// for the set that carries it.
	Label string
	// Shared lets every user of the fleet see the result.
	Shared bool
	// Artifact is the timed artifact's sha256 (FileSHA256), Target its
	// target, where known.
	Artifact, Target string
	// Inputs are the inputs' types and shapes ("A:float32[256]"); when
	// empty, they are read from the timed call's arrays.
	Inputs []string
	// Source is a proto.ResultSource constant (time_evaluator when
	// empty).
	Source string
	// KilnVersion is recorded as the client's kiln version (this
	// program's build of kiln when empty).
	KilnVersion string
}

// Result is the proto.Result that recording res, a timing of function fn
// called with args, stores.
func (rec Recording) Result(fn string, res TimeResult, args ...any) proto.Result {
	r := proto.Result{
		Label: rec.Label, Shared: rec.Shared, Source: rec.Source, Artifact: rec.Artifact,
		Function: fn, Target: rec.Target, KilnVersion: rec.KilnVersion, Inputs: rec.Inputs, Time: res,
	}
	if r.Source == "" {
		r.Source = proto.ResultSourceTimer
	}
	if r.KilnVersion == "" {
		r.KilnVersion = buildVersion()
	}
	if l := rec.Lease; l != nil {
		r.DeviceKey, r.NodeID, r.DeviceAttrs = l.Key, l.NodeID, l.Attrs
	}
	if len(r.Inputs) == 0 {
		for i, a := range args {
			if arr, ok := a.(*Array); ok {
				r.Inputs = append(r.Inputs, fmt.Sprintf("arg%d:%s%s", i, arr.DType, shapeText(arr.Shape)))
			}
		}
	}
	return r
}

func shapeText(s []int64) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, d := range s {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(d, 10))
	}
	b.WriteByte(']')
	return b.String()
}

// buildVersion is the version of kiln this program was built with: the
// main module's when it is kiln, else the kiln module it requires.
func buildVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	if info.Main.Path == kilnModule {
		return info.Main.Version
	}
	for _, d := range info.Deps {
		if d.Path == kilnModule {
			return d.Version
		}
	}
	return ""
}

const kilnModule = "github.com/kiln-ml/kiln"

// TimeAndRecord times f as TimeEvaluator does and records the timing as
// rec says; it returns the timing and the result as stored (its ID). A
// timing that could not be recorded is returned with the error.
func (s *Session) TimeAndRecord(ctx context.Context, f *Func, o TimeOptions, rec Recording, args ...any) (TimeResult, proto.Result, error) {
	if rec.Tracker == nil {
		return TimeResult{}, proto.Result{}, fmt.Errorf("time %q and record: no tracker to record to", f.Name)
	}
	res, err := s.TimeEvaluator(ctx, f, o, args...)
	if err != nil {
		return res, proto.Result{}, err
	}
	stored, err := rec.Tracker.RecordResult(ctx, rec.Result(f.Name, res, args...))
	return res, stored, err
}

// Tracker is the tracker that granted the lease (where a timing on its
// device is recorded).
func (l *Lease) Tracker() *Tracker { return l.t }
