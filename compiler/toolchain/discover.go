package toolchain

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Compiler is a C compiler that builds shared objects for one target
// triple.
type Compiler struct {
	// Triple is what the compiler builds for ("aarch64-linux-gnu").
	Triple string
	// CC is the compiler command, with its arguments when it has any
	// ("clang --target=aarch64-linux-gnu"): Options.CC takes it as is.
	CC string
	// Source says how it was found: "host", "PATH", "clang" or
	// "--toolchain".
	Source string
}

// Discovery is what Discover found: the host's compiler and the cross
// compilers that work, and why the others were left out.
type Discovery struct {
	// Host is the host's C compiler (Triple from -dumpmachine); its Triple
	// is "" when there is none.
	Host Compiler
	// Cross are the compilers for other triples, sorted by triple.
	Cross []Compiler
	// Skipped says, for each compiler found that could not build a shared
	// object, what it printed.
	Skipped []string
}

// For returns the compiler command for triple ("" for the host): the host
// compiler when triple is the host's, else the cross compiler found for it.
// ok is false when there is none.
func (d Discovery) For(triple string, same func(a, b string) bool) (cc string, ok bool) {
	if triple == "" || (d.Host.Triple != "" && same(d.Host.Triple, triple)) {
		return d.Host.CC, d.Host.Triple != "" || triple == ""
	}
	for _, c := range d.Cross {
		if same(c.Triple, triple) {
			return c.CC, true
		}
	}
	return "", false
}

// clangTriples are the triples tried with clang --target when no gcc for
// them is on PATH (clang needs the triple's C library: Debian's
// libc6-dev-ARCH-cross).
var clangTriples = []string{"aarch64-linux-gnu", "riscv64-linux-gnu", "x86_64-linux-gnu"}

// Discover finds the C compilers this machine builds with: the host's cc
// ($CC, else cc), TRIPLE-gcc on PATH for every *-linux-gnu* triple,
// clang --target=TRIPLE for the common Linux triples when clang is present,
// and the configured ones (triple → compiler command, which win over the
// others). Each is checked by building an empty shared object linked with
// libm; a configured compiler that fails is an error carrying its
// output, one found on PATH that fails is skipped with that output in
// Skipped.
func Discover(ctx context.Context, configured map[string]string) (Discovery, error) {
	var d Discovery
	host := os.Getenv("CC")
	if host == "" {
		host = "cc"
	}
	if triple, err := probe(ctx, host); err == nil {
		d.Host = Compiler{Triple: triple, CC: host, Source: "host"}
	} else {
		d.Skipped = append(d.Skipped, err.Error())
	}
	cross := map[string]Compiler{}
	for triple, cc := range configured {
		if _, err := probe(ctx, cc); err != nil {
			return Discovery{}, fmt.Errorf("--toolchain %s=%s: %w", triple, cc, err)
		}
		cross[triple] = Compiler{Triple: triple, CC: cc, Source: "--toolchain"}
	}
	have := func(triple string) bool {
		if d.Host.Triple == triple {
			return true
		}
		_, ok := cross[triple]
		return ok
	}
	var gccs []string
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if dir == "" {
			continue
		}
		matches, _ := filepath.Glob(filepath.Join(dir, "*-linux-gnu*-gcc"))
		gccs = append(gccs, matches...)
	}
	for _, m := range gccs {
		triple := strings.TrimSuffix(filepath.Base(m), "-gcc")
		if have(triple) {
			continue
		}
		if _, err := probe(ctx, filepath.Base(m)); err != nil {
			d.Skipped = append(d.Skipped, err.Error())
			continue
		}
		cross[triple] = Compiler{Triple: triple, CC: filepath.Base(m), Source: "PATH"}
	}
	if _, err := exec.LookPath("clang"); err == nil {
		for _, triple := range clangTriples {
			if have(triple) {
				continue
			}
			cc := "clang --target=" + triple
			if _, err := probe(ctx, cc); err != nil {
				d.Skipped = append(d.Skipped, err.Error())
				continue
			}
			cross[triple] = Compiler{Triple: triple, CC: cc, Source: "clang"}
		}
	}
	for _, c := range cross {
		d.Cross = append(d.Cross, c)
	}
	slices.SortFunc(d.Cross, func(a, b Compiler) int { return strings.Compare(a.Triple, b.Triple) })
	return d, nil
}

// probe builds an empty shared object with the compiler command cc and
// returns the triple it builds for (-dumpmachine). Its error carries what
// the compiler printed.
func probe(ctx context.Context, cc string) (string, error) {
	words := strings.Fields(cc)
	if len(words) == 0 {
		return "", fmt.Errorf("empty compiler command")
	}
	path, err := exec.LookPath(words[0])
	if err != nil {
		return "", fmt.Errorf("C compiler %q not found", words[0])
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "kiln-probe-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "p.c")
	if err := os.WriteFile(src, []byte("#include <math.h>\n#include <stdint.h>\ndouble kiln_probe(double x){return sqrt(x);}\n"), 0o644); err != nil {
		return "", err
	}
	run := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, path, append(slices.Clone(words[1:]), args...)...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return strings.TrimSpace(out.String()), err
	}
	if out, err := run("-shared", "-fPIC", "-o", filepath.Join(dir, "p.so"), src, "-lm"); err != nil {
		return "", fmt.Errorf("C compiler %q cannot build a shared object: %v: %s", cc, err, out)
	}
	triple, err := run("-dumpmachine")
	if err != nil || triple == "" {
		return "", fmt.Errorf("C compiler %q: -dumpmachine: %v: %s", cc, err, triple)
	}
	return triple, nil
}
