package cpu_test

import (
	"os"
	"testing"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

func TestLoadArtifact(t *testing.T) {
	lib, err := os.ReadFile(buildSO(t, "kernels"))
	check.NoError(t, err)
	a := artifact.New("c", "test")
	check.NoError(t, a.Add(artifact.HostLib, lib))
	b, err := a.Bytes()
	check.NoError(t, err)
	path := t.TempDir() + "/k.kiln"
	check.NoError(t, os.WriteFile(path, b, 0o644))
	loaded, err := artifact.Load(path)
	check.NoError(t, err)

	m, err := cpu.LoadArtifact(loaded, t.TempDir())
	check.NoError(t, err)
	defer m.Close()
	f, err := m.GetFunction("fill_index")
	check.NoError(t, err)
	x, err := ndarray.Empty(ndarray.Shape{3}, ndarray.Int32, devices.CPUDevice)
	check.NoError(t, err)
	_, err = f.Call(packedfunc.Array(x), packedfunc.Int(10))
	check.NoError(t, err)
	got, err := ndarray.ToSlice[int32](x)
	check.NoError(t, err)
	check.Equal(t, got, []int32{10, 11, 12})

	_, err = cpu.LoadArtifact(artifact.New("c", "test"), t.TempDir())
	check.Error(t, err, "no host.so")
}
