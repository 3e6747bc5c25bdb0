package compiler

import (
	"fmt"
	"regexp"
	"strings"
)

// cpuName is what -march, -mcpu and -mtune may name: a CPU or
// architecture, never a path or a second option.
var cpuName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]*$`)

// remoteCFlags are the C compiler flags a build job may ask a compiler
// node for, beside -march/-mcpu/-mtune=NAME: optimisation levels and a few
// code-generation switches. Anything else could make the node's compiler
// run a program (-wrapper, -B, -specs, @file) or write where it should not
// (-o, -save-temps), so it is refused.
var remoteCFlags = map[string]bool{
	"-O0": true, "-O1": true, "-O2": true, "-O3": true, "-Os": true, "-Ofast": true,
	"-ffast-math": true, "-fno-fast-math": true,
	"-funroll-loops": true, "-fno-unroll-loops": true,
	"-ftree-vectorize": true, "-fno-tree-vectorize": true,
	"-fno-math-errno": true, "-ffp-contract=fast": true, "-ffp-contract=off": true,
}

// CheckRemoteCFlags reports the first flag a build job may not pass to a
// compiler node's C compiler, naming it and what is allowed. Compiler
// nodes refuse such jobs; the client checks first for a quicker answer.
func CheckRemoteCFlags(flags []string) error {
	for _, f := range flags {
		if remoteCFlags[f] {
			continue
		}
		if name, val, ok := strings.Cut(f, "="); ok && (name == "-march" || name == "-mcpu" || name == "-mtune") && cpuName.MatchString(val) {
			continue
		}
		return fmt.Errorf("C compiler flag %q is not allowed in a build job (allowed: -O0…-O3, -Os, -Ofast, -march/-mcpu/-mtune=NAME, -f[no-]fast-math, -f[no-]unroll-loops, -f[no-]tree-vectorize, -fno-math-errno, -ffp-contract=fast|off)", f)
	}
	return nil
}
