package compiler

import (
	"fmt"
	"runtime"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/internal/hostcpu"
)

// RunsOnHost reports whether this machine can run code built for t: nil
// when it can, else an error that says what the host lacks (another
// architecture, or the CPU features that t's -mcpu and -mattr enable).
// Code built for the host itself ("cpu", or -mcpu=native) always runs.
// A core or feature whose requirements are not known here is an error
// too: the caller cannot tell, so it must not run the code.
func (t Target) RunsOnHost() error {
	return t.runsOn(hostcpu.Host())
}

// Requires is what a CPU needs to run code built for t, as an artifact's
// manifest records it for the loader to check: the architecture, and the
// features -mcpu and -mattr enable; code for the host itself (-march=native)
// needs the features of the host that builds it. ok is false when t's
// -mcpu is not known here (only the architecture is then known), and for
// a target that does not run on a CPU.
func (t Target) Requires() (arch string, need []string, ok bool) {
	if t.Kind != "cpu" && t.Kind != "" {
		return "", nil, false
	}
	need, err := t.needs()
	if err != nil {
		return t.arch(), nil, false
	}
	if t.Triple == "" && (t.MCPU == "" || t.MCPU == "native") {
		need = t.withAttrs(hostcpu.Host().List())
	}
	return t.arch(), need, true
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
func (t Target) runsOn(h hostcpu.Features) error {
	if t.Kind != "cpu" && t.Kind != "" {
		return fmt.Errorf("target %q does not run on the host CPU", t)
	}
	if a := t.arch(); a != h.Arch {
		return fmt.Errorf("target %q is for %s; this host is %s", t, a, h.Arch)
	}
	if t.Triple != "" && !strings.Contains(t.Triple, runtime.GOOS) {
		return fmt.Errorf("target %q is not for %s", t, runtime.GOOS)
	}
	need, err := t.needs()
	if err != nil {
		return err
	}
	return h.Check(fmt.Sprintf("target %q", t), "", need)
}

// needs is the features t's -mcpu and -mattr enable (none for the host's
// own -mcpu), or an error when its -mcpu is not known here.
func (t Target) needs() ([]string, error) {
	var need []string
	switch {
	case t.MCPU == "" || t.MCPU == "native":
	case t.isX86():
		feats, ok := x86Levels[t.MCPU]
		if !ok {
			feats, ok = x86Cores[t.MCPU]
		}
		if !ok {
			return nil, fmt.Errorf("target %q: cannot tell whether this host runs code for -mcpu=%s", t, t.MCPU)
		}
		need = slices.Clone(feats)
	default:
		return nil, fmt.Errorf("target %q: cannot tell whether this host runs code for -mcpu=%s", t, t.MCPU)
	}
	return t.withAttrs(need), nil
}

// withAttrs is need with t's -mattr features added and removed.
func (t Target) withAttrs(need []string) []string {
	for _, a := range t.Attrs {
		name := a[1:]
		if a[0] == '+' {
			if !slices.Contains(need, name) {
				need = append(need, name)
			}
			continue
		}
		// Turning off AVX-512's foundation turns off all of AVX-512, as
		// it does in GCC.
		need = slices.DeleteFunc(need, func(f string) bool {
			return f == name || name == "avx512f" && strings.HasPrefix(f, "avx512")
		})
	}
	return need
}
