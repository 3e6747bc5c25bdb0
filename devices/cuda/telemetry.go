package cuda

import (
	"errors"
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kiln-ml/kiln/devices"
)

// DeviceTelemetry is what NVML reports about a GPU at one moment.
type DeviceTelemetry struct {
	Name              string
	PCIBusID          string   // as CUDA reports it ("0000:01:00.0"), "" when CUDA is absent
	MemoryUsed        uint64   // bytes
	MemoryTotal       uint64   // bytes
	GPUUtilization    uint32   // percent of the last sample period a kernel ran
	MemoryUtilization uint32   // percent of the last sample period memory was read or written
	TemperatureC      uint32   // GPU core, degrees Celsius
	SMClockMHz        uint32   // current SM clock
	MemClockMHz       uint32   // current memory clock
	Missing           []string // fields NVML could not report (left zero)
}

var nvmlInit = sync.OnceValue(func() error {
	if r := nvml.Init(); r != nvml.SUCCESS {
		if r == nvml.ERROR_LIBRARY_NOT_FOUND {
			return errors.New("nvml: libnvidia-ml.so.1 not found: no NVIDIA driver on this machine")
		}
		return fmt.Errorf("nvml init: %s", nvml.ErrorString(r))
	}
	return nil
})

// Telemetry reads a GPU's name, memory, utilization, temperature and clocks
// through NVML. The device is matched to NVML's by PCI bus id, so the CUDA
// ordinal is honoured under CUDA_VISIBLE_DEVICES. Without NVML it returns
// an error.
func Telemetry(dev devices.Device) (DeviceTelemetry, error) {
	var t DeviceTelemetry
	if dev.Type != devices.CUDA {
		return t, fmt.Errorf("telemetry: %s is not a cuda device", dev)
	}
	if err := nvmlInit(); err != nil {
		return t, fmt.Errorf("telemetry of %s: %w", dev, err)
	}
	var h nvml.Device
	var r nvml.Return
	if driver.ok {
		g, err := lookup(dev)
		if err != nil {
			return t, fmt.Errorf("telemetry: %w", err)
		}
		bus, err := devicePCIBusID(g.dev)
		if err != nil {
			return t, fmt.Errorf("telemetry of %s: %w", dev, err)
		}
		t.PCIBusID = bus
		if h, r = nvml.DeviceGetHandleByPciBusId(bus); r != nvml.SUCCESS {
			return t, fmt.Errorf("telemetry of %s: nvml device with pci bus id %q: %s", dev, bus, nvml.ErrorString(r))
		}
	} else if h, r = nvml.DeviceGetHandleByIndex(int(dev.ID)); r != nvml.SUCCESS {
		return t, fmt.Errorf("telemetry of %s: nvml device %d: %s", dev, dev.ID, nvml.ErrorString(r))
	}
	name, r := h.GetName()
	if r != nvml.SUCCESS {
		return t, fmt.Errorf("telemetry of %s: nvml name: %s", dev, nvml.ErrorString(r))
	}
	t.Name = name
	mem, r := h.GetMemoryInfo()
	if r != nvml.SUCCESS {
		return t, fmt.Errorf("telemetry of %s: nvml memory info: %s", dev, nvml.ErrorString(r))
	}
	t.MemoryUsed, t.MemoryTotal = mem.Used, mem.Total
	if u, r := h.GetUtilizationRates(); r == nvml.SUCCESS {
		t.GPUUtilization, t.MemoryUtilization = u.Gpu, u.Memory
	} else {
		t.Missing = append(t.Missing, "utilization")
	}
	if c, r := h.GetTemperature(nvml.TEMPERATURE_GPU); r == nvml.SUCCESS {
		t.TemperatureC = c
	} else {
		t.Missing = append(t.Missing, "temperature")
	}
	if c, r := h.GetClockInfo(nvml.CLOCK_SM); r == nvml.SUCCESS {
		t.SMClockMHz = c
	} else {
		t.Missing = append(t.Missing, "sm_clock")
	}
	if c, r := h.GetClockInfo(nvml.CLOCK_MEM); r == nvml.SUCCESS {
		t.MemClockMHz = c
	} else {
		t.Missing = append(t.Missing, "mem_clock")
	}
	return t, nil
}
