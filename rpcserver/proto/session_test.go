package proto

import (
	"encoding/json"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kiln-ml/kiln/internal/check"
)

func TestSessionTypesRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		in   any
		out  func() any
	}{
		{"call", CallArgs{Func: 3, Args: []Value{{Kind: KindInt, Int: -1}, {Kind: KindArray, Handle: 9}, {Kind: KindShape, Shape: []int64{2, 3}}}},
			func() any { return new(CallArgs) }},
		{"result array", Value{Kind: KindArray, Handle: 4, Array: &ArrayInfo{Handle: 4, Shape: []int64{8}, DType: "float32", Device: "cpu:0", Bytes: 32}},
			func() any { return new(Value) }},
		{"time", TimeArgs{Func: 1, Options: TimeOptions{Number: 2, Repeat: 3, MinRepeatMS: 4, CacheFlushBytes: 1 << 20}},
			func() any { return new(TimeArgs) }},
		{"time result", TimeResult{Results: []float64{1e-3, 2e-3}, Mean: 1.5e-3, Median: 1.5e-3, Min: 1e-3, Max: 2e-3, Std: 5e-4, Number: 10, Device: "cpu:0"},
			func() any { return new(TimeResult) }},
		{"session", SessionInfo{ID: "s1", Key: "k", ExpiresAt: 123, WorkerPID: 42, Version: "v"}, func() any { return new(SessionInfo) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := msgpack.Marshal(tc.in)
			check.NoError(t, err)
			out := tc.out()
			check.NoError(t, msgpack.Unmarshal(b, out))
			b2, err := msgpack.Marshal(out)
			check.NoError(t, err)
			check.Equal(t, b2, b)
		})
	}
}

func TestTimeResultJSON(t *testing.T) {
	// kiln bench --json prints this shape.
	b, err := json.Marshal(TimeResult{Results: []float64{0.5}, Mean: 0.5, Median: 0.5, Min: 0.5, Max: 0.5, Number: 1})
	check.NoError(t, err)
	check.Equal(t, string(b), `{"results":[0.5],"mean":0.5,"median":0.5,"min":0.5,"max":0.5,"std":0,"number":1}`)
}

func TestTimeResultReportCompatible(t *testing.T) {
	// A daemon that predates the report, and a client that does: each
	// decodes what the other sends.
	type oldResult struct {
		Results []float64 `msgpack:"results"`
		Mean    float64   `msgpack:"mean"`
		Median  float64   `msgpack:"median"`
		Number  int       `msgpack:"number"`
	}
	rep := &TimeReport{Verdict: VerdictNoisy, Reason: "too few samples (n=1) for a 95% interval", N: 1, CV: 0.1,
		Machine: MachineState{CPUs: 2, LoadAvg: 1.5, TempsC: map[string]float64{"acpitz": 40}, OtherSessions: 1}}
	b, err := msgpack.Marshal(TimeResult{Results: []float64{1}, Mean: 1, Median: 1, Number: 3, Report: rep})
	check.NoError(t, err)
	var old oldResult
	check.NoError(t, msgpack.Unmarshal(b, &old))
	check.Equal(t, old.Number, 3)
	var back TimeResult
	check.NoError(t, msgpack.Unmarshal(b, &back))
	check.Equal(t, back.Report.Reason, rep.Reason)
	check.Equal(t, back.Report.Machine.TempsC["acpitz"], 40.0)
	check.Equal(t, back.Report.Machine.OtherSessions, 1)

	b, err = msgpack.Marshal(old)
	check.NoError(t, err)
	back = TimeResult{}
	check.NoError(t, msgpack.Unmarshal(b, &back))
	check.True(t, back.Report == nil, "no report from an old daemon")

	// An old daemon ignores the threshold it does not know.
	b, err = msgpack.Marshal(TimeArgs{Func: 1, Options: TimeOptions{Repeat: 6, StableWithin: 0.01}})
	check.NoError(t, err)
	var oldArgs struct {
		Options struct {
			Repeat int `msgpack:"repeat"`
		} `msgpack:"options"`
	}
	check.NoError(t, msgpack.Unmarshal(b, &oldArgs))
	check.Equal(t, oldArgs.Options.Repeat, 6)
}
