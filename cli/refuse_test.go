package cli

import (
	"encoding/binary"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestRunRefusedAtOnce: kiln run --tracker fails at once, saying why,
// when --tracker names a device daemon, when no registered device matches
// the selector (without --wait), and when the artifact is built for
// another architecture than every device of the key.
func TestRunRefusedAtOnce(t *testing.T) {
	dir := t.TempDir()
	fl, tok := testFleet(t, dir, "tok")
	art := kernelArtifact(t)
	run := []string{"run", art, "--func", "fill_index", "--arg", "offset=1", "--token-file", tok, "--output", dir}

	daemon := fl.daemon.Addr().String()
	_, _, err := runApp(t, append(run, "--tracker", daemon, "--key", "cpu")...)
	check.ErrorIs(t, err, proto.ErrBadRequest)
	check.Error(t, err, daemon+" is a kiln device daemon (kiln rpcserver), not a kiln tracker: pass the address of a kiln tracker")

	// No --wait: the tracker answers at once (the default wait is minutes).
	_, _, err = runApp(t, append(run, "--tracker", fl.tracker.Addr(), "--selector", "cores>=100000")...)
	check.ErrorIs(t, err, proto.ErrNotFound)
	check.Error(t, err, `no registered device that matches selector "cores>=100000"`, "pass --wait DURATION")

	// A host library for another machine than the fleet's one device.
	other, arch := uint16(183), "arm64" // EM_AARCH64
	if runtime.GOARCH == "arm64" {
		other, arch = 62, "amd64" // EM_X86_64
	}
	a, err := artifact.Load(art)
	check.NoError(t, err)
	a.Files[artifact.HostLib] = elfHeader(other)
	foreign := filepath.Join(dir, "foreign.kiln")
	check.NoError(t, a.Save(foreign))
	_, _, err = runApp(t, "run", foreign, "--func", "fill_index", "--arg", "offset=1", "--token-file", tok,
		"--tracker", fl.tracker.Addr(), "--key", "cpu", "--wait", "1h")
	check.ErrorIs(t, err, proto.ErrBadRequest)
	check.Error(t, err, "the artifact is built for "+arch, `every device registered under key "cpu" is `+runtime.GOARCH)
}

// elfHeader is a 64-bit little-endian ELF header for machine, with no
// sections or segments: enough for debug/elf to read the machine.
func elfHeader(machine uint16) []byte {
	h := make([]byte, 64)
	copy(h, "\x7fELF")
	h[4], h[5], h[6] = 2, 1, 1               // ELFCLASS64, ELFDATA2LSB, EV_CURRENT
	binary.LittleEndian.PutUint16(h[16:], 3) // ET_DYN
	binary.LittleEndian.PutUint16(h[18:], machine)
	binary.LittleEndian.PutUint32(h[20:], 1)
	binary.LittleEndian.PutUint16(h[52:], 64) // e_ehsize
	return h
}
