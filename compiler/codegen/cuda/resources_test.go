package cuda

import (
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

const sampleReport = `ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k2' for 'sm_90'
ptxas info    : Function properties for k2
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
ptxas         .     16 bytes stack frame, 12 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, 1024 bytes smem, 376 bytes cmem[0]`

func TestParsePTXASReport(t *testing.T) {
	got, err := ParsePTXASReport(sampleReport)
	check.NoError(t, err)
	check.Equal(t, got["k2"], Resources{Arch: "sm_90", Registers: 8})
	check.Equal(t, got["k"], Resources{Arch: "sm_90", Registers: 255, SharedBytes: 1024, StackBytes: 16, SpillStores: 12, SpillLoads: 4})
	lim, err := ArchLimits("sm_90")
	check.NoError(t, err)
	check.NoError(t, got["k2"].Check("k2", lim))
	check.Error(t, got["k"].Check("k", lim), `kernel "k" on sm_90 spills registers (12 bytes stored, 4 loaded)`)
	check.Error(t, Resources{Arch: "sm_80", SharedBytes: 50000}.Check("s", lim), `kernel "s" on sm_80 uses 50000 bytes of shared memory, past the limit 49152`)

	_, err = ParsePTXASReport("ptxas info    : Compiling entry function 'k' for 'sm_90'\nptxas info    : Used x registers")
	check.Error(t, err, "line 2", `"x registers"`)
	_, err = ParsePTXASReport("ptxas info    : Compiling entry function 'k' for sm_90")
	check.Error(t, err, "line 1: malformed entry line")
}

func FuzzParsePTXASReport(f *testing.F) {
	f.Add(sampleReport)
	f.Add("ptxas info    : Compiling entry function 'k' for 'sm_80'\nptxas info    : Used 99999999999999999999 registers")
	f.Fuzz(func(t *testing.T, log string) {
		got, err := ParsePTXASReport(log)
		if err == nil && got == nil {
			t.Fatal("no error and no report")
		}
	})
}
