package cuda

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
)

// HostModule is an artifact built for cuda, loaded on one GPU: its device
// code (a cubin for the device's architecture when the artifact has one,
// else the PTX, which the driver compiles) is loaded once, and its host
// functions (from host.so) check their arguments (tensors on this device)
// and launch the kernels through the driver with the launch dimensions
// they compute. A failed launch is an error naming the function, the
// kernel and the CUDA error. Kernels run on the default stream: results
// are read after it is synchronized (NDArray copies do).
type HostModule struct {
	*cpu.Module
	dev    devices.Device
	ctx    uintptr
	meta   *abi.DeviceMetadata
	image  string
	host   unsafe.Pointer // the C struct kiln_host_mod launches use
	mu     sync.Mutex
	handle uintptr // the CUmodule; 0 once closed
}

// LoadArtifact loads a cuda artifact on dev, writing its host library into
// dir (which the caller removes after closing the module). An artifact
// built for another target, one without device code, or one for a newer
// architecture than the device's is refused, naming both.
func LoadArtifact(dev devices.Device, a *artifact.Artifact, dir string) (*HostModule, error) {
	fail := func(err error) (*HostModule, error) {
		return nil, fmt.Errorf("load artifact on %s: %w", dev, err)
	}
	kind, _, _ := strings.Cut(a.Manifest.Target, " ")
	if kind != "cuda" {
		return fail(fmt.Errorf("the artifact is built for %q, not cuda", a.Manifest.Target))
	}
	mj, ok := a.Files[abi.DeviceMetadataName]
	if !ok {
		return fail(fmt.Errorf("no %s in it (entries: %v)", abi.DeviceMetadataName, a.Names()))
	}
	meta, err := abi.ParseDeviceMetadata(mj)
	if err != nil {
		return fail(err)
	}
	g, err := lookup(dev)
	if err != nil {
		return nil, err
	}
	ctx, err := contextOf(dev)
	if err != nil {
		return nil, err
	}
	major, err := deviceAttr(g.dev, attrComputeCapabilityMajor)
	if err != nil {
		return fail(err)
	}
	minor, err := deviceAttr(g.dev, attrComputeCapabilityMinor)
	if err != nil {
		return fail(err)
	}
	devArch := fmt.Sprintf("sm_%d%d", major, minor)
	built, _ := strconv.Atoi(strings.TrimPrefix(meta.Arch, "sm_"))
	if major*10+minor < built {
		return fail(fmt.Errorf("%s is %s (compute capability %d.%d); the artifact is built for %s and needs a device at least that new", dev, devArch, major, minor, meta.Arch))
	}
	var image, what string
	if name, ok := meta.Cubins[devArch]; ok {
		image, what = string(a.Files[name]), "cubin "+devArch
	} else if meta.PTX != "" {
		image, what = string(a.Files[meta.PTX]), "PTX for "+meta.Arch
	}
	if image == "" {
		return fail(fmt.Errorf("the artifact has no cubin for %s and no PTX", devArch))
	}
	handle, err := moduleLoad(ctx, image)
	if err != nil {
		return fail(withOp(err, "load the device code ("+what+")"))
	}
	unload := func(err error) (*HostModule, error) {
		_ = moduleUnload(ctx, handle)
		return fail(err)
	}
	fns := make([]uintptr, len(meta.Kernels))
	optin, _ := deviceAttr(g.dev, attrMaxSharedMemPerBlockOptin)
	for i, k := range meta.Kernels {
		fn, err := moduleFunction(ctx, handle, k.Name)
		if err != nil {
			return unload(err)
		}
		if err := allowDynamicShared(ctx, fn, dev, k.Name, int(k.DynamicSharedBytes), optin); err != nil {
			return unload(err)
		}
		fns[i] = fn
	}

	path, err := cpu.WriteHostLib(a, dir)
	if err != nil {
		return unload(err)
	}
	hm, err := cpu.LoadDeviceHost(path, dev)
	if err != nil {
		return unload(err)
	}
	hook, slot := hm.Symbol(abi.DeviceLaunchHook), hm.Symbol(abi.DeviceModuleSymbol)
	if hook == nil || slot == nil {
		hm.Close()
		return unload(fmt.Errorf("%s exports no %s and %s: it launches no device code", artifact.HostLib, abi.DeviceLaunchHook, abi.DeviceModuleSymbol))
	}
	host := hostModNew(ctx, fns)
	if host == nil {
		hm.Close()
		return unload(fmt.Errorf("out of host memory"))
	}
	hostInstall(hook, slot, host)
	return &HostModule{Module: hm, dev: dev, ctx: ctx, meta: meta, image: what, host: host, handle: handle}, nil
}

// Type is "cuda".
func (m *HostModule) Type() string { return "cuda" }

// Device is the GPU the module is loaded on.
func (m *HostModule) Device() devices.Device { return m.dev }

// DeviceMetadata is the artifact's device metadata (kernels and their
// launch metadata).
func (m *HostModule) DeviceMetadata() *abi.DeviceMetadata { return m.meta }

// Image says which device code was loaded: "cubin sm_90" or "PTX for sm_80".
func (m *HostModule) Image() string { return m.image }

// Close unloads the device code: later calls fail with an error saying
// so. The host library stays mapped (see cpu.Module.Close). Close is
// idempotent.
func (m *HostModule) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.handle == 0 {
		return nil
	}
	hostModClose(m.host)
	m.Module.Close()
	h := m.handle
	m.handle = 0
	return withOp(moduleUnload(m.ctx, h), "unload module on "+m.dev.String())
}
