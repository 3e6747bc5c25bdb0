// Package ckernel builds PrimFuncs into a loaded C library for tests that
// check generated code against the interpreter below package compiler
// (which they cannot import: it imports them).
package ckernel

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/compiler/codegen/c"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/toolchain"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
)

// Source lowers every PrimFunc of mod and returns the generated C.
func Source(t testing.TB, mod *ir.IRModule) string {
	t.Helper()
	lowered, err := transform.LowerModule(mod, transform.Options{})
	check.NoError(t, err)
	src, _, err := c.Generate(lowered, c.Options{})
	check.NoError(t, err)
	return src
}

// Load compiles src with the C compiler's flags into a shared library in
// a temporary folder and loads it; the test is skipped when there is no C
// compiler.
func Load(t testing.TB, src string, flags ...string) *cpu.Module {
	t.Helper()
	tc, err := toolchain.Find(context.Background(), toolchain.Options{Flags: flags})
	if err != nil {
		t.Skip("no C compiler:", err)
	}
	lib := filepath.Join(t.TempDir(), "host.so")
	check.NoError(t, tc.BuildShared(context.Background(), []toolchain.Source{{Name: "host.c", Text: src}}, lib, ""))
	m, err := cpu.LoadModule(lib)
	check.NoError(t, err)
	return m
}
