package compiler

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestTargetInfo: the table gives each kind its build steps and each
// target its vector width, registers and caches.
func TestTargetInfo(t *testing.T) {
	for _, tc := range []struct {
		target          string
		bytes, regs     int64
		l1, l2          int64
		split, packs    bool
		threads, float8 bool
	}{
		{"cpu -mtriple=x86_64-linux-gnu -mcpu=znver4", 64, 32, DefaultL1DBytes, DefaultL2Bytes, false, true, false, false},
		{"cpu -mtriple=x86_64-linux-gnu -mcpu=znver3", 32, 16, DefaultL1DBytes, DefaultL2Bytes, false, true, false, false},
		{"cpu -mtriple=x86_64-linux-gnu -mcpu=sapphirerapids -mattr=-avx512f", 32, 16, DefaultL1DBytes, DefaultL2Bytes, false, true, false, false},
		{"cpu -mtriple=aarch64-linux-gnu", 16, 32, DefaultL1DBytes, DefaultL2Bytes, false, true, false, false},
		{"cpu -mtriple=riscv64-linux-gnu -mattr=+v", 16, 32, DefaultL1DBytes, DefaultL2Bytes, false, true, false, false},
		{"cpu -mtriple=riscv64-linux-gnu", 0, 16, DefaultL1DBytes, DefaultL2Bytes, false, true, false, false},
		{"cuda -arch=sm_89", 16, 255, 0, 0, true, false, true, true},
	} {
		info, err := MustParseTarget(tc.target).Info()
		check.NoError(t, err, tc.target)
		check.Equal(t, info.VectorBytes, tc.bytes, tc.target)
		check.Equal(t, info.VectorRegisters, tc.regs, tc.target)
		check.Equal(t, info.L1DBytes, tc.l1, tc.target)
		check.Equal(t, info.L2Bytes, tc.l2, tc.target)
		check.Equal(t, info.HostDeviceSplit, tc.split, tc.target)
		check.Equal(t, info.DeviceCompiler, tc.split, tc.target)
		check.Equal(t, info.PackDense, tc.packs, tc.target)
		check.Equal(t, info.ThreadBound, tc.threads, tc.target)
		check.Equal(t, info.Float8, tc.float8, tc.target)
	}
	_, err := Target{Kind: "tpu"}.Info()
	check.Error(t, err, `target "tpu" is not supported (want cpu or cuda)`)
}

// TestHostCaches reads the caches from a directory laid out as Linux's
// sysfs describes CPU 0's, and the host's own when it has one.
func TestHostCaches(t *testing.T) {
	dir := sysfsCaches(t, [3]string{"1", "Data", "48K"}, [3]string{"1", "Instruction", "32K"}, [3]string{"2", "Unified", "2048K"}, [3]string{"3", "Unified", "300M"})
	l1, l2, ok := hostCaches(dir)
	check.True(t, ok)
	check.Equal(t, l1, int64(48<<10))
	check.Equal(t, l2, int64(2<<20))
	check.NoError(t, os.WriteFile(filepath.Join(dir, "index2", "size"), []byte("lots"), 0o644))
	_, _, ok = hostCaches(dir)
	check.True(t, !ok, "an unreadable L2 size is no L2")
	_, err := parseCacheSize("lots")
	check.Error(t, err, `cache size "lots"`)

	info, err := Target{Kind: "cpu"}.Info()
	check.NoError(t, err)
	if l1, l2, ok := hostCaches(cacheDir); ok {
		check.Equal(t, info.L1DBytes, l1)
		check.Equal(t, info.L2Bytes, l2)
	} else {
		check.Equal(t, info.L2Bytes, int64(DefaultL2Bytes))
	}
}

// sysfsCaches lays out a directory as Linux's sysfs describes CPU 0's
// caches: one index directory per cache (level, type, size).
func sysfsCaches(t *testing.T, caches ...[3]string) string {
	t.Helper()
	dir := t.TempDir()
	for i, c := range caches {
		d := filepath.Join(dir, "index"+string(rune('0'+i)))
		check.NoError(t, os.MkdirAll(d, 0o755))
		for name, v := range map[string]string{"level": c[0], "type": c[1], "size": c[2] + "\n"} {
			check.NoError(t, os.WriteFile(filepath.Join(d, name), []byte(v), 0o644))
		}
	}
	return dir
}
