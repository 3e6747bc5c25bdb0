package compiler

import (
	"fmt"
	"runtime"
	"strings"

	"golang.org/x/sys/cpu"

	"github.com/kiln-ml/kiln/compiler/codegen/cuda"
)

// Target is what Build compiles for: "cpu" (the host, or a CPU named by
// -mcpu, or a cross-compilation triple), or "cuda" (an NVIDIA GPU
// architecture named by -arch, sm_80 by default). Build compiles only cpu
// targets; a cuda target is parsed and gives the limits kernels are
// generated against (CUDA).
type Target struct {
	// Kind is "cpu" or "cuda".
	Kind string
	// Arch is the CUDA architecture ("sm_80") of a cuda target.
	Arch string
	// MCPU is the CPU to tune for (-march for GCC); "" means the host
	// (-march=native) unless a triple is set.
	MCPU string
	// Triple is the target triple for cross-compilation; "" is the host.
	Triple string
}

// ParseTarget parses a target string: a kind ("cpu"; "llvm" and "c" are
// accepted as aliases) followed by options "-mcpu=NAME" and
// "-mtriple=TRIPLE", e.g. "cpu -mcpu=znver4"; or "cuda" (alias "nvptx")
// with an optional "-arch=sm_80" (sm_80, sm_86, sm_89 or sm_90).
func ParseTarget(s string) (Target, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return Target{}, fmt.Errorf("target %q: empty (want cpu)", s)
	}
	var t Target
	switch fields[0] {
	case "cpu", "llvm", "c":
		t.Kind = "cpu"
	case "cuda", "nvptx":
		return parseCUDATarget(s, fields[1:])
	default:
		return Target{}, fmt.Errorf("target %q: unknown kind %q (want cpu or cuda)", s, fields[0])
	}
	for _, f := range fields[1:] {
		key, val, ok := strings.Cut(f, "=")
		if !ok || val == "" {
			return Target{}, fmt.Errorf("target %q: option %q: want -mcpu=NAME or -mtriple=TRIPLE", s, f)
		}
		switch key {
		case "-mcpu":
			t.MCPU = val
		case "-mtriple":
			t.Triple = val
		default:
			return Target{}, fmt.Errorf("target %q: unknown option %q (want -mcpu or -mtriple)", s, key)
		}
	}
	return t, nil
}

func parseCUDATarget(s string, opts []string) (Target, error) {
	t := Target{Kind: "cuda", Arch: cuda.DefaultArch}
	for _, f := range opts {
		key, val, ok := strings.Cut(f, "=")
		if !ok || val == "" || key != "-arch" {
			return Target{}, fmt.Errorf("target %q: option %q: a cuda target takes -arch=%s", s, f, strings.Join(cuda.Archs, "|"))
		}
		if _, err := cuda.ArchLimits(val); err != nil {
			return Target{}, fmt.Errorf("target %q: %w", s, err)
		}
		t.Arch = val
	}
	return t, nil
}

// CUDA returns the limits of a cuda target's architecture (thread and
// block dimensions, shared memory and registers per block, warp size).
func (t Target) CUDA() (cuda.Limits, error) {
	if t.Kind != "cuda" {
		return cuda.Limits{}, fmt.Errorf("target %q is not a cuda target", t)
	}
	arch := t.Arch
	if arch == "" {
		arch = cuda.DefaultArch
	}
	return cuda.ArchLimits(arch)
}

// MustParseTarget is ParseTarget for constants; it panics on error.
func MustParseTarget(s string) Target {
	t, err := ParseTarget(s)
	if err != nil {
		panic(err)
	}
	return t
}

// String is the canonical form ParseTarget reads.
func (t Target) String() string {
	s := t.Kind
	if s == "" {
		s = "cpu"
	}
	if s == "cuda" {
		arch := t.Arch
		if arch == "" {
			arch = cuda.DefaultArch
		}
		return s + " -arch=" + arch
	}
	if t.MCPU != "" {
		s += " -mcpu=" + t.MCPU
	}
	if t.Triple != "" {
		s += " -mtriple=" + t.Triple
	}
	return s
}

// cflags are the default C compiler flags for the target.
// VectorBytes is the width of the target's native vector registers, which
// the vectorize pass splits wider vectors to: the host's (64 with
// AVX-512, 32 with AVX2, else 16) for a native build, 64 for a -mcpu that
// names an AVX-512 core, 32 for another -mcpu, 16 when cross-compiling.
func (t Target) VectorBytes() int64 {
	switch {
	case t.MCPU != "":
		for _, p := range []string{"avx512", "skylake-avx512", "cascadelake", "cooperlake", "icelake", "tigerlake", "sapphirerapids", "graniterapids", "znver4", "znver5"} {
			if strings.Contains(t.MCPU, p) {
				return 64
			}
		}
		return 32
	case t.Triple != "":
		return 16
	case cpu.X86.HasAVX512F:
		return 64
	case cpu.X86.HasAVX2:
		return 32
	}
	return 16
}

func (t Target) cflags() []string {
	switch {
	case t.MCPU != "" && t.isX86():
		return []string{"-O3", "-march=" + t.MCPU}
	case t.MCPU != "":
		// GCC for Arm and RISC-V names a core with -mcpu (it implies the
		// architecture and the tuning); -march there takes an ISA string.
		return []string{"-O3", "-mcpu=" + t.MCPU}
	case t.Triple != "":
		return []string{"-O3"}
	}
	return []string{"-O3", "-march=native"}
}

// isX86 reports whether the target is an x86 CPU: its triple's
// architecture, or this machine's when it has no triple.
func (t Target) isX86() bool {
	arch := runtime.GOARCH
	if t.Triple != "" {
		arch, _, _ = strings.Cut(t.Triple, "-")
	}
	switch arch {
	case "amd64", "386", "x86_64", "i386", "i486", "i586", "i686":
		return true
	}
	return false
}
