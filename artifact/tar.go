package artifact

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// The entries of an artifact's tar export (what TVM's export_library
// writes for a name ending in .tar): the host library, already linked, and
// the artifact itself, so that loading the tar loses nothing (device code,
// VM executable, weights).
const (
	TarLinked   = HostLib
	TarArtifact = "module.kiln"
)

// WriteTar writes the artifact's tar export to w.
func (a *Artifact) WriteTar(w io.Writer) error {
	zip, err := a.Bytes()
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	entries := []struct {
		name string
		data []byte
	}{{TarLinked, a.Files[HostLib]}, {TarArtifact, zip}}
	for _, e := range entries {
		if e.data == nil {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), Format: tar.FormatUSTAR}); err != nil {
			return fmt.Errorf("write tar export: %w", err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return fmt.Errorf("write tar export: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write tar export: %w", err)
	}
	return nil
}

// IsTar reports whether head, the first 512 bytes (or more) of a file, is a
// tar header.
func IsTar(head []byte) bool {
	return len(head) >= 262 && bytes.Equal(head[257:262], []byte("ustar"))
}

// ReadTarEntry returns entry name of a tar export (TarLinked or
// TarArtifact).
func ReadTarEntry(r io.Reader, name string) ([]byte, error) {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("tar export: no entry %q (not a kiln export): %w", name, ErrCorrupt)
		}
		if err != nil {
			return nil, fmt.Errorf("tar export: %v: %w", err, ErrCorrupt)
		}
		if h.Name != name {
			continue
		}
		if h.Size < 0 || h.Size > MaxEntryBytes {
			return nil, fmt.Errorf("tar export: entry %q of %d bytes: %w", name, h.Size, ErrCorrupt)
		}
		b := make([]byte, h.Size)
		if _, err := io.ReadFull(tr, b); err != nil {
			return nil, fmt.Errorf("tar export: entry %q: %v: %w", name, err, ErrCorrupt)
		}
		return b, nil
	}
}

// ReadTar reads the artifact of a tar export.
func ReadTar(r io.Reader) (*Artifact, error) {
	b, err := ReadTarEntry(r, TarArtifact)
	if err != nil {
		return nil, err
	}
	return Read(bytes.NewReader(b), int64(len(b)))
}
