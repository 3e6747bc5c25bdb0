package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestQuickContention: --contention times the model in three conditions.
// It asserts nothing about timings.
func TestQuickContention(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"onnx", "--json", "--quick", "--contention"}, &out, &errOut)
	check.NoError(t, err, "stderr:", errOut.String())
	var r onnxResult
	check.NoError(t, json.Unmarshal(out.Bytes(), &r), out.String())
	check.Equal(t, len(r.Models), 1)
	cs := r.Models[0].Contention
	check.Equal(t, len(cs), 3, out.String())
	for i, want := range []string{"quiet", "busy1", "busy2"} {
		check.Equal(t, cs[i].Condition, want)
		check.True(t, cs[i].KilnMS > 0 && cs[i].KilnMeanMS > 0, "condition", want, "has no kiln time:", out.String())
	}
}
