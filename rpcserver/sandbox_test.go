package rpcserver

import (
	"bytes"
	"context"
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
	check.NoError(t, box.Upload(ctx, "a", 6, bytes.NewReader(make([]byte, 6))))
	err = box.Upload(ctx, "b", 6, bytes.NewReader(make([]byte, 6)))
	check.ErrorIs(t, err, proto.ErrQuota)
	// Replacing a file counts its old size out.
	check.NoError(t, box.Upload(ctx, "a", 9, bytes.NewReader(make([]byte, 9))))
	// A short body leaves nothing behind.
	err = box.Upload(ctx, "c", 1, bytes.NewReader(nil))
	check.True(t, err != nil, "short body")
	files, err := box.List()
	check.NoError(t, err)
	check.Equal(t, len(files), 1, files)
	entries, err := os.ReadDir(dir)
	check.NoError(t, err)
	check.Equal(t, len(entries), 1, entries)
}
