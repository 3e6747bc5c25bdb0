package compiler

import (
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

func TestCheckRemoteCFlags(t *testing.T) {
	check.NoError(t, CheckRemoteCFlags([]string{"-O2", "-march=x86-64-v3", "-mcpu=cortex-a72", "-ffast-math", "-fno-tree-vectorize"}))
	for _, bad := range []string{
		"-wrapper", "-wrapper=/bin/sh,-c,id", "-B/tmp/evil", "-specs=/tmp/x", "@/tmp/args", "-o", "/tmp/x.so",
		"-march=native;id", "-march=", "-march=../x", "-fplugin=/tmp/p.so", "-save-temps", "-Wl,-rpath,/tmp",
	} {
		err := CheckRemoteCFlags([]string{"-O3", bad})
		check.Error(t, err, bad)
	}
}
