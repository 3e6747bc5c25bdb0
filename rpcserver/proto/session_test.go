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
