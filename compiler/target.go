package compiler

import (
	"fmt"
	"runtime"
	"slices"
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
	// Attrs are the -mattr features, each "+name" or "-name" ("+sve",
	// "+v", "-avx512f"), in the order given.
	Attrs []string
}

// ParseTarget parses a target string: a kind ("cpu"; "llvm" and "c" are
// accepted as aliases) followed by options "-mcpu=NAME", "-mtriple=TRIPLE"
// and "-mattr=+FEATURE,…", e.g. "cpu -mcpu=znver4" or
// "cpu -mtriple=riscv64-linux-gnu -mattr=+v"; or "cuda" (alias "nvptx")
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
			return Target{}, fmt.Errorf("target %q: option %q: want -mcpu=NAME, -mtriple=TRIPLE or -mattr=+FEATURE", s, f)
		}
		switch key {
		case "-mcpu":
			t.MCPU = val
		case "-mtriple":
			t.Triple = val
		case "-mattr":
			for _, a := range strings.Split(val, ",") {
				name := strings.TrimLeft(a, "+-")
				if len(a) < 2 || (a[0] != '+' && a[0] != '-') || name != a[1:] || !validFeature(name) {
					return Target{}, fmt.Errorf("target %q: -mattr feature %q: want +NAME or -NAME (letters, digits, . and _), e.g. -mattr=+sve or -mattr=+v", s, a)
				}
				t.Attrs = append(t.Attrs, a)
			}
		default:
			return Target{}, fmt.Errorf("target %q: unknown option %q (want -mcpu, -mtriple or -mattr)", s, key)
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
	if len(t.Attrs) > 0 {
		s += " -mattr=" + strings.Join(t.Attrs, ",")
	}
	return s
}

// validFeature reports whether name can be a -mattr feature: it is passed
// to the C compiler inside a flag.
func validFeature(name string) bool {
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_') {
			return false
		}
	}
	return name != ""
}

// arch is the target's architecture as Go names it: its triple's, or this
// machine's when it has none.
func (t Target) arch() string {
	if t.Triple == "" {
		return runtime.GOARCH
	}
	a, _, _ := strings.Cut(t.Triple, "-")
	switch a {
	case "aarch64", "arm64":
		return "arm64"
	case "x86_64", "amd64":
		return "amd64"
	case "i386", "i486", "i586", "i686":
		return "386"
	}
	return a
}

// hasAttr reports whether the target enables feature name with -mattr.
func (t Target) hasAttr(name string) bool {
	on, _ := t.attr(name)
	return on
}

// turnsOff reports whether the target disables feature name with -mattr.
func (t Target) turnsOff(name string) bool {
	_, off := t.attr(name)
	return off
}

// attr is what the target's last -mattr of feature name does: turn it on,
// off, or neither when no -mattr names it.
func (t Target) attr(name string) (on, off bool) {
	for _, a := range t.Attrs {
		if a[1:] == name {
			on, off = a[0] == '+', a[0] == '-'
		}
	}
	return on, off
}

// VectorBytes is the width of the target's native vector registers, which
// the vectorize pass splits wider vectors to (0: the target has none, and
// loops stay scalar).
//
// On x86: the host's (64 with AVX-512, 32 with AVX2, else 16) for a native
// build, 64 for a -mcpu that names an AVX-512 core or level (x86-64-v4)
// or -mattr=+avx512f, 32 for another -mcpu or -mattr=+avx2 (16 for the
// x86-64 and x86-64-v2 levels), 16 for another x86 triple; -mattr=-avx512f
// keeps an AVX-512 core or host to 32.
//
// On ARM64: 16, NEON's 128-bit registers. With -mattr=+sve also 16: SVE's
// length is the hardware's choice (128 to 2048 bits), every SVE core runs
// 128-bit vectors, and GCC's fixed-width vectors are NEON/SVE-128.
//
// On RISC-V: 16 with the V extension (-mattr=+v; its minimum VLEN is 128
// bits); 0 without it, the scalar base ISA (rv64gc).
//
// Any other architecture: 16 (GCC splits the generic vectors as it must).
func (t Target) VectorBytes() int64 {
	switch t.arch() {
	case "arm64":
		return 16
	case "riscv64":
		if t.hasAttr("v") {
			return 16
		}
		return 0
	case "amd64", "386":
	default:
		return 16
	}
	off512 := t.turnsOff("avx512f")
	switch {
	case t.hasAttr("avx512f"):
		return 64
	case t.hasAttr("avx2"):
		return 32
	case t.MCPU != "":
		feats, known := x86Levels[t.MCPU]
		if !known {
			feats, known = x86Cores[t.MCPU]
		}
		switch {
		case known && slices.Contains(feats, "avx512f") && !off512:
			return 64
		case known && !slices.Contains(feats, "avx2"):
			return 16
		case known:
			return 32
		}
		for _, p := range []string{"avx512", "skylake-avx512", "cascadelake", "cooperlake", "icelake", "tigerlake", "sapphirerapids", "graniterapids", "znver4", "znver5"} {
			if strings.Contains(t.MCPU, p) && !off512 {
				return 64
			}
		}
		return 32
	case t.Triple != "":
		return 16
	case cpu.X86.HasAVX512F && !off512:
		return 64
	case cpu.X86.HasAVX2:
		return 32
	}
	return 16
}

// cflags are the default C compiler flags for the target: the core
// (-march on x86; -mcpu on Arm and RISC-V, whose GCCs take an ISA string
// with -march) and the -mattr features (-mFEATURE / -mno-FEATURE on x86,
// +feature on the Arm core or architecture, extensions of rv64gc on
// RISC-V).
func (t Target) cflags() []string {
	flags := []string{"-O3"}
	switch arch := t.arch(); {
	case t.isX86():
		switch {
		case t.MCPU != "":
			flags = append(flags, "-march="+t.MCPU)
		case t.Triple == "":
			flags = append(flags, "-march=native")
		}
		for _, a := range t.Attrs {
			if a[0] == '+' {
				flags = append(flags, "-m"+a[1:])
			} else {
				flags = append(flags, "-mno-"+a[1:])
			}
		}
	case arch == "arm64":
		ext := ""
		for _, a := range t.Attrs {
			if a[0] == '+' {
				ext += "+" + a[1:]
			} else {
				ext += "+no" + a[1:]
			}
		}
		switch {
		case t.MCPU != "":
			flags = append(flags, "-mcpu="+t.MCPU+ext)
		case ext != "":
			// SVE and most named extensions need Armv8.2-A.
			flags = append(flags, "-march=armv8.2-a"+ext)
		case t.Triple == "":
			flags = append(flags, "-march=native")
		}
	case arch == "riscv64":
		if t.MCPU != "" {
			flags = append(flags, "-mcpu="+t.MCPU)
		}
		if len(t.Attrs) > 0 {
			isa, seen := "rv64gc", map[string]bool{}
			for _, a := range t.Attrs {
				if !t.hasAttr(a[1:]) || seen[a[1:]] {
					continue
				}
				seen[a[1:]] = true
				if len(a) == 2 {
					isa += a[1:]
				} else {
					isa += "_" + a[1:]
				}
			}
			flags = append(flags, "-march="+isa)
		}
	default:
		if t.MCPU != "" {
			flags = append(flags, "-mcpu="+t.MCPU)
		} else if t.Triple == "" {
			flags = append(flags, "-march=native")
		}
	}
	return flags
}

// isX86 reports whether the target is an x86 CPU: its triple's
// architecture, or this machine's when it has no triple.
func (t Target) isX86() bool {
	a := t.arch()
	return a == "amd64" || a == "386"
}
