// Package hostcpu reads what this machine's CPU can execute: its
// architecture as Go names it and its instruction-set features under the
// names -mattr uses ("avx512f", "sve", "v"). The compiler asks it whether a
// target runs here; the artifact loader asks it whether an artifact's
// kernels do, before they run and crash on an instruction the CPU lacks.
//
// hostcpu imports nothing of kiln's.
package hostcpu

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/cpu"
)

// Features is what a CPU can execute.
type Features struct {
	// Arch is the architecture as Go names it ("amd64", "arm64").
	Arch string
	// Has holds the features it has, by -mattr name.
	Has map[string]bool
	// Unread says the features could not all be read (RISC-V without
	// the riscv_hwprobe system call: Linux before 6.4, qemu-user before
	// 8.1): Has may then lack some the CPU has.
	Unread bool
}

// Host returns this machine's features (read once).
func Host() Features { return host() }

var host = sync.OnceValue(func() Features {
	h := Features{Arch: runtime.GOARCH, Has: map[string]bool{}}
	set := func(name string, on bool) {
		if on {
			h.Has[name] = true
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
		h.Unread = !featuresProbed()
	}
	return h
})

// List is the features f has, sorted.
func (f Features) List() []string {
	out := make([]string, 0, len(f.Has))
	for name, on := range f.Has {
		if on {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// Lacks is the features of need that f does not have, in need's order,
// each once.
func (f Features) Lacks(need []string) []string {
	var lacks []string
	for _, n := range need {
		if !f.Has[n] && !slices.Contains(lacks, n) {
			lacks = append(lacks, n)
		}
	}
	return lacks
}

// Check fails, naming what is missing, when f cannot run code for arch
// that uses the features need; what names that code in the message.
func (f Features) Check(what, arch string, need []string) error {
	if arch != "" && arch != f.Arch {
		return fmt.Errorf("%s is for %s; this host is %s", what, arch, f.Arch)
	}
	if lacks := f.Lacks(need); len(lacks) > 0 {
		return fmt.Errorf("%s does not run on this host: its CPU lacks %s", what, strings.Join(lacks, ", "))
	}
	return nil
}
