// Package toolchain drives the system C compiler for kiln's CPU code
// generator: it finds and identifies the compiler (for cross-compiling, the
// one for a target triple), builds generated C into a shared object, turns
// diagnostics into errors that show the generated source line, and keeps a
// content-addressed build cache.
//
// toolchain runs processes, so its blocking calls take a context. It does
// not import the IR: callers hand it C text and cache keys.
package toolchain

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/abi"
)

// DefaultFlags are the optimization flags used when none are given.
var DefaultFlags = []string{"-O3", "-march=native"}

// Toolchain is one C compiler with its flags.
type Toolchain struct {
	// CC is the compiler command (absolute path after Find).
	CC string
	// Args come before every other argument: "--target=aarch64-linux-gnu"
	// for clang (Options.CC "clang --target=aarch64-linux-gnu").
	Args []string
	// Flags are the optimization and target flags.
	Flags []string
	// Triple is the target triple ("" for the host).
	Triple string
	// Version is the first line of `CC --version`.
	Version string
}

// Options select a toolchain.
type Options struct {
	CC     string   // compiler; "" means $CC, then cc (or TRIPLE-gcc when Triple is set); words after the first are arguments ("clang --target=T")
	Flags  []string // nil means DefaultFlags (without -march=native when cross-compiling)
	Triple string   // target triple for cross-compilation; "" for the host
}

// Find locates and identifies a C compiler.
func Find(ctx context.Context, o Options) (*Toolchain, error) {
	cc := o.CC
	if cc == "" && o.Triple == "" {
		cc = os.Getenv("CC")
	}
	if cc == "" {
		cc = "cc"
		if o.Triple != "" {
			cc = o.Triple + "-gcc"
		}
	}
	words := strings.Fields(cc)
	if len(words) == 0 {
		return nil, errors.New("no C compiler: empty compiler command")
	}
	path, err := exec.LookPath(words[0])
	if err != nil {
		if o.Triple != "" {
			return nil, fmt.Errorf("no C compiler for target %q: %q not found (install a cross compiler or pass --cc)", o.Triple, cc)
		}
		return nil, fmt.Errorf("no C compiler: %q not found (install gcc or pass --cc)", cc)
	}
	flags := o.Flags
	if flags == nil {
		flags = DefaultFlags
		if o.Triple != "" {
			flags = []string{"-O3"}
		}
	}
	args := words[1:]
	out, err := exec.CommandContext(ctx, path, append(slices.Clone(args), "--version")...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("C compiler %q: --version failed: %w: %s", cc, err, strings.TrimSpace(string(out)))
	}
	version, _, _ := strings.Cut(string(out), "\n")
	t := &Toolchain{CC: path, Args: args, Flags: append([]string(nil), flags...), Triple: o.Triple, Version: strings.TrimSpace(version)}
	return t, nil
}

// Identity names the toolchain for cache keys and manifests: compiler
// version, target and flags.
func (t *Toolchain) Identity() string {
	target := t.Triple
	if target == "" {
		target = "host " + runtime.GOARCH
	}
	return fmt.Sprintf("%s; %s; %s", t.Version, target, strings.Join(append(slices.Clone(t.Args), t.Flags...), " "))
}

// Source is one generated C file.
type Source struct {
	Name string // file name, e.g. "host.c"
	Text string
}

// CompileError is a failed compilation: the compiler's stderr and, for
// each diagnostic, the generated line it points at.
type CompileError struct {
	CC     string
	Stderr string
	Diags  []Diagnostic
}

// Diagnostic is one error the compiler reported against generated code.
type Diagnostic struct {
	File    string
	Line    int
	Col     int
	Message string
	Source  string // the generated source line
}

func (e *CompileError) Error() string {
	var b strings.Builder
	b.WriteString("C compiler failed")
	if len(e.Diags) == 0 {
		b.WriteString(": ")
		b.WriteString(strings.TrimSpace(e.Stderr))
		return b.String()
	}
	for _, d := range e.Diags {
		fmt.Fprintf(&b, "\n%s:%d:%d: %s\n    %s", d.File, d.Line, d.Col, d.Message, strings.TrimSpace(d.Source))
	}
	return b.String()
}

// ErrCompile is wrapped by every CompileError (errors.Is).
var ErrCompile = errors.New("C compiler failed")

// Is makes errors.Is(err, ErrCompile) true for compile errors.
func (e *CompileError) Is(target error) bool { return target == ErrCompile }

var diagRE = regexp.MustCompile(`^([^:\s]+\.c):(\d+):(\d+): (?:fatal )?error: (.*)$`)

// BuildShared compiles the sources (plus kiln_abi.h, written beside them)
// into a shared object at out. When keepDir is not empty the sources are
// written there and kept; otherwise a temporary directory is used.
func (t *Toolchain) BuildShared(ctx context.Context, srcs []Source, out, keepDir string) error {
	dir := keepDir
	if dir == "" {
		d, err := os.MkdirTemp("", "kiln-build-")
		if err != nil {
			return fmt.Errorf("build: %w", err)
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, abi.HeaderName), []byte(abi.Header), 0o644); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	args := append(slices.Clone(t.Args), t.Flags...)
	args = append(args, "-std=gnu11", "-fPIC", "-shared", "-fvisibility=hidden", "-I", dir)
	texts := map[string]string{}
	for _, s := range srcs {
		p := filepath.Join(dir, s.Name)
		if err := os.WriteFile(p, []byte(s.Text), 0o644); err != nil {
			return fmt.Errorf("build: %w", err)
		}
		texts[s.Name] = s.Text
		args = append(args, s.Name)
	}
	tmpOut := filepath.Join(dir, "out.so.tmp")
	args = append(args, "-o", tmpOut, "-lm")
	cmd := exec.CommandContext(ctx, t.CC, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("build: %w", ctx.Err())
		}
		return parseDiagnostics(t.CC, stderr.String(), texts)
	}
	if err := os.Rename(tmpOut, out); err != nil {
		b, rerr := os.ReadFile(tmpOut)
		if rerr != nil {
			return fmt.Errorf("build: %w", err)
		}
		if err := os.WriteFile(out, b, 0o755); err != nil {
			return fmt.Errorf("build: %w", err)
		}
	}
	return nil
}

func parseDiagnostics(cc, stderr string, texts map[string]string) *CompileError {
	e := &CompileError{CC: cc, Stderr: stderr}
	sc := bufio.NewScanner(strings.NewReader(stderr))
	for sc.Scan() {
		m := diagRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		line, _ := strconv.Atoi(m[2])
		col, _ := strconv.Atoi(m[3])
		d := Diagnostic{File: m[1], Line: line, Col: col, Message: m[4]}
		if text, ok := texts[filepath.Base(m[1])]; ok {
			lines := strings.Split(text, "\n")
			if line >= 1 && line <= len(lines) {
				d.Source = lines[line-1]
			}
		}
		e.Diags = append(e.Diags, d)
	}
	return e
}
