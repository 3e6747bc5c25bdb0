package cpu

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kiln-ml/kiln/artifact"
)

// LoadArtifact writes the artifact's host library into dir (a fresh file
// whose name carries the library's digest, so two artifacts never share a
// dlopen handle) and loads it. The caller owns dir and removes it after
// closing the module and dropping its functions.
func LoadArtifact(a *artifact.Artifact, dir string) (*Module, error) {
	path, err := WriteHostLib(a, dir)
	if err != nil {
		return nil, fmt.Errorf("load artifact: %w", err)
	}
	m, err := LoadModule(path)
	if err != nil {
		return nil, fmt.Errorf("load artifact: %w", err)
	}
	return m, nil
}

// WriteHostLib writes the artifact's host library into dir, in a fresh
// file whose name carries the library's digest, and returns its path.
func WriteHostLib(a *artifact.Artifact, dir string) (string, error) {
	lib, ok := a.Files[artifact.HostLib]
	if !ok {
		return "", fmt.Errorf("no %s in it (entries: %v)", artifact.HostLib, a.Names())
	}
	digest := a.Manifest.Entries[artifact.HostLib]
	if len(digest) > 16 {
		digest = digest[:16]
	}
	f, err := os.CreateTemp(dir, "host-"+digest+"-*.so")
	if err != nil {
		return "", err
	}
	_, werr := f.Write(lib)
	cerr := f.Close()
	if werr != nil || cerr != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("write %s: %w", filepath.Base(f.Name()), firstErr(werr, cerr))
	}
	return f.Name(), nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
