package main

import (
	"fmt"
	"os"

	"github.com/kiln-ml/kiln/compiler"
)

// benchTargetHelp is the --target flag's description.
const benchTargetHelp = "the CPU kiln builds for (matmul, onnx): a target such as \"cpu -mcpu=haswell\", or avx2 (cpu -mcpu=haswell) or avx512 (cpu -mcpu=skylake-avx512); it must run on this host. The numpy peer's OpenBLAS is held to the kernels of the same ISA (OPENBLAS_CORETYPE). Default: the host"

// benchTarget is the CPU target of --target: the host ("cpu") when it is
// empty, the aliases avx2 and avx512, or a target string for
// compiler.ParseTarget. A target whose code this host cannot run is an
// error, as is one that is not a CPU.
func benchTarget(s string) (compiler.Target, error) {
	switch s {
	case "":
		s = "cpu"
	case "avx2":
		s = "cpu -mcpu=haswell"
	case "avx512":
		s = "cpu -mcpu=skylake-avx512"
	}
	t, err := compiler.ParseTarget(s)
	if err != nil {
		return compiler.Target{}, fmt.Errorf("--target: %w", err)
	}
	if t.Kind != "cpu" {
		return compiler.Target{}, fmt.Errorf("--target %q: want a cpu target (the benchmark runs its kernels here)", s)
	}
	if err := t.RunsOnHost(); err != nil {
		return compiler.Target{}, fmt.Errorf("--target: %w", err)
	}
	return t, nil
}

// benchTargetInfo is benchTarget with the target's table entry.
func benchTargetInfo(s string) (compiler.Target, compiler.TargetInfo, error) {
	t, err := benchTarget(s)
	if err != nil {
		return t, compiler.TargetInfo{}, err
	}
	info, err := t.Info()
	return t, info, err
}

// targetISA names the vector ISA kiln's code for t uses, from its vector
// width: AVX-512, AVX2 or SSE on x86 (another architecture's vectors by
// their width).
func targetISA(t compiler.Target) string {
	vb := t.VectorBytes()
	if x86(t) {
		switch {
		case vb >= 64:
			return "AVX-512"
		case vb >= 32:
			return "AVX2"
		case vb >= 16:
			return "SSE"
		}
		return "scalar"
	}
	return fmt.Sprintf("%d-byte vectors", vb)
}

func x86(t compiler.Target) bool {
	arch, _, _ := t.Requires()
	return arch == "amd64" || arch == "386"
}

// openblasCore is the OpenBLAS kernel family (OPENBLAS_CORETYPE) of the
// ISA kiln's code for t uses, so that numpy runs the same vector width:
// SkylakeX for AVX-512, Haswell for AVX2, Nehalem for SSE; "" off x86.
// A DYNAMIC_ARCH OpenBLAS picks by CPU model and falls back to an old
// SSE3 core (Prescott) on models newer than itself, so without this the
// peer may not use the host's vectors at all.
func openblasCore(t compiler.Target) string {
	if !x86(t) {
		return ""
	}
	switch vb := t.VectorBytes(); {
	case vb >= 64:
		return "SkylakeX"
	case vb >= 32:
		return "Haswell"
	case vb >= 16:
		return "Nehalem"
	}
	return ""
}

// numpyEnv is the environment of a numpy peer matched to t: OPENBLAS_CORETYPE
// set to openblasCore(t), unless the caller's environment already sets it
// (their choice is kept, and reported with the peer's figures).
func numpyEnv(t compiler.Target) []string {
	if _, set := os.LookupEnv("OPENBLAS_CORETYPE"); set {
		return nil
	}
	if c := openblasCore(t); c != "" {
		return []string{"OPENBLAS_CORETYPE=" + c}
	}
	return nil
}
