package compiler

import (
	"fmt"
	"runtime"
	"slices"
	"strings"

	"golang.org/x/sys/cpu"
)

// RunsOnHost reports whether this machine can run code built for t: nil
// when it can, else an error that says what the host lacks (another
// architecture, or the CPU features that t's -mcpu and -mattr enable).
// Code built for the host itself ("cpu", or -mcpu=native) always runs.
// A core or feature whose requirements are not known here is an error
// too: the caller cannot tell, so it must not run the code.
func (t Target) RunsOnHost() error {
	return t.runsOn(hostCPU())
}

// hostFeatures is what a CPU can execute: its architecture as Go names it
// and its features under their -mattr names.
type hostFeatures struct {
	arch string
	has  map[string]bool
}

// hostCPU reads this machine's features.
func hostCPU() hostFeatures {
	h := hostFeatures{arch: runtime.GOARCH, has: map[string]bool{}}
	set := func(name string, on bool) {
		if on {
			h.has[name] = true
		}
	}
	switch runtime.GOARCH {
	case "amd64", "386":
		x := cpu.X86
		for name, on := range map[string]bool{
			"sse2": x.HasSSE2, "sse3": x.HasSSE3, "ssse3": x.HasSSSE3, "sse4.1": x.HasSSE41, "sse4.2": x.HasSSE42,
			"popcnt": x.HasPOPCNT, "cx16": x.HasCX16, "sahf": x.HasLAHF,
			"avx": x.HasAVX, "avx2": x.HasAVX2, "fma": x.HasFMA, "f16c": x.HasF16C,
			"bmi": x.HasBMI1, "bmi2": x.HasBMI2, "lzcnt": x.HasLZCNT, "movbe": x.HasMOVBE,
			"avx512f": x.HasAVX512F, "avx512cd": x.HasAVX512CD, "avx512bw": x.HasAVX512BW,
			"avx512dq": x.HasAVX512DQ, "avx512vl": x.HasAVX512VL, "avx512vnni": x.HasAVX512VNNI,
			"avx512ifma": x.HasAVX512IFMA, "avx512vbmi": x.HasAVX512VBMI, "avx512bf16": x.HasAVX512BF16,
			"avxvnni": x.HasAVXVNNI,
		} {
			set(name, on)
		}
	case "arm64":
		a := cpu.ARM64
		for name, on := range map[string]bool{
			"neon": a.HasASIMD, "sve": a.HasSVE, "sve2": a.HasSVE2, "dotprod": a.HasASIMDDP,
			"i8mm": a.HasI8MM, "fp16": a.HasFPHP && a.HasASIMDHP,
		} {
			set(name, on)
		}
	case "riscv64":
		r := cpu.RISCV64
		for name, on := range map[string]bool{"v": r.HasV, "zba": r.HasZba, "zbb": r.HasZbb, "zbs": r.HasZbs} {
			set(name, on)
		}
	}
	return h
}

// x86Levels are the features of the x86-64 micro-architecture levels,
// each including the one before.
var x86Levels = func() map[string][]string {
	v1 := []string{"sse2"}
	v2 := append(slices.Clone(v1), "sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "cx16", "sahf")
	v3 := append(slices.Clone(v2), "avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe")
	v4 := append(slices.Clone(v3), "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
	return map[string][]string{"x86-64": v1, "x86-64-v2": v2, "x86-64-v3": v3, "x86-64-v4": v4}
}()

// x86Cores are the features of the x86 cores a -mcpu may name, as far as
// the vector code generated for them goes: the level they implement and
// the vector extensions beyond it.
var x86Cores = map[string][]string{
	"haswell": x86Levels["x86-64-v3"], "broadwell": x86Levels["x86-64-v3"], "skylake": x86Levels["x86-64-v3"],
	"alderlake": append(slices.Clone(x86Levels["x86-64-v3"]), "avxvnni"),
	"znver1":    x86Levels["x86-64-v3"], "znver2": x86Levels["x86-64-v3"], "znver3": x86Levels["x86-64-v3"],
	"skylake-avx512": x86Levels["x86-64-v4"],
	"cascadelake":    append(slices.Clone(x86Levels["x86-64-v4"]), "avx512vnni"),
	"icelake-client": append(slices.Clone(x86Levels["x86-64-v4"]), "avx512vnni", "avx512ifma", "avx512vbmi"),
	"icelake-server": append(slices.Clone(x86Levels["x86-64-v4"]), "avx512vnni", "avx512ifma", "avx512vbmi"),
	"tigerlake":      append(slices.Clone(x86Levels["x86-64-v4"]), "avx512vnni", "avx512ifma", "avx512vbmi"),
	"sapphirerapids": append(slices.Clone(x86Levels["x86-64-v4"]), "avx512vnni", "avx512ifma", "avx512vbmi", "avx512bf16", "avxvnni"),
	"znver4":         append(slices.Clone(x86Levels["x86-64-v4"]), "avx512vnni", "avx512ifma", "avx512vbmi", "avx512bf16"),
}

// runsOn is RunsOnHost for the CPU h.
func (t Target) runsOn(h hostFeatures) error {
	if t.Kind != "cpu" && t.Kind != "" {
		return fmt.Errorf("target %q does not run on the host CPU", t)
	}
	if a := t.arch(); a != h.arch {
		return fmt.Errorf("target %q is for %s; this host is %s", t, a, h.arch)
	}
	if t.Triple != "" && !strings.Contains(t.Triple, runtime.GOOS) {
		return fmt.Errorf("target %q is not for %s", t, runtime.GOOS)
	}
	var need []string
	switch {
	case t.MCPU == "" || t.MCPU == "native":
	case t.isX86():
		feats, ok := x86Levels[t.MCPU]
		if !ok {
			feats, ok = x86Cores[t.MCPU]
		}
		if !ok {
			return fmt.Errorf("target %q: cannot tell whether this host runs code for -mcpu=%s", t, t.MCPU)
		}
		need = slices.Clone(feats)
	default:
		return fmt.Errorf("target %q: cannot tell whether this host runs code for -mcpu=%s", t, t.MCPU)
	}
	for _, a := range t.Attrs {
		name := a[1:]
		if a[0] == '+' {
			need = append(need, name)
			continue
		}
		// Turning off AVX-512's foundation turns off all of AVX-512, as
		// it does in GCC.
		need = slices.DeleteFunc(need, func(f string) bool {
			return f == name || name == "avx512f" && strings.HasPrefix(f, "avx512")
		})
	}
	var lacks []string
	for _, f := range need {
		if !h.has[f] && !slices.Contains(lacks, f) {
			lacks = append(lacks, f)
		}
	}
	if len(lacks) > 0 {
		return fmt.Errorf("target %q does not run on this host: its CPU lacks %s", t, strings.Join(lacks, ", "))
	}
	return nil
}
