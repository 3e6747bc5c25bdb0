// Package cuda is the NVIDIA GPU backend: a DeviceAPI over the CUDA driver
// API, PTX modules whose kernels are packedfunc Funcs, NVRTC compilation,
// event timing and NVML telemetry.
//
// Nothing here needs CUDA headers or the toolkit to build: the driver
// (libcuda.so.1) and NVRTC (libnvrtc.so) are opened with dlopen at run time
// and NVML through go-nvml, which does the same. Importing cuda registers the
// backend with package devices when a driver and a device are present, and
// otherwise marks CUDA absent with the reason (see Available).
//
// Every device is used through its primary context, made current on the
// calling OS thread inside each C call, so goroutines may call in from any
// thread. cuda imports devices, ndarray and packedfunc; the compiler must
// not import it.
package cuda

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"unsafe"

	"github.com/kiln-ml/kiln/devices"
)

// driver is the state found at init.
var driver struct {
	ok     bool
	reason string
	gpus   []gpu
}

// gpu is one device ordinal and its primary context, retained on first use
// (retaining creates the context, which costs device memory).
type gpu struct {
	dev  int // the CUdevice
	once sync.Once
	ctx  uintptr
	err  error
}

func init() {
	if reason := start(); reason != "" {
		driver.reason = reason
		devices.MarkAbsent(devices.CUDA, reason)
		return
	}
	driver.ok = true
	devices.Register(api{})
}

// start loads the driver, initializes it and lists the devices; it returns
// why CUDA cannot be used, or "".
func start() string {
	if reason := loadDriver(); reason != "" {
		return reason
	}
	if err := driverInit(); err != nil {
		return "cuInit: " + describe(err)
	}
	n, err := deviceCount()
	if err != nil {
		return "cuDeviceGetCount: " + describe(err)
	}
	if n == 0 {
		return "cuDeviceGetCount: the driver reports no CUDA device"
	}
	driver.gpus = make([]gpu, n)
	for i := range driver.gpus {
		d, err := deviceGet(i)
		if err != nil {
			driver.gpus = nil
			return "cuDeviceGet: " + describe(err)
		}
		driver.gpus[i].dev = d
	}
	return ""
}

// describe is an *Error's name and message without its operation.
func describe(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Name + ": " + e.Msg
	}
	return err.Error()
}

// Available reports whether the CUDA backend is usable and, when it is not,
// why (no driver library, cuInit failed, no device).
func Available() (bool, string) { return driver.ok, driver.reason }

// lookup returns the gpu of a device, without touching its context.
func lookup(dev devices.Device) (*gpu, error) {
	if dev.Type != devices.CUDA {
		return nil, fmt.Errorf("cuda: device %s is not a cuda device", dev)
	}
	if !driver.ok {
		return nil, fmt.Errorf("%w %s: %s", devices.ErrNoBackend, devices.CUDA, driver.reason)
	}
	if dev.ID < 0 || int(dev.ID) >= len(driver.gpus) {
		return nil, fmt.Errorf("%w: %s (%d present)", devices.ErrNoDevice, dev, len(driver.gpus))
	}
	return &driver.gpus[dev.ID], nil
}

// contextOf returns the primary context of a device, retaining it the first
// time.
func contextOf(dev devices.Device) (uintptr, error) {
	g, err := lookup(dev)
	if err != nil {
		return 0, err
	}
	g.once.Do(func() {
		g.ctx, g.err = primaryContext(g.dev)
		if g.err != nil {
			g.err = withOp(g.err, "retain primary context of "+dev.String())
		}
	})
	return g.ctx, g.err
}

// overAligned maps the aligned address handed out for an alignment above
// what cuMemAlloc gave to the address cuMemAlloc returned.
var overAligned struct {
	sync.Mutex
	base map[devices.Ptr]uint64
}

type api struct{}

func (api) Type() devices.Type { return devices.CUDA }
func (api) Count() int         { return len(driver.gpus) }

func checkScope(scope string) error {
	if scope != "" && scope != "global" {
		return fmt.Errorf("%w %q on cuda (cuda allocates \"global\" memory from the host)", devices.ErrBadScope, scope)
	}
	return nil
}

// Alloc allocates with cuMemAlloc (256-byte aligned or better). Larger
// alignments are met by allocating align-1 extra bytes.
func (api) Alloc(dev devices.Device, nbytes int64, align int, scope string) (devices.Ptr, error) {
	if err := checkScope(scope); err != nil {
		return 0, err
	}
	if nbytes < 0 {
		return 0, fmt.Errorf("cuda alloc: negative size %d", nbytes)
	}
	if align < 1 {
		align = 1 // no requirement beyond cuMemAlloc's own
	}
	if bits.OnesCount(uint(align)) != 1 {
		return 0, fmt.Errorf("cuda alloc: alignment %d is not a power of two", align)
	}
	ctx, err := contextOf(dev)
	if err != nil {
		return 0, err
	}
	n := max(nbytes, 1)
	p, err := memAlloc(ctx, n)
	if err != nil {
		return 0, withOp(err, fmt.Sprintf("alloc %d bytes on %s", nbytes, dev))
	}
	if p%uint64(align) == 0 {
		return devices.Ptr(p), nil
	}
	// Rare: ask for more and round up.
	if err := memFree(ctx, p); err != nil {
		return 0, withOp(err, fmt.Sprintf("free on %s", dev))
	}
	base, err := memAlloc(ctx, n+int64(align)-1)
	if err != nil {
		return 0, withOp(err, fmt.Sprintf("alloc %d bytes aligned to %d on %s", nbytes, align, dev))
	}
	aligned := devices.Ptr((base + uint64(align) - 1) &^ (uint64(align) - 1))
	overAligned.Lock()
	if overAligned.base == nil {
		overAligned.base = map[devices.Ptr]uint64{}
	}
	overAligned.base[aligned] = base
	overAligned.Unlock()
	return aligned, nil
}

// Free releases memory from Alloc; a zero pointer is ignored.
func (api) Free(dev devices.Device, p devices.Ptr) error {
	if p == 0 {
		return nil
	}
	ctx, err := contextOf(dev)
	if err != nil {
		return err
	}
	base := uint64(p)
	overAligned.Lock()
	if b, ok := overAligned.base[p]; ok {
		base = b
		delete(overAligned.base, p)
	}
	overAligned.Unlock()
	if err := memFree(ctx, base); err != nil {
		return withOp(err, fmt.Sprintf("free %#x on %s", uint64(p), dev))
	}
	return nil
}

// Copy copies between device memory and host (C) memory or between device
// memory. On stream 0 it returns when the copy is done (host to device:
// when the source may be reused); on another stream it is queued, and the
// host memory involved must stay valid until StreamSync. A copy between two
// GPUs runs in the destination's context and s must be a stream of the
// destination device.
func (api) Copy(dst devices.Ptr, dstDev devices.Device, src devices.Ptr, srcDev devices.Device, nbytes int64, s devices.Stream) error {
	if nbytes < 0 {
		return fmt.Errorf("cuda copy %s -> %s: negative size %d", srcDev, dstDev, nbytes)
	}
	if nbytes == 0 {
		return nil
	}
	err := copyAny(dst, dstDev, src, srcDev, nbytes, uintptr(s))
	if err != nil {
		return withOp(err, fmt.Sprintf("copy %d bytes %s -> %s", nbytes, srcDev, dstDev))
	}
	return nil
}

func copyAny(dst devices.Ptr, dstDev devices.Device, src devices.Ptr, srcDev devices.Device, nbytes int64, s uintptr) error {
	switch {
	case dstDev.Type == devices.CUDA && srcDev.Type == devices.CUDA:
		dctx, err := contextOf(dstDev)
		if err != nil {
			return err
		}
		if dstDev.ID == srcDev.ID {
			return memcpyDtoD(dctx, uint64(dst), uint64(src), nbytes, s)
		}
		sctx, err := contextOf(srcDev)
		if err != nil {
			return err
		}
		return memcpyPeer(dctx, uint64(dst), dctx, uint64(src), sctx, nbytes, s)
	case dstDev.Type == devices.CUDA && srcDev.Type == devices.CPU:
		ctx, err := contextOf(dstDev)
		if err != nil {
			return err
		}
		return memcpyHtoD(ctx, uint64(dst), src.Unsafe(), nbytes, s, false)
	case dstDev.Type == devices.CPU && srcDev.Type == devices.CUDA:
		ctx, err := contextOf(srcDev)
		if err != nil {
			return err
		}
		return memcpyDtoH(ctx, dst.Unsafe(), uint64(src), nbytes, s, false)
	}
	return fmt.Errorf("cuda copy %s -> %s: the cuda backend copies between cuda devices and the cpu only", srcDev, dstDev)
}

// CopyFromHost copies a Go byte slice to device memory. It returns once
// the slice is no longer needed, on any stream.
func (api) CopyFromHost(dst devices.Ptr, dev devices.Device, src []byte, s devices.Stream) error {
	if len(src) == 0 {
		return nil
	}
	ctx, err := contextOf(dev)
	if err != nil {
		return err
	}
	if err := memcpyHtoD(ctx, uint64(dst), unsafe.Pointer(&src[0]), int64(len(src)), uintptr(s), true); err != nil {
		return withOp(err, fmt.Sprintf("copy %d bytes from host to %s", len(src), dev))
	}
	return nil
}

// CopyToHost copies device memory into a Go byte slice. It returns once
// the data is in the slice, on any stream.
func (api) CopyToHost(dst []byte, src devices.Ptr, dev devices.Device, s devices.Stream) error {
	if len(dst) == 0 {
		return nil
	}
	ctx, err := contextOf(dev)
	if err != nil {
		return err
	}
	if err := memcpyDtoH(ctx, unsafe.Pointer(&dst[0]), uint64(src), int64(len(dst)), uintptr(s), true); err != nil {
		return withOp(err, fmt.Sprintf("copy %d bytes from %s to host", len(dst), dev))
	}
	return nil
}

// CreateStream makes a stream (CU_STREAM_DEFAULT: it also orders with the
// legacy default stream 0).
func (api) CreateStream(dev devices.Device) (devices.Stream, error) {
	ctx, err := contextOf(dev)
	if err != nil {
		return 0, err
	}
	s, err := streamCreate(ctx)
	if err != nil {
		return 0, withOp(err, "create stream on "+dev.String())
	}
	return devices.Stream(s), nil
}

// FreeStream destroys a stream; the default stream 0 is ignored.
func (api) FreeStream(dev devices.Device, s devices.Stream) error {
	if s == 0 {
		return nil
	}
	ctx, err := contextOf(dev)
	if err != nil {
		return err
	}
	if err := streamDestroy(ctx, uintptr(s)); err != nil {
		return withOp(err, "destroy stream on "+dev.String())
	}
	return nil
}

// StreamSync waits for the work queued on s; for the default stream 0 it
// waits for all work on the device (cuCtxSynchronize).
func (api) StreamSync(dev devices.Device, s devices.Stream) error {
	ctx, err := contextOf(dev)
	if err != nil {
		return err
	}
	if err := streamSync(ctx, uintptr(s)); err != nil {
		return withOp(err, "synchronize stream on "+dev.String())
	}
	return nil
}

// CUdevice_attribute values (cuda.h).
const (
	attrMaxThreadsPerBlock        = 1
	attrMaxBlockDimX              = 2
	attrMaxGridDimX               = 5
	attrMaxSharedMemoryPerBlock   = 8
	attrWarpSize                  = 10
	attrClockRate                 = 13
	attrMultiprocessorCount       = 16
	attrL2CacheSize               = 38
	attrComputeCapabilityMajor    = 75
	attrComputeCapabilityMinor    = 76
	attrMaxSharedMemPerBlockOptin = 97
)

// Attr reports a device attribute. The compute version is a string
// ("9.0"), the driver version an int64 as CUDA encodes it (12040 for 12.4),
// the clock rate in kHz, memory sizes in bytes.
func (api) Attr(dev devices.Device, kind devices.AttrKind) (any, error) {
	if kind == devices.AttrExist {
		if dev.Type == devices.CUDA && dev.ID >= 0 && int(dev.ID) < len(driver.gpus) {
			return int64(1), nil
		}
		return int64(0), nil
	}
	g, err := lookup(dev)
	if err != nil {
		return nil, err
	}
	v, err := attr(dev, g, kind)
	if err != nil {
		return nil, fmt.Errorf("%w: %s on %s: %w", devices.ErrUnsupportedAttr, kind, dev, err)
	}
	return v, nil
}

func attr(dev devices.Device, g *gpu, kind devices.AttrKind) (any, error) {
	intAttr := func(a int) (any, error) {
		v, err := deviceAttr(g.dev, a)
		return int64(v), err
	}
	switch kind {
	case devices.AttrName:
		return deviceName(g.dev)
	case devices.AttrMaxThreadsPerBlock:
		return intAttr(attrMaxThreadsPerBlock)
	case devices.AttrWarpSize:
		return intAttr(attrWarpSize)
	case devices.AttrMaxSharedMemoryPerBlock:
		return intAttr(attrMaxSharedMemoryPerBlock)
	case devices.AttrComputeVersion:
		major, err := deviceAttr(g.dev, attrComputeCapabilityMajor)
		if err != nil {
			return nil, err
		}
		minor, err := deviceAttr(g.dev, attrComputeCapabilityMinor)
		if err != nil {
			return nil, err
		}
		return fmt.Sprintf("%d.%d", major, minor), nil
	case devices.AttrMultiProcessorCount:
		return intAttr(attrMultiprocessorCount)
	case devices.AttrTotalGlobalMemory:
		return deviceTotalMem(g.dev)
	case devices.AttrAvailableGlobalMemory:
		ctx, err := contextOf(dev)
		if err != nil {
			return nil, err
		}
		free, _, err := memInfo(ctx)
		return free, err
	case devices.AttrL2CacheSize:
		return intAttr(attrL2CacheSize)
	case devices.AttrClockRate:
		return intAttr(attrClockRate)
	case devices.AttrDriverVersion:
		v, err := driverVersion()
		return int64(v), err
	}
	return nil, fmt.Errorf("no such attribute on cuda")
}
