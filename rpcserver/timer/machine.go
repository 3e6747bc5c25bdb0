package timer

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"path"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// Probe reads the state of the machine a timing runs on, for the validity
// report: from Linux's /proc and /sys, what the board exposes of it.
type Probe struct {
	// FS is the file system /proc and /sys are read from, as
	// "proc/loadavg"; nil reads the host's root.
	FS fs.FS
	// Emulated names the emulator the process runs under, as the device's
	// daemon was told (kiln rpcserver --emulated, a qemu worker wrapper);
	// when empty, Read still says so where the CPU /proc/cpuinfo
	// describes is not the one the binary was built for.
	Emulated string
	// OtherSessions, when set, returns how many other sessions the
	// device serves now.
	OtherSessions func() int
}

// Read reads the machine's state now. What cannot be read is left zero
// and named in Unread.
func (p *Probe) Read() proto.MachineState {
	fsys := p.FS
	if fsys == nil {
		fsys = os.DirFS("/")
	}
	var m proto.MachineState
	m.CPUs = cpuCount(fsys)
	if b, err := fs.ReadFile(fsys, "proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			m.LoadAvg, err = strconv.ParseFloat(f[0], 64)
		}
		if err != nil {
			m.Unread = append(m.Unread, "load average")
		}
	} else {
		m.Unread = append(m.Unread, "load average")
	}
	freqs, _ := fs.Glob(fsys, "sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq")
	for _, f := range freqs {
		khz, ok := readNumber(fsys, f)
		if !ok || khz <= 0 {
			continue
		}
		mhz := khz / 1000
		if m.FreqMinMHz == 0 || mhz < m.FreqMinMHz {
			m.FreqMinMHz = mhz
		}
		m.FreqMaxMHz = max(m.FreqMaxMHz, mhz)
		if b, err := fs.ReadFile(fsys, path.Join(path.Dir(f), "scaling_governor")); err == nil {
			if g := strings.TrimSpace(string(b)); g != "" && !slices.Contains(m.Governors, g) {
				m.Governors = append(m.Governors, g)
			}
		}
	}
	slices.Sort(m.Governors)
	if m.FreqMaxMHz == 0 {
		m.Unread = append(m.Unread, "cpufreq")
	}
	zones, _ := fs.Glob(fsys, "sys/class/thermal/thermal_zone[0-9]*/temp")
	for _, z := range zones {
		milli, ok := readNumber(fsys, z)
		if !ok {
			continue
		}
		name := path.Base(path.Dir(z))
		if b, err := fs.ReadFile(fsys, path.Join(path.Dir(z), "type")); err == nil && strings.TrimSpace(string(b)) != "" {
			name = strings.TrimSpace(string(b))
		}
		if m.TempsC == nil {
			m.TempsC = map[string]float64{}
		}
		if c, seen := m.TempsC[name]; !seen || milli/1000 > c {
			m.TempsC[name] = milli / 1000
		}
	}
	if m.TempsC == nil {
		m.Unread = append(m.Unread, "thermal zones")
	}
	if p.OtherSessions != nil {
		m.OtherSessions = p.OtherSessions()
	}
	m.Emulated = p.Emulated
	if m.Emulated == "" {
		m.Emulated = foreignCPU(fsys, runtime.GOARCH)
	}
	return m
}

// cpuCount counts the host's CPUs in /proc/stat (the load average is the
// whole host's, whatever this process's affinity), else as Go sees them.
func cpuCount(fsys fs.FS) int {
	b, err := fs.ReadFile(fsys, "proc/stat")
	if err != nil {
		return runtime.NumCPU()
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		l := sc.Text()
		if len(l) > 3 && strings.HasPrefix(l, "cpu") && l[3] >= '0' && l[3] <= '9' {
			n++
		}
	}
	if n == 0 {
		return runtime.NumCPU()
	}
	return n
}

// readNumber reads a file holding one number.
func readNumber(fsys fs.FS, name string) (float64, bool) {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	return v, err == nil
}

// cpuinfoArch tells an architecture from a line key of /proc/cpuinfo that
// only its kernel writes.
var cpuinfoArch = map[string]string{
	"vendor_id":       "amd64",
	"CPU implementer": "arm64",
	"isa":             "riscv64",
	"cpu family":      "amd64",
}

// foreignCPU names the emulation when /proc/cpuinfo describes a CPU of
// another architecture than goarch's (as under qemu-user, where the
// process sees the host's /proc): "qemu-user (arm64 on amd64)". It is ""
// when they agree or /proc/cpuinfo says nothing it knows.
func foreignCPU(fsys fs.FS, goarch string) string {
	b, err := fs.ReadFile(fsys, "proc/cpuinfo")
	if err != nil {
		return ""
	}
	family := map[string]string{"386": "amd64", "arm": "arm64", "riscv64": "riscv64", "amd64": "amd64", "arm64": "arm64"}
	want, known := family[goarch]
	if !known {
		return ""
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		key, _, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		if arch, ok := cpuinfoArch[strings.TrimSpace(key)]; ok {
			if arch != want {
				return "qemu-user (" + goarch + " on " + arch + ")"
			}
			return ""
		}
	}
	return ""
}
