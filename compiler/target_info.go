package compiler

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/compiler/codegen/cuda"
	"github.com/kiln-ml/kiln/compiler/schedule/auto"
)

// TargetInfo is what a target is to the build: the hardware the default
// schedules fit (vector width, vector registers, caches) and, for its
// kind, the steps Build adds to its pipeline. Target.Info makes it; Build
// and the default schedules read it instead of asking the target's kind.
type TargetInfo struct {
	// Kind is the target's kind, "cpu" or "cuda".
	Kind string
	// VectorBytes is the width of a native vector register
	// (Target.VectorBytes; 0 when the CPU has none); on cuda the widest
	// vector copy, 16.
	VectorBytes int64
	// VectorRegisters is the number of vector registers (32 with
	// AVX-512, on ARM64 and RISC-V V; 16 with AVX2 or SSE); on cuda the
	// registers of one thread.
	VectorRegisters int64
	// L1DBytes and L2Bytes are one core's data caches (the host's as its
	// kernel reports them for a native build, else DefaultL1DBytes and
	// DefaultL2Bytes); 0 on cuda.
	L1DBytes, L2Bytes int64
	// CUDA is a cuda target's architecture limits.
	CUDA cuda.Limits

	kindSteps
}

// kindSteps are the steps one kind of target adds to a build, as data.
type kindSteps struct {
	// DeviceCompiler: the build compiles kernels with a CUDA compiler
	// (NVRTC), which it must find before anything else.
	DeviceCompiler bool
	// PackDense: graph functions' dense layers have their weights packed
	// in the default schedule's column panels before the O2 and O3
	// pipelines (AlterDenseLayout; a tuning database may choose other
	// panels, see relax/transform.DenseSites), unless no default
	// schedule is asked for. The convolutions' repacking
	// (AlterConvLayout) is part of O2 on every target.
	PackDense bool
	// HostDeviceSplit: each lowered function is split into kernels,
	// printed in the device dialect (with barriers placed where threads
	// share memory) and compiled for the device, and the host function
	// that launches them, printed as C. Without it the lowered functions
	// are printed as C whole.
	HostDeviceSplit bool
	// ThreadBound: a function runs only with its loops bound to threads:
	// one so bound keeps its schedule, any other gets the GPU rules
	// (compiler/schedule/auto's gpuRules) even with
	// BuildOptions.NoDefaultSchedule. Without it functions get the CPU
	// rules (cpuRules).
	ThreadBound bool
	// Float8: the 8-bit float dtypes compile (sm_89 and newer check
	// their own use); without it a build refuses them.
	Float8 bool
}

// targetKinds are the kinds of target Build compiles for.
var targetKinds = map[string]kindSteps{
	"cpu":  {PackDense: true},
	"cuda": {DeviceCompiler: true, HostDeviceSplit: true, ThreadBound: true, Float8: true},
}

// DefaultL1DBytes and DefaultL2Bytes are the data caches of a CPU target
// whose caches are not known here (a cross-compilation, a named -mcpu,
// a host whose kernel does not report them): the CPU rules' own defaults
// (auto.DefaultL1DBytes, auto.DefaultL2Bytes: 48 KiB and 1 MiB per core).
const (
	DefaultL1DBytes = auto.DefaultL1DBytes
	DefaultL2Bytes  = auto.DefaultL2Bytes
)

// Info returns the target's table entry: its kind's steps and its
// hardware. An unknown kind is an error.
func (t Target) Info() (TargetInfo, error) {
	kind := t.Kind
	if kind == "" {
		kind = "cpu"
	}
	steps, ok := targetKinds[kind]
	if !ok {
		return TargetInfo{}, fmt.Errorf("target %q is not supported (want cpu or cuda)", t)
	}
	info := TargetInfo{Kind: kind, kindSteps: steps}
	if kind == "cuda" {
		lim, err := t.CUDA()
		if err != nil {
			return TargetInfo{}, err
		}
		info.CUDA = lim
		info.VectorBytes = 16
		info.VectorRegisters = lim.MaxRegistersPerThread
		return info, nil
	}
	info.VectorBytes = t.VectorBytes()
	info.VectorRegisters = t.vectorRegisters()
	info.L1DBytes, info.L2Bytes = DefaultL1DBytes, DefaultL2Bytes
	if t.isHost() {
		if l1, l2, ok := hostCaches(cacheDir); ok {
			info.L1DBytes, info.L2Bytes = l1, l2
		}
	}
	return info, nil
}

// vectorRegisters is the size of the target's vector register file:
// AVX-512 has 32 (zmm0–31), AVX2 and SSE 16 on x86-64 (8 on 32-bit x86);
// ARM64's NEON and SVE have 32, as does RISC-V's V; a CPU without vectors
// counts as 16 of 128 bits (the width its loops are tiled for).
func (t Target) vectorRegisters() int64 {
	switch t.arch() {
	case "amd64":
		if t.VectorBytes() >= 64 {
			return 32
		}
		return 16
	case "386":
		return 8
	case "arm64":
		return 32
	case "riscv64":
		if t.hasAttr("v") {
			return 32
		}
	}
	return 16
}

// isHost reports whether t is this machine's CPU (a native build).
func (t Target) isHost() bool {
	return (t.Kind == "" || t.Kind == "cpu") && t.Triple == "" && (t.MCPU == "" || t.MCPU == "native")
}

// cacheDir is where Linux describes CPU 0's caches.
var cacheDir = "/sys/devices/system/cpu/cpu0/cache"

// hostCaches reads the level 1 data and level 2 caches of CPU 0 from dir
// (Linux's sysfs: index*/level, type and size such as "48K"); ok is false
// when either is missing.
func hostCaches(dir string) (l1d, l2 int64, ok bool) {
	idx, _ := filepath.Glob(filepath.Join(dir, "index*"))
	for _, d := range idx {
		read := func(name string) string {
			b, _ := os.ReadFile(filepath.Join(d, name))
			return strings.TrimSpace(string(b))
		}
		size, err := parseCacheSize(read("size"))
		if err != nil {
			continue
		}
		switch level, typ := read("level"), read("type"); {
		case level == "1" && typ == "Data":
			l1d = size
		case level == "2" && (typ == "Unified" || typ == "Data"):
			l2 = size
		}
	}
	return l1d, l2, l1d > 0 && l2 > 0
}

// parseCacheSize reads a sysfs cache size: bytes, or a count of K, M or G.
func parseCacheSize(s string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mult = 1 << 10
	case strings.HasSuffix(s, "M"):
		mult = 1 << 20
	case strings.HasSuffix(s, "G"):
		mult = 1 << 30
	}
	n, err := strconv.ParseInt(strings.TrimRight(s, "KMG"), 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("cache size %q: want a positive count of bytes, K, M or G", s)
	}
	return n * mult, nil
}
