package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestRun walks a 16-element vector add through every phase and checks
// that each phase printed its part and the result matched.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	check.NoError(t, run(context.Background(), &out, 16))
	text := out.String()
	for _, tc := range []struct{ name, want string }{
		{"tensors", "C: compute, shape [16], float32\n"},
		{"schedule", `with T.block("C"):`},
		{"passes", "passes: lower_init → lower_blocks"},
		{"lowered", "C[i] = A[i] + B[i]"},
		{"C source", "KILN_EXPORT int32_t vecadd(KilnValue* args"},
		{"artifact", "entries host.so"},
		{"signature", "function vecadd(A: float32[16], B: float32[16], C: float32[16])"},
		{"module", "module cpu: functions vecadd"},
		{"result", "Result matches with the Go reference.\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check.True(t, strings.Contains(text, tc.want), "output lacks", tc.want, "in:\n", text)
		})
	}
}

func TestBadLength(t *testing.T) {
	var out bytes.Buffer
	check.Error(t, run(context.Background(), &out, -1), "n must be at least 1")
}
