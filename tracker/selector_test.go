package tracker

import (
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

func TestSelectorMatch(t *testing.T) {
	attrs := map[string]string{"cuda.compute": "8.6", "cpu.avx512": "true", "memory": "1024", "cpu.model": "Xeon"}
	tests := []struct {
		sel  string
		want bool
	}{
		{"", true},
		{"cuda.compute>=8.0", true},
		{"cuda.compute>=9.0", false},
		{"cuda.compute > 8.5, cpu.avx512=true", true},
		{"cpu.avx512", true},
		{"cpu.avx2", false},
		{"cpu.avx2!=true", true},
		{"memory<2048", true},
		{"memory<=1023", false},
		{"cpu.model=xeon", true},
		{"cpu.model!=Xeon", false},
		{"cuda.compute==8.6", true},
		{"cpu.model>=1", false},
	}
	for _, tc := range tests {
		t.Run(tc.sel, func(t *testing.T) {
			s, err := ParseSelector(tc.sel)
			check.NoError(t, err)
			check.Equal(t, s.Match(attrs), tc.want)
		})
	}
}

func TestSelectorParseErrors(t *testing.T) {
	tests := []struct{ sel, want string }{
		{"cuda.compute>=", "missing value"},
		{">=8.0", "missing attribute name"},
		{"a=1,,b=2", "term 2"},
		{"cpu.model>xeon", `operator ">" needs a number`},
		{"a b=1", "bad attribute name"},
		{"a=>1", "bad value"},
	}
	for _, tc := range tests {
		t.Run(tc.sel, func(t *testing.T) {
			_, err := ParseSelector(tc.sel)
			check.Error(t, err, tc.want, tc.sel)
			check.ErrorIs(t, err, proto.ErrBadRequest)
		})
	}
}
