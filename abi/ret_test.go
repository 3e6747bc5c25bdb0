package abi

import (
	"strings"
	"testing"
)

// TestMetadataResults: a function's result type ("ret") is read from
// metadata format VersionRet, refused in the format before it (which a
// kiln that predates results would call with too few arguments) and
// refused when it is not a scalar that a function can return.
func TestMetadataResults(t *testing.T) {
	m, err := ParseMetadata([]byte(`{"format_version":2,"target":"cpu","functions":[{"name":"f","params":[],"ret":"int64"},{"name":"g","params":[],"ret":"float32"},{"name":"h","params":[]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{ParamInt, ParamFloat, ""} {
		if got := m.Functions[i].RetKind(); got != want {
			t.Errorf("function %s: RetKind %q, want %q", m.Functions[i].Name, got, want)
		}
	}
	if _, err := ParseMetadata([]byte(`{"format_version":1,"target":"cpu","functions":[{"name":"h","params":[]}]}`)); err != nil {
		t.Errorf("format 1 without results: %v", err)
	}
	for _, tc := range []struct{ doc, want string }{
		{`{"format_version":1,"target":"cpu","functions":[{"name":"f","params":[],"ret":"int64"}]}`, `function "f" returns int64, which format version 1 cannot say (want 2)`},
		{`{"format_version":2,"target":"cpu","functions":[{"name":"f","params":[],"ret":"float32x4"}]}`, `function "f" returns "float32x4": want a scalar integer, bool, float32 or float64`},
		{`{"format_version":3,"target":"cpu","functions":[]}`, `format version 3, this kiln reads 1 and 2`},
	} {
		_, err := ParseMetadata([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.doc, err, tc.want)
		}
	}
}
