package cpu

import (
	"bytes"
	"debug/elf"
	"fmt"
	"runtime"

	"github.com/kiln-ml/kiln/artifact"
)

// elfMachines maps Go's architecture names to the ELF machine of their
// shared objects.
var elfMachines = map[string]elf.Machine{
	"amd64":   elf.EM_X86_64,
	"386":     elf.EM_386,
	"arm64":   elf.EM_AARCH64,
	"arm":     elf.EM_ARM,
	"riscv64": elf.EM_RISCV,
	"ppc64le": elf.EM_PPC64,
	"s390x":   elf.EM_S390,
	"loong64": elf.EM_LOONGARCH,
}

// archName names an ELF machine the way users know it: the Go name where
// there is one, with the ELF name beside it ("arm64 (EM_AARCH64)").
func archName(m elf.Machine) string {
	for goarch, em := range elfMachines {
		if em == m {
			return fmt.Sprintf("%s (%s)", goarch, m)
		}
	}
	return m.String()
}

// checkArch fails, naming both architectures, when the shared object at
// path is an ELF file built for another machine than this process's: the
// dynamic loader would only say "No such file or directory" or "wrong ELF
// class". A file that is not ELF is left to the loader's own error.
func checkArch(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	want, ok := elfMachines[runtime.GOARCH]
	if !ok || f.Machine == want {
		return nil
	}
	return fmt.Errorf("it is built for %s, but this machine is %s: build it for this machine's target (or run it on a board of its architecture)",
		archName(f.Machine), archName(want))
}

// ArtifactArch names the architecture a's host library is built for as Go
// does ("arm64"), the selector key "arch" of devices; "" when a has no
// host library or it is not an ELF file of a machine listed here.
func ArtifactArch(a *artifact.Artifact) string {
	lib, ok := a.Files[artifact.HostLib]
	if !ok {
		return ""
	}
	f, err := elf.NewFile(bytes.NewReader(lib))
	if err != nil {
		return ""
	}
	defer f.Close()
	for goarch, em := range elfMachines {
		if em == f.Machine {
			return goarch
		}
	}
	return ""
}
