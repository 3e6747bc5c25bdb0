package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCProgram builds libkiln.so, compiles testdata/smoke.c against kiln.h
// (so the header and the exported functions agree) and runs it.
func TestCProgram(t *testing.T) {
	if testing.Short() {
		t.Skip("builds libkiln.so (-short)")
	}
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("no C compiler cc")
	}
	dir := t.TempDir()
	lib := filepath.Join(dir, "libkiln.so")
	run(t, ".", "go", "build", "-buildmode=c-shared", "-o", lib, ".")
	exe := filepath.Join(dir, "smoke")
	run(t, ".", "cc", "-Wall", "-Werror", "-I", ".", "-o", exe, "testdata/smoke.c", lib, "-Wl,-rpath,"+dir, "-lpthread")
	out := run(t, dir, exe, dir)
	if strings.TrimSpace(out) != "ok" {
		t.Fatalf("smoke printed %q", out)
	}
}

func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}
