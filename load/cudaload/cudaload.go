// Package cudaload lets package load run artifacts built for cuda:
// importing it registers devices/cuda's loader (the device code, and the
// host functions that launch it). The device daemon and the CLI import it;
// the C API's shared library does not, so it links no NVML.
package cudaload

import (
	"fmt"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/load"
	"github.com/kiln-ml/kiln/packedfunc"
)

func init() {
	load.Register(devices.CUDA, func(dev devices.Device, a *artifact.Artifact, dir string) (packedfunc.Module, error) {
		if ok, why := cuda.Available(); !ok {
			return nil, fmt.Errorf("load artifact: the artifact is built for %s, and this machine has no usable cuda device: %s", a.Manifest.Target, why)
		}
		m, err := cuda.LoadArtifact(dev, a, dir)
		if err != nil {
			return nil, err
		}
		return m, nil
	})
}
