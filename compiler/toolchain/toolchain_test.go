package toolchain_test

import (
	"context"
	"errors"
	"os"
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
