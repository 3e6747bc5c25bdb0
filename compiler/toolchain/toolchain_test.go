package toolchain_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/compiler/toolchain"
	"github.com/kiln-ml/kiln/internal/check"
)

func find(t *testing.T) *toolchain.Toolchain {
	tc, err := toolchain.Find(context.Background(), toolchain.Options{Flags: []string{"-O1"}})
	if err != nil {
		t.Skipf("no C compiler: %v", err)
	}
	return tc
}

func TestBuildShared(t *testing.T) {
	tc := find(t)
	check.True(t, tc.Version != "", "version")
	out := filepath.Join(t.TempDir(), "ok.so")
	src := "#include \"kiln_abi.h\"\nKILN_EXPORT int32_t f(KilnValue* a, int32_t* c, int32_t n) { return 0; }\n"
	check.NoError(t, tc.BuildShared(context.Background(), []toolchain.Source{{Name: "host.c", Text: src}}, out, ""))
	st, err := os.Stat(out)
	check.NoError(t, err)
	check.True(t, st.Size() > 0)
}

func TestCompileErrorShowsGeneratedLine(t *testing.T) {
	tc := find(t)
	src := "int f(void) {\n  return undefined_thing + 1;\n}\n"
	err := tc.BuildShared(context.Background(), []toolchain.Source{{Name: "host.c", Text: src}}, filepath.Join(t.TempDir(), "x.so"), "")
	check.ErrorIs(t, err, toolchain.ErrCompile)
	var ce *toolchain.CompileError
	check.True(t, errors.As(err, &ce))
	check.True(t, len(ce.Diags) > 0, "diagnostics parsed from", ce.Stderr)
	check.Equal(t, ce.Diags[0].Line, 2)
	check.Error(t, err, "host.c:2:", "undefined_thing", "return undefined_thing + 1;")
}

func TestMissingCompiler(t *testing.T) {
	_, err := toolchain.Find(context.Background(), toolchain.Options{CC: "no-such-cc-kiln"})
	check.Error(t, err, `"no-such-cc-kiln" not found`)
	_, err = toolchain.Find(context.Background(), toolchain.Options{Triple: "riscv99-none-elf"})
	check.Error(t, err, `target "riscv99-none-elf"`)
}

func TestCache(t *testing.T) {
	c := &toolchain.Cache{Dir: t.TempDir()}
	k := toolchain.Key("ir-hash", "cpu", "gcc 12")
	check.True(t, k != toolchain.Key("ir-hash", "cpu", "gcc 13"))
	check.True(t, toolchain.Key("a", "bc") != toolchain.Key("ab", "c"))
	_, ok := c.Get(k)
	check.True(t, !ok)
	check.NoError(t, c.Put(k, []byte("so")))
	b, ok := c.Get(k)
	check.True(t, ok)
	check.Equal(t, b, []byte("so"))
}

func TestDiscover(t *testing.T) {
	ctx := context.Background()
	d, err := toolchain.Discover(ctx, nil)
	check.NoError(t, err)
	if d.Host.Triple == "" {
		t.Skipf("no host C compiler: %v", d.Skipped)
	}
	same := func(a, b string) bool { return a == b }
	cc, ok := d.For("", same)
	check.True(t, ok && cc != "", "host compiler")
	_, ok = d.For(d.Host.Triple, same)
	check.True(t, ok, "the host's own triple")
	_, ok = d.For("mips-linux-gnu", same)
	check.True(t, !ok, "no mips compiler")
	for _, triple := range []string{"aarch64-linux-gnu", "riscv64-linux-gnu"} {
		if _, err := exec.LookPath(triple + "-gcc"); err != nil || triple == d.Host.Triple {
			continue
		}
		cc, ok := d.For(triple, same)
		check.True(t, ok, triple, "found:", d.Cross, "skipped:", d.Skipped)
		check.Equal(t, cc, triple+"-gcc")
	}

	// A configured compiler wins over PATH; one that fails stops
	// discovery with what it printed.
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad-cc")
	check.NoError(t, os.WriteFile(bad, []byte("#!/bin/sh\necho 'bad-cc: licence expired' >&2\nexit 3\n"), 0o755))
	_, err = toolchain.Discover(ctx, map[string]string{"aarch64-linux-gnu": bad})
	check.Error(t, err, "--toolchain aarch64-linux-gnu="+bad, "bad-cc: licence expired")
	d, err = toolchain.Discover(ctx, map[string]string{"x86_64-kiln-linux-gnu": d.Host.CC + " -O0"})
	check.NoError(t, err)
	cc, ok = d.For("x86_64-kiln-linux-gnu", same)
	check.True(t, ok, "configured toolchain")
	check.Equal(t, cc, d.Host.CC+" -O0")

	// A compiler command with arguments builds with them.
	tc, err := toolchain.Find(ctx, toolchain.Options{CC: cc, Flags: []string{"-O1"}})
	check.NoError(t, err)
	check.Equal(t, tc.Args, []string{"-O0"})
	out := filepath.Join(dir, "ok.so")
	check.NoError(t, tc.BuildShared(ctx, []toolchain.Source{{Name: "host.c", Text: "int f(void) { return 1; }\n"}}, out, ""))
}

func TestMissingCrossCompilerStderr(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "broken-gcc")
	check.NoError(t, os.WriteFile(bad, []byte("#!/bin/sh\nfor a; do [ \"$a\" = --version ] && { echo 'broken-gcc 1.0'; exit 0; }; done\necho 'broken-gcc: cannot find crt1.o for the target' >&2\nexit 1\n"), 0o755))
	tc, err := toolchain.Find(context.Background(), toolchain.Options{CC: bad, Triple: "aarch64-linux-gnu"})
	check.NoError(t, err)
	err = tc.BuildShared(context.Background(), []toolchain.Source{{Name: "host.c", Text: "int f(void) { return 1; }\n"}}, filepath.Join(dir, "x.so"), "")
	check.Error(t, err, "cannot find crt1.o for the target")
}
