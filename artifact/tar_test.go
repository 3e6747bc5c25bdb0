package artifact_test

import (
	"bytes"
	"testing"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/internal/check"
)

func TestTarExportRoundTrip(t *testing.T) {
	a := artifact.New("cpu", "cc test")
	check.NoError(t, a.Add(artifact.HostLib, []byte("\x7fELF fake")))
	check.NoError(t, a.Add("device/k.ptx", []byte(".version 8.0")))
	var buf bytes.Buffer
	check.NoError(t, a.WriteTar(&buf))
	check.True(t, artifact.IsTar(buf.Bytes()), "a tar header")
	check.True(t, !artifact.IsTar([]byte("PK\x03\x04")), "a zip is not a tar")

	lib, err := artifact.ReadTarEntry(bytes.NewReader(buf.Bytes()), artifact.TarLinked)
	check.NoError(t, err)
	check.Equal(t, string(lib), "\x7fELF fake")
	back, err := artifact.ReadTar(bytes.NewReader(buf.Bytes()))
	check.NoError(t, err)
	check.Equal(t, string(back.Files["device/k.ptx"]), ".version 8.0")
	check.Equal(t, back.Manifest.Target, "cpu")

	_, err = artifact.ReadTarEntry(bytes.NewReader(buf.Bytes()), "missing")
	check.ErrorIs(t, err, artifact.ErrCorrupt)
}
