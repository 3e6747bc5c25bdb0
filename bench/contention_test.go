package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestQuickContention: --contention times the model in four conditions
// (the last in one of two sessions on one device daemon, beside its time
// alone there). It asserts nothing about timings.
func TestQuickContention(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"onnx", "--json", "--quick", "--contention"}, &out, &errOut)
	check.NoError(t, err, "stderr:", errOut.String())
	var r onnxResult
	check.NoError(t, json.Unmarshal(out.Bytes(), &r), out.String())
	check.Equal(t, len(r.Models), 1)
	cs := r.Models[0].Contention
	check.Equal(t, len(cs), 4, out.String())
	check.True(t, cs[3].SoloMS > 0, "sessions2 has no time of the session alone:", out.String())
	for i, want := range []string{"quiet", "busy1", "busy2", "sessions2"} {
		check.Equal(t, cs[i].Condition, want)
		check.True(t, cs[i].KilnMS > 0 && cs[i].KilnMeanMS > 0, "condition", want, "has no kiln time:", out.String())
	}
}
