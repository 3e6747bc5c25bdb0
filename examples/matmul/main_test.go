package main

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestRun runs the example at small sizes, square and ragged (the sizes
// are symbolic, so one build serves them all).
func TestRun(t *testing.T) {
	for _, tc := range []struct{ n, m, k int }{
		{1, 1, 1},
		{64, 64, 64},
		{37, 19, 71},
	} {
		t.Run(fmt.Sprintf("%dx%dx%d", tc.n, tc.m, tc.k), func(t *testing.T) {
			var out bytes.Buffer
			check.NoError(t, run(context.Background(), &out, tc.n, tc.m, tc.k))
			check.Equal(t, out.String(), fmt.Sprintf("Matrix multiplication result matches with the Go reference (%d×%d×%d).\n", tc.n, tc.m, tc.k))
		})
	}
}

func TestBadSizes(t *testing.T) {
	var out bytes.Buffer
	check.Error(t, run(context.Background(), &out, 4, 0, 4), "sizes must be at least 1")
	check.Equal(t, out.String(), "")
}
