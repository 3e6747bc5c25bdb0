package rpcserver

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

func TestCheckName(t *testing.T) {
	tests := []struct {
		name string
		want string // "" when refused
	}{
		{"a.so", "a.so"},
		{"dir/b.kiln", filepath.Join("dir", "b.kiln")},
		{"./c", "c"},
		{"d/./e/../f", filepath.Join("d", "f")},
		{"../x", ""},
		{"/etc/x", ""},
		{"a/../../x", ""},
		{"..", ""},
		{".", ""},
		{"", ""},
		{`..\x`, ""},
		{"a\x00b", ""},
		{"x" + partSuffix, ""},
		{strings.Repeat("n", maxNameLen+1), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := checkName(tc.name)
			if tc.want == "" {
				check.ErrorIs(t, err, proto.ErrBadRequest)
				return
			}
			check.NoError(t, err)
			check.Equal(t, got, tc.want)
		})
	}
}

func FuzzCheckName(f *testing.F) {
	for _, s := range []string{"a", "../a", "a/../../b", "/x", "a//b/", "./.", "a/.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		host, err := checkName(name)
		if err != nil {
			return
		}
		// Whatever is accepted stays below the directory, lexically.
		clean := filepath.Clean(host)
		if !filepath.IsLocal(host) || filepath.IsAbs(host) || clean == ".." || strings.HasPrefix(clean, ".."+string(filepath.Separator)) {
			t.Fatalf("checkName(%q) = %q leaves the directory", name, host)
		}
	})
}

func TestSandboxQuota(t *testing.T) {
	dir := t.TempDir()
	box, err := openSandbox(dir, 10)
	check.NoError(t, err)
	defer box.Close()
	ctx := context.Background()
	check.NoError(t, box.Upload(ctx, "a", 6, bytes.NewReader(make([]byte, 6)), "", nil))
	err = box.Upload(ctx, "b", 6, bytes.NewReader(make([]byte, 6)), "", nil)
	check.ErrorIs(t, err, proto.ErrQuota)
	// Replacing a file counts its old size out.
	check.NoError(t, box.Upload(ctx, "a", 9, bytes.NewReader(make([]byte, 9)), "", nil))
	// A short body leaves nothing behind.
	err = box.Upload(ctx, "c", 1, bytes.NewReader(nil), "", nil)
	check.True(t, err != nil, "short body")
	files, err := box.List()
	check.NoError(t, err)
	check.Equal(t, len(files), 1, files)
	entries, err := os.ReadDir(dir)
	check.NoError(t, err)
	check.Equal(t, len(entries), 1, entries)
}

// An upload over an existing file replaces it whole: a reader holding the
// old file keeps reading the old bytes, the name gives the new ones, and no
// partial file stays behind; an upload over a directory is refused and
// leaves the directory be.
func TestSandboxReplace(t *testing.T) {
	dir := t.TempDir()
	box, err := openSandbox(dir, 0)
	check.NoError(t, err)
	defer box.Close()
	ctx := context.Background()
	for _, name := range []string{"a.kiln", "sub/dir/b.kiln"} {
		old := bytes.Repeat([]byte("old "), 1000)
		check.NoError(t, box.Upload(ctx, name, int64(len(old)), bytes.NewReader(old), "", nil))
		f, _, err := box.Open(name)
		check.NoError(t, err)
		neu := bytes.Repeat([]byte("new!"), 3000)
		check.NoError(t, box.Upload(ctx, name, int64(len(neu)), bytes.NewReader(neu), "", nil))
		held, err := io.ReadAll(f)
		f.Close()
		check.NoError(t, err)
		check.True(t, bytes.Equal(held, old), "a reader of the old file saw it change")
		got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
		check.NoError(t, err)
		check.True(t, bytes.Equal(got, neu), "the name does not give the new bytes")
		// A failed upload over it keeps the file as it was.
		check.True(t, box.Upload(ctx, name, 10, bytes.NewReader([]byte("short")), "", nil) != nil, "short body accepted")
		got, err = os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
		check.NoError(t, err)
		check.True(t, bytes.Equal(got, neu), "a failed upload changed the file")
	}
	check.NoError(t, os.Mkdir(filepath.Join(dir, "d"), 0o755))
	check.NoError(t, os.WriteFile(filepath.Join(dir, "d", "inside"), []byte("x"), 0o644))
	err = box.Upload(ctx, "d", 3, bytes.NewReader([]byte("abc")), "", nil)
	check.True(t, err != nil, "an upload replaced a directory")
	fi, err := os.Stat(filepath.Join(dir, "d", "inside"))
	check.NoError(t, err)
	check.Equal(t, fi.Size(), int64(1))
	err = filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if strings.HasSuffix(p, partSuffix) {
			t.Errorf("partial upload left behind: %s", p)
		}
		return err
	})
	check.NoError(t, err)
}
