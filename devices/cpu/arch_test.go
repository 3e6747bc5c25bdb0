package cpu

import (
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// elfHeader is a 64-bit little-endian ELF header of a shared object for
// machine m, with no sections or segments: enough for debug/elf to read.
func elfHeader(m elf.Machine) []byte {
	b := make([]byte, 64)
	copy(b, elf.ELFMAG)
	b[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	b[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	b[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	le := binary.LittleEndian
	le.PutUint16(b[16:], uint16(elf.ET_DYN))
	le.PutUint16(b[18:], uint16(m))
	le.PutUint32(b[20:], uint32(elf.EV_CURRENT))
	le.PutUint16(b[52:], 64) // e_ehsize
	return b
}

// TestLoadForeignArch: a library built for another architecture is
// refused with both architectures named, not with the dynamic loader's
// "No such file or directory".
func TestLoadForeignArch(t *testing.T) {
	other := elf.EM_AARCH64
	wantOther := "arm64"
	if runtime.GOARCH == "arm64" {
		other, wantOther = elf.EM_X86_64, "amd64"
	}
	p := filepath.Join(t.TempDir(), "foreign.so")
	check.NoError(t, os.WriteFile(p, elfHeader(other), 0o644))
	_, err := LoadModule(p)
	check.Error(t, err, "built for "+wantOther)
	check.True(t, strings.Contains(err.Error(), "this machine is "+runtime.GOARCH), err)
}
