package cpu

import (
	"debug/elf"
	"fmt"
	"runtime"
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
