package proto

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

func TestToWire(t *testing.T) {
	check.True(t, ToWire(nil) == nil)
	for _, tc := range codes {
		t.Run(string(tc.code), func(t *testing.T) {
			err := fmt.Errorf("open %q: %w", "f", tc.err)
			we := ToWire(err)
			check.Equal(t, *we, WireError{Code: tc.code, Message: err.Error()})
			check.ErrorIs(t, we, tc.err)
			check.Equal(t, tc.code.Sentinel(), tc.err)
		})
	}
	check.Equal(t, ToWire(errors.New("x")).Code, CodeInternal)
	check.Equal(t, ToWire(context.Canceled).Code, CodeCancelled)
	check.Equal(t, ToWire(fmt.Errorf("a: %w", context.DeadlineExceeded)).Code, CodeDeadline)

	// A WireError relayed from another daemon keeps its code.
	inner := &WireError{Code: CodeCrashed, Message: `function "f": SIGSEGV`}
	we := ToWire(fmt.Errorf("worker 3: %w", inner))
	check.Equal(t, *we, WireError{Code: CodeCrashed, Message: `worker 3: function "f": SIGSEGV`})
	check.True(t, ToWire(inner) == inner)

	// A code from a newer peer reads as internal.
	check.ErrorIs(t, &WireError{Code: "from_the_future", Message: "m"}, ErrInternal)
	check.Equal(t, (&WireError{Code: CodeBusy}).Error(), "busy")
}
