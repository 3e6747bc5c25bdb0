// Package artifact owns the .kiln file: a zip holding manifest.json (format
// version, target, toolchain identity, function table, the sha256 of every
// entry), host.so, device/*.ptx, vm.bin and params.safetensors.
//
// artifact only reads and writes the format; it must not import the
// compiler or any device backend, so both the compiler (which writes
// artifacts) and the device daemon (which runs them) can use it.
package artifact

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kiln-ml/kiln/abi"
)

// FormatVersion is the artifact format this build writes and reads.
const FormatVersion = 1

// Well-known entry names.
const (
	ManifestName = "manifest.json"
	HostLib      = "host.so"
	VMExec       = "vm.bin"
	Params       = "params.safetensors"
	DeviceDir    = "device/"
)

// Manifest attributes the compiler sets.
const (
	// AttrCPUArch is the architecture, as Go names it ("amd64"), a
	// CPU needs to run the artifact's host code.
	AttrCPUArch = "cpu.arch"
	// AttrCPUFeatures lists, comma-separated under their -mattr names,
	// the CPU features the host code may use ("avx2,fma,avx512f").
	AttrCPUFeatures = "cpu.features"
)

// MaxEntryBytes bounds one entry's size on read (4 GiB).
const MaxEntryBytes = 4 << 30

// ErrCorrupt reports an artifact whose contents do not match its manifest.
var ErrCorrupt = errors.New("corrupt artifact")

// Manifest is manifest.json.
type Manifest struct {
	FormatVersion int               `json:"format_version"`
	Target        string            `json:"target"`
	Toolchain     string            `json:"toolchain,omitempty"`
	Kiln          string            `json:"kiln,omitempty"`
	Functions     []abi.FuncInfo    `json:"functions"`
	Entries       map[string]string `json:"entries"` // name -> sha256 hex
	// Sizes are the entries' sizes in bytes, which a reader checks
	// against the zip's headers and its limit before it inflates anything
	// (absent in artifacts written before it was added).
	Sizes map[string]int64  `json:"sizes,omitempty"`
	Attrs map[string]string `json:"attrs,omitempty"`
}

// Artifact is an artifact in memory: its manifest and entries.
type Artifact struct {
	Manifest Manifest
	Files    map[string][]byte
}

// New makes an empty artifact for a target.
func New(target, toolchain string) *Artifact {
	return &Artifact{
		Manifest: Manifest{FormatVersion: FormatVersion, Target: target, Toolchain: toolchain},
		Files:    map[string][]byte{},
	}
}

// Add stores an entry; the name must be a clean relative path.
func (a *Artifact) Add(name string, data []byte) error {
	if err := checkName(name); err != nil {
		return err
	}
	a.Files[name] = data
	return nil
}

func checkName(name string) error {
	if name == "" || name == ManifestName || strings.HasPrefix(name, "/") || path.Clean(name) != name || strings.HasPrefix(name, "../") || name == ".." || strings.Contains(name, "\\") {
		return fmt.Errorf("artifact entry %q: not a clean relative name", name)
	}
	return nil
}

// Names lists the entries, sorted.
func (a *Artifact) Names() []string {
	out := make([]string, 0, len(a.Files))
	for n := range a.Files {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Function returns the metadata of one function.
func (a *Artifact) Function(name string) (abi.FuncInfo, bool) {
	for _, f := range a.Manifest.Functions {
		if f.Name == name {
			return f, true
		}
	}
	return abi.FuncInfo{}, false
}

// Write writes the artifact as a zip, filling in the entry hashes.
func (a *Artifact) Write(w io.Writer) error {
	a.Manifest.FormatVersion = FormatVersion
	a.Manifest.Entries = map[string]string{}
	a.Manifest.Sizes = map[string]int64{}
	for n, b := range a.Files {
		sum := sha256.Sum256(b)
		a.Manifest.Entries[n] = hex.EncodeToString(sum[:])
		a.Manifest.Sizes[n] = int64(len(b))
	}
	man, err := json.MarshalIndent(a.Manifest, "", "  ")
	if err != nil {
		return fmt.Errorf("write artifact: %w", err)
	}
	zw := zip.NewWriter(w)
	put := func(name string, b []byte) error {
		fw, err := zw.CreateHeader(&zip.FileHeader{Name: name, Method: zip.Deflate})
		if err != nil {
			return err
		}
		_, err = fw.Write(b)
		return err
	}
	if err := put(ManifestName, append(man, '\n')); err != nil {
		return fmt.Errorf("write artifact: %w", err)
	}
	for _, n := range a.Names() {
		if err := put(n, a.Files[n]); err != nil {
			return fmt.Errorf("write artifact entry %q: %w", n, err)
		}
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("write artifact: %w", err)
	}
	return nil
}

// Bytes returns the artifact's zip encoding.
func (a *Artifact) Bytes() ([]byte, error) {
	var buf bytes.Buffer
	if err := a.Write(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Save writes the artifact to path atomically (temp file and rename).
func (a *Artifact) Save(p string) error {
	f, err := os.CreateTemp(filepath.Dir(p), ".kiln-*")
	if err != nil {
		return fmt.Errorf("save artifact: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := a.Write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("save artifact: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("save artifact: %w", err)
	}
	return nil
}

// Limits on reading an artifact, checked before anything is inflated: a
// small zip can announce (or hold) entries of gigabytes.
const (
	// MaxEntries bounds the entries of one artifact.
	MaxEntries = 1024
	// MaxTotalBytes bounds the inflated size of all entries together.
	MaxTotalBytes = 2 << 30
	// maxManifestBytes bounds manifest.json.
	maxManifestBytes = 16 << 20
)

// ErrTooLarge reports an artifact whose entries, by the sizes it declares,
// exceed the reader's limit; nothing of it was inflated.
var ErrTooLarge = errors.New("artifact too large")

// Read decodes an artifact and verifies every entry against the manifest,
// within MaxTotalBytes (see ReadWithin).
func Read(r io.ReaderAt, size int64) (*Artifact, error) {
	return ReadWithin(r, size, MaxTotalBytes)
}

// ReadWithin decodes an artifact and verifies every entry against the
// manifest. It reads the manifest first and, before it inflates anything,
// checks that the zip holds exactly the entries the manifest lists, each
// of the size the manifest declares (where it declares sizes), within
// MaxEntryBytes each and limit bytes all together (MaxTotalBytes when
// limit is 0 or above it; ErrTooLarge otherwise). Each entry is then
// inflated no further than its declared size, its digest taken as it
// inflates.
func ReadWithin(r io.ReaderAt, size, limit int64) (*Artifact, error) {
	if limit <= 0 || limit > MaxTotalBytes {
		limit = MaxTotalBytes
	}
	zr, err := zip.NewReader(r, size)
	if err != nil {
		return nil, fmt.Errorf("read artifact: not a .kiln file: %w", err)
	}
	if len(zr.File) > MaxEntries {
		return nil, fmt.Errorf("read artifact: %d entries, over the limit of %d: %w", len(zr.File), MaxEntries, ErrCorrupt)
	}
	byName := make(map[string]*zip.File, len(zr.File))
	for _, f := range zr.File {
		if _, dup := byName[f.Name]; dup {
			return nil, fmt.Errorf("read artifact: entry %q twice: %w", f.Name, ErrCorrupt)
		}
		byName[f.Name] = f
		if f.UncompressedSize64 > MaxEntryBytes {
			return nil, fmt.Errorf("read artifact: entry %q is %d bytes, over the %d limit: %w", f.Name, f.UncompressedSize64, int64(MaxEntryBytes), ErrTooLarge)
		}
	}
	mf, ok := byName[ManifestName]
	if !ok {
		return nil, fmt.Errorf("read artifact: no %s: %w", ManifestName, ErrCorrupt)
	}
	if mf.UncompressedSize64 > maxManifestBytes {
		return nil, fmt.Errorf("read artifact: %s is %d bytes, over the %d limit: %w", ManifestName, mf.UncompressedSize64, maxManifestBytes, ErrCorrupt)
	}
	man, _, err := readEntry(mf)
	if err != nil {
		return nil, err
	}
	a := &Artifact{Files: map[string][]byte{}}
	if err := json.Unmarshal(man, &a.Manifest); err != nil {
		return nil, fmt.Errorf("read artifact: %s: %w", ManifestName, err)
	}
	if a.Manifest.FormatVersion != FormatVersion {
		return nil, fmt.Errorf("read artifact: format version %d, this kiln reads %d", a.Manifest.FormatVersion, FormatVersion)
	}
	// The manifest and the zip must name the same entries, of the same
	// sizes, before any is inflated.
	for n := range byName {
		if n == ManifestName {
			continue
		}
		if err := checkName(n); err != nil {
			return nil, fmt.Errorf("read artifact: %w", err)
		}
		if _, ok := a.Manifest.Entries[n]; !ok {
			return nil, fmt.Errorf("read artifact: entry %q is not in the manifest: %w", n, ErrCorrupt)
		}
	}
	total := int64(mf.UncompressedSize64)
	for n := range a.Manifest.Entries {
		f, ok := byName[n]
		if !ok || n == ManifestName {
			return nil, fmt.Errorf("read artifact: manifest lists %q but the file lacks it: %w", n, ErrCorrupt)
		}
		if a.Manifest.Sizes != nil {
			want, ok := a.Manifest.Sizes[n]
			if !ok {
				return nil, fmt.Errorf("read artifact: manifest gives no size for entry %q: %w", n, ErrCorrupt)
			}
			if want < 0 || uint64(want) != f.UncompressedSize64 {
				return nil, fmt.Errorf("read artifact: entry %q: the manifest says %d bytes, its zip header %d: %w", n, want, f.UncompressedSize64, ErrCorrupt)
			}
		}
		total += int64(f.UncompressedSize64)
	}
	if total > limit {
		return nil, fmt.Errorf("read artifact: its entries declare %d bytes inflated, over the reader's limit of %d: %w", total, limit, ErrTooLarge)
	}
	for n, want := range a.Manifest.Entries {
		b, got, err := readEntry(byName[n])
		if err != nil {
			return nil, err
		}
		if got != want {
			return nil, fmt.Errorf("read artifact: entry %q has sha256 %s, manifest says %s: %w", n, got, want, ErrCorrupt)
		}
		a.Files[n] = b
	}
	return a, nil
}

// readEntry inflates one entry, no further than the size its header
// declares, and returns it with its sha256 (hex), taken as it inflates.
func readEntry(f *zip.File) ([]byte, string, error) {
	rc, err := f.Open()
	if err != nil {
		return nil, "", fmt.Errorf("read artifact entry %q: %w", f.Name, err)
	}
	defer rc.Close()
	// Grow with what actually inflates, not with what the header claims.
	buf := bytes.NewBuffer(make([]byte, 0, min(f.UncompressedSize64, 1<<20)))
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(buf, h), io.LimitReader(rc, int64(f.UncompressedSize64)+1))
	if err != nil {
		return nil, "", fmt.Errorf("read artifact entry %q: %w", f.Name, err)
	}
	if uint64(n) != f.UncompressedSize64 {
		return nil, "", fmt.Errorf("read artifact entry %q: inflates to %d bytes, its header says %d: %w", f.Name, n, f.UncompressedSize64, ErrCorrupt)
	}
	return buf.Bytes(), hex.EncodeToString(h.Sum(nil)), nil
}

// Load reads an artifact file.
func Load(p string) (*Artifact, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("load artifact: %w", err)
	}
	a, err := Read(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return a, nil
}

// Extract writes the entries into dir (created if needed) and returns the
// path of each entry by name.
func (a *Artifact) Extract(dir string) (map[string]string, error) {
	out := map[string]string{}
	for _, n := range a.Names() {
		p := filepath.Join(dir, filepath.FromSlash(n))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, fmt.Errorf("extract %q: %w", n, err)
		}
		if err := os.WriteFile(p, a.Files[n], 0o644); err != nil {
			return nil, fmt.Errorf("extract %q: %w", n, err)
		}
		out[n] = p
	}
	return out, nil
}
