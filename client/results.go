package client

import (
	"context"
	"fmt"
	"slices"
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
