package abi

import (
	"encoding/json"
	"fmt"
	"regexp"
)

// DeviceMetadataName is the artifact entry that describes a module's
// device code (device/kernels.json).
const DeviceMetadataName = "device/kernels.json"

// DeviceMetadata describes the device code of a module built for a GPU:
// the files holding it and every kernel the host functions launch. The
// host library launches kernel i of Kernels through the backend's launch
// hook (see DeviceLaunchHook), so their order is part of the ABI.
type DeviceMetadata struct {
	// FormatVersion is Version.
	FormatVersion int `json:"format_version"`
	// Kind is the device kind, "cuda".
	Kind string `json:"kind"`
	// Arch is the architecture the module was built for ("sm_80").
	Arch string `json:"arch"`
	// PTX is the artifact entry of the module's PTX (for Arch's virtual
	// architecture; the driver compiles it for newer devices).
	PTX string `json:"ptx"`
	// Cubins maps an architecture to the artifact entry of its machine code.
	Cubins map[string]string `json:"cubins"`
	// Kernels are the module's kernels, in launch-index order.
	Kernels []DeviceKernel `json:"kernels"`
}

// DeviceKernel is one kernel and its launch metadata.
type DeviceKernel struct {
	// Name is the kernel's symbol.
	Name string `json:"name"`
	// Func is the host function that launches it.
	Func string `json:"func"`
	// Grid and Block are the launch dimensions (x, y, z); a grid
	// dimension of 0 is not a constant: the host function computes it for
	// each call.
	Grid  [3]int64 `json:"grid"`
	Block [3]int64 `json:"block"`
	// SharedBytes is the static shared memory of one block.
	SharedBytes int64 `json:"shared_bytes"`
	// DynamicSharedBytes is the dynamic shared memory of one block.
	DynamicSharedBytes int64 `json:"dynamic_shared_bytes,omitempty"`
	// Params are the kernel's parameters, in order.
	Params []DeviceParam `json:"params"`
	// Registers and spills per architecture, from ptxas's report.
	Resources map[string]DeviceResources `json:"resources,omitempty"`
}

// DeviceParam is one kernel parameter.
type DeviceParam struct {
	Name string `json:"name"`
	// DType is the element type of a pointer, or the scalar's type.
	DType string `json:"dtype"`
	// Pointer is set for a pointer to device memory.
	Pointer bool `json:"pointer,omitempty"`
}

// DeviceResources are a kernel's resources on one architecture.
type DeviceResources struct {
	Registers   int64 `json:"registers"`
	SpillStores int64 `json:"spill_stores"`
	SpillLoads  int64 `json:"spill_loads"`
	SharedBytes int64 `json:"shared_bytes"`
}

// DeviceLaunchHook and DeviceModuleSymbol are the variables a host library
// with device code exports: the backend that loads the device code stores
// its launch function and its module's handle there before any call. The
// launch function has the C type
//
//	int32_t launch(void* module, int32_t kernel, const int64_t* dims /* grid x,y,z, block x,y,z */,
//	               int32_t shared_bytes, void** args, char* err, int32_t err_len);
//
// and returns non-zero after writing a NUL-terminated message to err.
const (
	DeviceLaunchHook   = "kiln_device_launch"
	DeviceModuleSymbol = "kiln_device_module"
)

var (
	identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	archRE  = regexp.MustCompile(`^sm_[0-9]{2,3}$`)
	dtypeRE = regexp.MustCompile(`^(bool|u?int(8|16|32|64)|float(16|32|64)|bfloat16|float8_e4m3|float8_e5m2)$`)
)

// maxLaunchDim bounds a recorded launch dimension (CUDA's grid x limit).
const maxLaunchDim = 1<<31 - 1

// ParseDeviceMetadata decodes and validates a device metadata document:
// known kind, architecture names, kernel names that are C identifiers and
// unique, launch dimensions in 1..2^31-1 (0 for a grid dimension computed
// at launch), known parameter types.
func ParseDeviceMetadata(b []byte) (*DeviceMetadata, error) {
	var m DeviceMetadata
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("device metadata: %w", err)
	}
	if m.FormatVersion != Version {
		return nil, fmt.Errorf("device metadata: format version %d, this kiln reads %d", m.FormatVersion, Version)
	}
	if m.Kind != "cuda" {
		return nil, fmt.Errorf("device metadata: kind %q, want cuda", m.Kind)
	}
	if !archRE.MatchString(m.Arch) {
		return nil, fmt.Errorf("device metadata: architecture %q is not sm_NN", m.Arch)
	}
	if m.PTX == "" && len(m.Cubins) == 0 {
		return nil, fmt.Errorf("device metadata: neither PTX nor a cubin")
	}
	for arch := range m.Cubins {
		if !archRE.MatchString(arch) {
			return nil, fmt.Errorf("device metadata: cubin architecture %q is not sm_NN", arch)
		}
	}
	seen := map[string]bool{}
	for i, k := range m.Kernels {
		if !identRE.MatchString(k.Name) {
			return nil, fmt.Errorf("device metadata: kernel %d: name %q is not a C identifier", i, k.Name)
		}
		if seen[k.Name] {
			return nil, fmt.Errorf("device metadata: kernel %q listed twice", k.Name)
		}
		seen[k.Name] = true
		for j := range 3 {
			for _, d := range []struct {
				what string
				v    int64
			}{{"grid", k.Grid[j]}, {"block", k.Block[j]}} {
				if d.v < 0 || d.v > maxLaunchDim || (d.v == 0 && d.what == "block") {
					return nil, fmt.Errorf("device metadata: kernel %q: %s dimension %c is %d (want 1..%d, or 0 for a computed grid dimension)", k.Name, d.what, "xyz"[j], d.v, maxLaunchDim)
				}
			}
		}
		if k.SharedBytes < 0 || k.DynamicSharedBytes < 0 || k.SharedBytes+k.DynamicSharedBytes > maxLaunchDim {
			return nil, fmt.Errorf("device metadata: kernel %q: shared memory %d+%d bytes out of range", k.Name, k.SharedBytes, k.DynamicSharedBytes)
		}
		for j, p := range k.Params {
			if !dtypeRE.MatchString(p.DType) {
				return nil, fmt.Errorf("device metadata: kernel %q parameter %d (%q): unknown dtype %q", k.Name, j, p.Name, p.DType)
			}
		}
	}
	return &m, nil
}
