package proto

import "strings"

// TargetTriple returns the -mtriple option of a target string
// ("aarch64-linux-gnu" for "cpu -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"),
// "" when it has none.
func TargetTriple(target string) string {
	for _, f := range strings.Fields(target) {
		if v, ok := strings.CutPrefix(f, "-mtriple="); ok {
			return v
		}
	}
	return ""
}

// canonicalKind folds a target kind's aliases: llvm and c are cpu, nvptx is
// cuda.
func canonicalKind(kind string) string {
	switch kind {
	case "llvm", "c":
		return "cpu"
	case "nvptx":
		return "cuda"
	}
	return kind
}

// canonicalTriple is a triple with Go's name for its architecture and
// without a vendor field: aarch64-unknown-linux-gnu and arm64-linux-gnu are
// both arm64-linux-gnu.
func canonicalTriple(triple string) string {
	parts := strings.Split(strings.ToLower(triple), "-")
	if len(parts) == 0 || parts[0] == "" {
		return ""
	}
	out := []string{TripleArch(parts[0])}
	for i, p := range parts[1:] {
		if i == 0 && len(parts) > 2 && (p == "unknown" || p == "pc" || p == "none") {
			continue
		}
		out = append(out, p)
	}
	return strings.Join(out, "-")
}

// SameTriple reports whether two target triples name the same
// architecture and system (vendors and architecture aliases aside).
func SameTriple(a, b string) bool {
	ca, cb := canonicalTriple(a), canonicalTriple(b)
	return ca != "" && ca == cb
}

// CanBuild reports whether a compiler node with these attributes builds
// target: one of its Targets has the target's kind and, when the target
// names a -mtriple, either that Target names the same triple or it names
// none and the node's own Triple is that triple. A target without
// -mtriple is built for the node's own machine.
func (a NodeAttrs) CanBuild(target string) bool {
	kind := canonicalKind(TargetKind(target))
	if kind == "" {
		return false
	}
	triple := TargetTriple(target)
	for _, t := range a.Targets {
		if canonicalKind(TargetKind(t)) != kind {
			continue
		}
		if triple == "" {
			return true
		}
		if tt := TargetTriple(t); tt != "" {
			if SameTriple(tt, triple) {
				return true
			}
		} else if a.Triple != "" && SameTriple(a.Triple, triple) {
			return true
		}
	}
	return false
}

// Serves lists what a compiler node builds, for messages: its Targets,
// a plain kind followed by the node's own triple in parentheses
// ("cpu (x86_64-linux-gnu)", "cpu -mtriple=aarch64-linux-gnu", "cuda").
func (a NodeAttrs) Serves() []string {
	var out []string
	for _, t := range a.Targets {
		if a.Triple != "" && TargetTriple(t) == "" && canonicalKind(TargetKind(t)) == "cpu" {
			t += " (" + a.Triple + ")"
		}
		out = append(out, t)
	}
	return out
}
