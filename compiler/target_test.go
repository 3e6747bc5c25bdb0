package compiler

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/hostcpu"
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

// TestTargetVectorWidths: vectors are as wide as the target's registers:
// NEON's 128 bits on ARM64 (SVE too, at its 128-bit minimum), RVV's
// minimum 128 bits on RISC-V with -mattr=+v and none without, and -mattr
// reaches the C compiler in each architecture's spelling.
func TestTargetVectorWidths(t *testing.T) {
	for _, tc := range []struct {
		target string
		bytes  int64
		flags  string
	}{
		{"cpu -mtriple=aarch64-linux-gnu", 16, "-O3"},
		{"cpu -mtriple=aarch64-linux-gnu -mcpu=cortex-a72", 16, "-O3 -mcpu=cortex-a72"},
		{"cpu -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1", 16, "-O3 -mcpu=neoverse-n1"},
		{"cpu -mtriple=aarch64-linux-gnu -mattr=+sve", 16, "-O3 -march=armv8.2-a+sve"},
		{"cpu -mtriple=aarch64-linux-gnu -mcpu=neoverse-v1 -mattr=+sve,-sve2", 16, "-O3 -mcpu=neoverse-v1+sve+nosve2"},
		{"cpu -mtriple=riscv64-linux-gnu", 0, "-O3"},
		{"cpu -mtriple=riscv64-linux-gnu -mattr=+v", 16, "-O3 -march=rv64gcv"},
		{"cpu -mtriple=riscv64-linux-gnu -mattr=+v,+zba", 16, "-O3 -march=rv64gcv_zba"},
		{"cpu -mtriple=riscv64-linux-gnu -mattr=+v,-v", 0, "-O3 -march=rv64gc"},
		{"cpu -mtriple=x86_64-linux-gnu", 16, "-O3"},
		{"cpu -mtriple=x86_64-linux-gnu -mattr=+avx2,+fma", 32, "-O3 -mavx2 -mfma"},
		{"cpu -mtriple=x86_64-linux-gnu -mcpu=znver4", 64, "-O3 -march=znver4"},
		{"cpu -mtriple=x86_64-linux-gnu -mcpu=znver4 -mattr=-avx512f", 32, "-O3 -march=znver4 -mno-avx512f"},
		{"cpu -mcpu=x86-64-v4", 64, "-O3 -march=x86-64-v4"},
		{"cpu -mcpu=x86-64-v3", 32, "-O3 -march=x86-64-v3"},
		{"cpu -mcpu=x86-64-v2", 16, "-O3 -march=x86-64-v2"},
		{"cpu -mcpu=skylake-avx512", 64, "-O3 -march=skylake-avx512"},
		{"cpu -mcpu=haswell", 32, "-O3 -march=haswell"},
		{"cpu -mcpu=haswell -mattr=+avx512f", 64, "-O3 -march=haswell -mavx512f"},
	} {
		tg := MustParseTarget(tc.target)
		check.Equal(t, tg.VectorBytes(), tc.bytes, tc.target)
		check.Equal(t, strings.Join(tg.cflags(), " "), tc.flags, tc.target)
		back, err := ParseTarget(tg.String())
		check.NoError(t, err)
		check.Equal(t, back.String(), tg.String())
	}
	for _, bad := range []string{"cpu -mattr=sve", "cpu -mattr=+", "cpu -mattr=+a;b", "cpu -mattr=+sve,", "cpu -mattr=++x"} {
		_, err := ParseTarget(bad)
		check.Error(t, err, "-mattr feature")
	}
}

// TestCrossVectorTypes: a vectorized loop is generated with the target's
// vector type (float32x4 on ARM64 and on RISC-V with V, none on scalar
// RISC-V) and cross-compiles with the triple's GCC. The emulated-board test
// (cli) runs such artifacts under qemu and checks their numbers.
func TestCrossVectorTypes(t *testing.T) {
	for _, tc := range []struct{ target, typedef string }{
		{"cpu -mtriple=aarch64-linux-gnu -mcpu=cortex-a72", "typedef float float32x4 __attribute__((vector_size(16)));"},
		{"cpu -mtriple=aarch64-linux-gnu -mattr=+sve", "typedef float float32x4 __attribute__((vector_size(16)));"},
		{"cpu -mtriple=riscv64-linux-gnu -mattr=+v", "typedef float float32x4 __attribute__((vector_size(16)));"},
		{"cpu -mtriple=riscv64-linux-gnu", ""},
	} {
		tg := MustParseTarget(tc.target)
		if _, err := exec.LookPath(tg.Triple + "-gcc"); err != nil {
			t.Logf("%s: %s-gcc not found, skipped", tc.target, tg.Triple)
			continue
		}
		src, err := os.ReadFile("../cli/testdata/vfma.py")
		check.NoError(t, err)
		mod, err := script.Parse("vfma.py", string(src))
		check.NoError(t, err)
		res, err := BuildWithResult(context.Background(), mod, tg, BuildOptions{NoCache: true})
		check.NoError(t, err, tc.target)
		if tc.typedef == "" {
			check.True(t, !strings.Contains(res.Source, "vector_size"), tc.target, "has vector types:", res.Source)
		} else {
			check.True(t, strings.Contains(res.Source, tc.typedef), tc.target, "lacks", tc.typedef, "in", res.Source)
			check.True(t, !strings.Contains(res.Source, "float32x8") && !strings.Contains(res.Source, "float32x16"), tc.target, "has wider vectors")
		}
	}
}

// TestTargetRunsOnHost: whether code built for a target runs on a CPU is
// decided by the features its -mcpu and -mattr enable, against an
// AVX2-only and an AVX-512 x86 CPU and an ARM64 one with and without SVE
// (not this machine's: the answers must not depend on where the test runs).
func TestTargetRunsOnHost(t *testing.T) {
	avx2 := hostcpu.Features{Arch: "amd64", Has: map[string]bool{}}
	for _, f := range x86Levels["x86-64-v3"] {
		avx2.Has[f] = true
	}
	avx512 := hostcpu.Features{Arch: "amd64", Has: map[string]bool{"avx512vnni": true}}
	for _, f := range x86Levels["x86-64-v4"] {
		avx512.Has[f] = true
	}
	neon := hostcpu.Features{Arch: "arm64", Has: map[string]bool{"neon": true}}
	sve := hostcpu.Features{Arch: "arm64", Has: map[string]bool{"neon": true, "sve": true}}
	for _, tc := range []struct {
		target string
		host   hostcpu.Features
		err    string // "" when it runs
	}{
		{"cpu -mcpu=haswell", avx2, ""},
		{"cpu -mcpu=x86-64-v3", avx512, ""},
		{"cpu -mcpu=skylake-avx512", avx512, ""},
		{"cpu -mcpu=cascadelake", avx512, ""},
		{"cpu -mcpu=skylake-avx512", avx2, "its CPU lacks avx512f, avx512bw, avx512cd, avx512dq, avx512vl"},
		{"cpu -mcpu=skylake-avx512 -mattr=-avx512f", avx2, ""},
		{"cpu -mattr=+avx512f", avx2, "its CPU lacks avx512f"},
		{"cpu -mattr=+avx2,+fma", avx2, ""},
		{"cpu -mcpu=icelake-server", avx512, "its CPU lacks avx512ifma, avx512vbmi"},
		{"cpu -mcpu=pentium4x", avx512, "cannot tell whether this host runs code for -mcpu=pentium4x"},
		{"cpu -mtriple=x86_64-linux-gnu", avx2, ""},
		{"cpu -mtriple=aarch64-linux-gnu", avx512, "is for arm64; this host is amd64"},
		{"cpu -mtriple=aarch64-linux-gnu -mattr=+sve", sve, ""},
		{"cpu -mtriple=aarch64-linux-gnu -mattr=+sve", neon, "its CPU lacks sve"},
		{"cpu -mtriple=aarch64-linux-gnu -mcpu=cortex-a72", neon, "cannot tell"},
		{"cuda", avx512, "does not run on the host CPU"},
	} {
		err := MustParseTarget(tc.target).runsOn(tc.host)
		if tc.err == "" {
			check.NoError(t, err, tc.target)
		} else {
			check.Error(t, err, tc.err)
		}
	}
	check.NoError(t, MustParseTarget("cpu").RunsOnHost(), "the host runs what is built for it")
	check.NoError(t, MustParseTarget("cpu -mcpu=native").RunsOnHost(), "the host runs what is built for it")
}
