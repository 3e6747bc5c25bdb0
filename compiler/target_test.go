package compiler

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestTargetCFlags: a core is named with -march on x86 and with -mcpu on
// Arm and RISC-V, as their GCCs want.
func TestTargetCFlags(t *testing.T) {
	for _, tc := range []struct{ target, want string }{
		{"cpu -mtriple=x86_64-linux-gnu -mcpu=znver4", "-O3 -march=znver4"},
		{"cpu -mtriple=aarch64-linux-gnu -mcpu=cortex-a72", "-O3 -mcpu=cortex-a72"},
		{"cpu -mtriple=riscv64-linux-gnu -mcpu=sifive-u74", "-O3 -mcpu=sifive-u74"},
		{"cpu -mtriple=aarch64-linux-gnu", "-O3"},
	} {
		check.Equal(t, strings.Join(MustParseTarget(tc.target).cflags(), " "), tc.want, tc.target)
	}
}
