package artifact_test

import (
	"archive/zip"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/internal/check"
)

func sample(t *testing.T) *artifact.Artifact {
	a := artifact.New("cpu", "gcc 12")
	a.Manifest.Functions = []abi.FuncInfo{{Name: "f", Params: []abi.ParamInfo{{Name: "A", Kind: abi.ParamTensor, DType: "float32", Shape: []abi.Dim{{Name: "n"}, {Value: 4}}}}}}
	check.NoError(t, a.Add(artifact.HostLib, []byte("\x7fELF fake")))
	check.NoError(t, a.Add("device/k.ptx", []byte(".version 8.0")))
	return a
}

func TestRoundTrip(t *testing.T) {
	a := sample(t)
	p := filepath.Join(t.TempDir(), "out.kiln")
	check.NoError(t, a.Save(p))
	b, err := artifact.Load(p)
	check.NoError(t, err)
	check.Equal(t, b.Names(), []string{"device/k.ptx", "host.so"})
	check.Equal(t, b.Files[artifact.HostLib], []byte("\x7fELF fake"))
	f, ok := b.Function("f")
	check.True(t, ok)
	check.Equal(t, f.Params[0].Shape, []abi.Dim{{Name: "n"}, {Value: 4}})
	paths, err := b.Extract(t.TempDir())
	check.NoError(t, err)
	got, err := os.ReadFile(paths["device/k.ptx"])
	check.NoError(t, err)
	check.Equal(t, string(got), ".version 8.0")
}

func TestBadNames(t *testing.T) {
	a := artifact.New("cpu", "")
	for _, n := range []string{"", "../x", "/etc/x", "a/../../b", "manifest.json", `a\b`} {
		check.Error(t, a.Add(n, nil), "not a clean relative name")
	}
}

// rezip rewrites a zip, letting edit change entries.
func rezip(t *testing.T, src []byte, edit func(name string, b []byte) []byte) []byte {
	zr, err := zip.NewReader(bytes.NewReader(src), int64(len(src)))
	check.NoError(t, err)
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range zr.File {
		rc, err := f.Open()
		check.NoError(t, err)
		var b bytes.Buffer
		_, err = b.ReadFrom(rc)
		check.NoError(t, err)
		nb := edit(f.Name, b.Bytes())
		if nb == nil {
			continue
		}
		w, err := zw.Create(f.Name)
		check.NoError(t, err)
		_, err = w.Write(nb)
		check.NoError(t, err)
	}
	check.NoError(t, zw.Close())
	return buf.Bytes()
}

func TestCorrupt(t *testing.T) {
	good, err := sample(t).Bytes()
	check.NoError(t, err)
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"not zip", []byte("hello"), "not a .kiln file"},
		{"tampered", rezip(t, good, func(n string, b []byte) []byte {
			if n == artifact.HostLib {
				evil := bytes.Clone(b)
				evil[0] ^= 0xff
				return evil
			}
			return b
		}), `entry "host.so" has sha256`},
		{"size differs from the manifest", rezip(t, good, func(n string, b []byte) []byte {
			if n == artifact.HostLib {
				return []byte("evil")
			}
			return b
		}), `entry "host.so": the manifest says`},
		{"missing entry", rezip(t, good, func(n string, b []byte) []byte {
			if n == "device/k.ptx" {
				return nil
			}
			return b
		}), `lists "device/k.ptx"`},
		{"no manifest", rezip(t, good, func(n string, b []byte) []byte {
			if n == artifact.ManifestName {
				return nil
			}
			return b
		}), "no manifest.json"},
		{"bad version", rezip(t, good, func(n string, b []byte) []byte {
			if n == artifact.ManifestName {
				return bytes.Replace(b, []byte(`"format_version": 1`), []byte(`"format_version": 9`), 1)
			}
			return b
		}), "format version 9"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := artifact.Read(bytes.NewReader(tc.data), int64(len(tc.data)))
			check.Error(t, err, tc.want)
		})
	}
}

// FuzzRead: reading any bytes as an artifact never panics, and what it
// accepts writes back to an artifact that reads the same.
func FuzzRead(f *testing.F) {
	a := artifact.New("cpu", "gcc 12")
	if err := a.Add(artifact.HostLib, []byte("\x7fELF fake")); err != nil {
		f.Fatal(err)
	}
	good, err := a.Bytes()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte("PK\x03\x04"))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := artifact.Read(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		again, err := a.Bytes()
		check.NoError(t, err)
		b2, err := artifact.Read(bytes.NewReader(again), int64(len(again)))
		check.NoError(t, err)
		check.Equal(t, b2.Names(), a.Names())
	})
}

// zipWith writes a zip of the given entries (stored as given) and a
// manifest listing them with their true hashes unless lie is set.
func zipWith(t *testing.T, entries map[string][]byte, manifest string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := zip.NewWriter(&b)
	for n, data := range entries {
		w, err := zw.Create(n)
		check.NoError(t, err)
		_, err = w.Write(data)
		check.NoError(t, err)
	}
	w, err := zw.Create(artifact.ManifestName)
	check.NoError(t, err)
	_, err = w.Write([]byte(manifest))
	check.NoError(t, err)
	check.NoError(t, zw.Close())
	return b.Bytes()
}

// TestReadBounded: entries the manifest does not list are refused before
// they are inflated, and so are artifacts past the entry or size limits.
func TestReadBounded(t *testing.T) {
	manifest := `{"format_version":1,"target":"cpu","functions":[],"entries":{}}`
	// 64 MiB of zeros compresses to a few tens of KiB: refused unread.
	b := zipWith(t, map[string][]byte{"bomb.bin": make([]byte, 64<<20)}, manifest)
	check.True(t, len(b) < 1<<20, "zip size", len(b))
	_, err := artifact.Read(bytes.NewReader(b), int64(len(b)))
	check.ErrorIs(t, err, artifact.ErrCorrupt)
	check.Error(t, err, `"bomb.bin" is not in the manifest`)

	many := map[string][]byte{}
	for i := range artifact.MaxEntries + 1 {
		many[fmt.Sprintf("f%d", i)] = nil
	}
	b = zipWith(t, many, manifest)
	_, err = artifact.Read(bytes.NewReader(b), int64(len(b)))
	check.Error(t, err, "over the limit of 1024")
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.ReaderAt
	n int64
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n += int64(n)
	return n, err
}

// TestReadWithin: an artifact whose manifest declares (truly) entries
// past the reader's limit is refused with ErrTooLarge before any entry is
// read, let alone inflated; within the limit it reads.
func TestReadWithin(t *testing.T) {
	a := artifact.New("cpu", "gcc 12")
	check.NoError(t, a.Add("one.bin", make([]byte, 32<<20)))
	check.NoError(t, a.Add("two.bin", make([]byte, 32<<20)))
	b, err := a.Bytes()
	check.NoError(t, err)
	r := &countingReader{r: bytes.NewReader(b)}
	_, err = artifact.ReadWithin(r, int64(len(b)), 48<<20)
	check.ErrorIs(t, err, artifact.ErrTooLarge)
	check.Error(t, err, "over the reader's limit of 50331648")
	// The central directory and the manifest, not the entries' data.
	check.True(t, r.n < int64(len(b))/2, "read", r.n, "of", len(b))

	got, err := artifact.ReadWithin(bytes.NewReader(b), int64(len(b)), 80<<20)
	check.NoError(t, err)
	check.Equal(t, len(got.Files["two.bin"]), 32<<20)
}
