// Package check is the one assertion helper kiln's tests use.
package check

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// NoError fails the test now if err is not nil.
func NoError(t testing.TB, err error, context ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%sunexpected error: %v", prefix(context), err)
	}
}

// Error fails the test now unless err is not nil and its message contains
// every one of the substrings.
func Error(t testing.TB, err error, substrings ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want an error containing %q, got nil", substrings)
	}
	for _, s := range substrings {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not contain %q", err.Error(), s)
		}
	}
}

// ErrorIs fails the test now unless errors.Is(err, target).
func ErrorIs(t testing.TB, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v is not %v", err, target)
	}
}

// Equal fails the test now unless got and want are deeply equal.
func Equal[T any](t testing.TB, got, want T, context ...any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%sgot %#v, want %#v", prefix(context), got, want)
	}
}

// True fails the test now unless cond holds.
func True(t testing.TB, cond bool, context ...any) {
	t.Helper()
	if !cond {
		t.Fatalf("%scondition is false", prefix(context))
	}
}

func prefix(context []any) string {
	if len(context) == 0 {
		return ""
	}
	var b strings.Builder
	for i, c := range context {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(toString(c))
	}
	return b.String() + ": "
}

func toString(v any) string { return fmt.Sprint(v) }
