package cli

import (
	"slices"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

func TestParseUIDs(t *testing.T) {
	got, err := parseUIDs("61000-61002, 62000")
	check.NoError(t, err)
	check.True(t, slices.Equal(got, []int{61000, 61001, 61002, 62000}), got)
	got, err = parseUIDs("")
	check.NoError(t, err)
	check.Equal(t, len(got), 0)
	for _, bad := range []string{"0", "-5", "abc", "7-3", "1-100000", "61000-x"} {
		_, err := parseUIDs(bad)
		check.True(t, err != nil, "want an error for", bad)
	}
}

func TestParseByteSize(t *testing.T) {
	for in, want := range map[string]int64{"": 0, "1048576": 1 << 20, "512MiB": 512 << 20, "4GiB": 4 << 30, "2G": 2 << 30, "3 MB": 3_000_000} {
		got, err := parseByteSize(in)
		check.NoError(t, err, in)
		check.Equal(t, got, want, in)
	}
	for _, bad := range []string{"4.5GiB", "lots", "-1", "12 parsecs", "99999999999TiB"} {
		_, err := parseByteSize(bad)
		check.True(t, err != nil, "want an error for", bad)
		check.Error(t, err, "not a size")
	}
}
