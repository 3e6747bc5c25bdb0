package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestExecutable: a program in a private directory is copied once to a
// directory other uids can search, named by its digest; a program they
// can reach is used as it is; a copy directory others may write is
// refused.
func TestExecutable(t *testing.T) {
	tmp, err := os.MkdirTemp("/tmp", "kiln-exe-test-")
	check.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(tmp) })
	check.NoError(t, os.Chmod(tmp, 0o755))
	t.Setenv("TMPDIR", tmp)

	private := filepath.Join(tmp, "private")
	check.NoError(t, os.Mkdir(private, 0o700))
	prog := filepath.Join(private, "prog")
	check.NoError(t, os.WriteFile(prog, []byte("#!/bin/sh\necho hi\n"), 0o755))
	check.True(t, !Reachable(prog), "a program under a 0700 directory is not reachable")

	got, err := Executable(prog)
	check.NoError(t, err)
	check.True(t, got != prog && strings.HasPrefix(got, tmp+"/kiln-exe-"), got)
	check.True(t, Reachable(got), got, "is reachable")
	b, err := os.ReadFile(got)
	check.NoError(t, err)
	check.Equal(t, string(b), "#!/bin/sh\necho hi\n")
	again, err := Executable(prog)
	check.NoError(t, err)
	check.Equal(t, again, got)

	open := filepath.Join(tmp, "prog2")
	check.NoError(t, os.WriteFile(open, []byte("#!/bin/sh\n"), 0o755))
	check.True(t, Reachable(open))
	same, err := Executable(open)
	check.NoError(t, err)
	check.Equal(t, same, open)

	// A copy directory that others may write (planted by another user)
	// is refused, not used.
	check.NoError(t, os.WriteFile(prog, []byte("#!/bin/sh\necho changed\n"), 0o755))
	_, err = Executable(prog) // makes the new digest's directory
	check.NoError(t, err)
	check.NoError(t, os.WriteFile(prog, []byte("#!/bin/sh\necho planted\n"), 0o755))
	first, err := Executable(prog)
	check.NoError(t, err)
	check.NoError(t, os.Chmod(filepath.Dir(first), 0o777))
	_, err = Executable(prog)
	check.True(t, err != nil && strings.Contains(err.Error(), "only it may write"), err)
}
