package sandbox

import (
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestCappedArgs: a capped sandbox's directory and /tmp are tmpfs mounts
// of the cap, the shared subdirectories bound read-only over it and the
// made ones created; without a cap the directory is bound from the host.
func TestCappedArgs(t *testing.T) {
	args := strings.Join(CappedArgs("/s/1", "/bin/sh", nil, 4096, []string{"/s/1/files"}, []string{"/s/1/modules"}), " ")
	for _, want := range []string{"--size 4096 --tmpfs /tmp", "--size 4096 --tmpfs /s/1 --ro-bind /s/1/files /s/1/files --dir /s/1/modules --chdir /s/1"} {
		check.True(t, strings.Contains(args, want), "missing", want, "in", args)
	}
	check.True(t, !strings.Contains(args, "--bind /s/1 /s/1"), "the directory is bound from the host:", args)
	plain := CappedArgs("/s/1", "/bin/sh", nil, 0, []string{"/s/1/files"}, nil)
	check.True(t, slices.Equal(plain, Args("/s/1", "/bin/sh", nil)), plain)
	check.True(t, !slices.Contains(plain, "--size"), plain)
}
