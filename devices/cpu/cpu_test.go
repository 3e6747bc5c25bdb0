package cpu_test

import (
	"testing"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/devicetest"
	"github.com/kiln-ml/kiln/internal/check"
)

func TestConformance(t *testing.T) {
	api, err := devices.Get(devices.CPU)
	check.NoError(t, err)
	devicetest.Run(t, api, devices.CPUDevice, devicetest.BadScopes("shared.dyn", "shared", "local"))
}
