package main

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestRun builds the example once per length (the length is symbolic, so
// each build after the first comes from the cache) and checks it.
func TestRun(t *testing.T) {
	for _, n := range []int{1, 37, 1024} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			var out bytes.Buffer
			check.NoError(t, run(context.Background(), &out, n))
			check.Equal(t, out.String(), fmt.Sprintf("Result matches with the Go reference (n = %d).\n", n))
		})
	}
}

func TestBadLength(t *testing.T) {
	var out bytes.Buffer
	check.Error(t, run(context.Background(), &out, 0), "n must be at least 1")
	check.Equal(t, out.String(), "")
}
