package cuda

import (
	"fmt"
	"strconv"
	"strings"
)

// Resources are what ptxas reports for one kernel of one architecture.
type Resources struct {
	// Arch is the architecture the kernel was compiled for ("sm_90").
	Arch string
	// Registers is the number of registers one thread uses.
	Registers int64
	// SharedBytes is the kernel's static shared memory.
	SharedBytes int64
	// StackBytes is the thread's stack frame.
	StackBytes int64
	// SpillStores and SpillLoads are the bytes spilled to local memory.
	SpillStores, SpillLoads int64
}

// ParsePTXASReport reads ptxas's verbose report (the NVRTC log of a cubin
// compiled with "--ptxas-options=-v") and returns each kernel's resources
// by name. Lines it does not know are skipped; a line it knows with a
// malformed number is an error naming the line.
func ParsePTXASReport(log string) (map[string]Resources, error) {
	out := map[string]Resources{}
	cur := ""
	for i, line := range strings.Split(log, "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "ptxas info    : Compiling entry function '"); ok {
			name, arch, ok := strings.Cut(rest, "' for '")
			if !ok || !strings.HasSuffix(arch, "'") || name == "" {
				return nil, fmt.Errorf("ptxas report line %d: malformed entry line %q", i+1, line)
			}
			cur = name
			out[cur] = Resources{Arch: strings.TrimSuffix(arch, "'")}
			continue
		}
		if cur == "" {
			continue
		}
		r := out[cur]
		var fields []string
		switch {
		case strings.HasPrefix(line, "ptxas info    : Used "):
			fields = strings.Split(strings.TrimPrefix(line, "ptxas info    : Used "), ",")
		case strings.HasPrefix(line, "ptxas         .") && strings.Contains(line, "stack frame"):
			fields = strings.Split(strings.TrimPrefix(line, "ptxas         ."), ",")
		default:
			continue
		}
		for _, f := range fields {
			num, what, ok := strings.Cut(strings.TrimSpace(f), " ")
			if !ok {
				return nil, fmt.Errorf("ptxas report line %d: malformed field %q", i+1, f)
			}
			n, err := strconv.ParseInt(num, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("ptxas report line %d: field %q: %w", i+1, f, err)
			}
			switch what {
			case "registers":
				r.Registers = n
			case "bytes smem":
				r.SharedBytes = n
			case "bytes stack frame":
				r.StackBytes = n
			case "bytes spill stores":
				r.SpillStores = n
			case "bytes spill loads":
				r.SpillLoads = n
			}
		}
		out[cur] = r
	}
	return out, nil
}

// Check reports resources past lim or spills, naming the kernel and the
// limit.
func (r Resources) Check(kernel string, lim Limits) error {
	switch {
	case r.SpillStores > 0 || r.SpillLoads > 0:
		return fmt.Errorf("kernel %q on %s spills registers (%d bytes stored, %d loaded)", kernel, r.Arch, r.SpillStores, r.SpillLoads)
	case r.SharedBytes > lim.MaxSharedMemPerBlock:
		return fmt.Errorf("kernel %q on %s uses %d bytes of shared memory, past the limit %d", kernel, r.Arch, r.SharedBytes, lim.MaxSharedMemPerBlock)
	case r.Registers > lim.MaxRegistersPerThread:
		return fmt.Errorf("kernel %q on %s uses %d registers per thread, past the limit %d", kernel, r.Arch, r.Registers, lim.MaxRegistersPerThread)
	}
	return nil
}
