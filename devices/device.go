// Package devices owns the DeviceAPI interface — allocate, free, copy,
// synchronize and describe the memory of one kind of device — and the
// registry of backends by device type.
//
// devices is the bottom of kiln's runtime: it must not import ndarray,
// packedfunc or any backend. Backends (devices/cpu, devices/cuda) register
// themselves from their init functions.
package devices

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

// Type is a device type, numbered as in DLPack.
type Type int32

// Device types kiln knows.
const (
	CPU      Type = 1
	CUDA     Type = 2
	CUDAHost Type = 3
)

// String returns the device type's name ("cpu", "cuda").
func (t Type) String() string {
	switch t {
	case CPU:
		return "cpu"
	case CUDA:
		return "cuda"
	case CUDAHost:
		return "cuda_host"
	}
	return "device_type(" + strconv.Itoa(int(t)) + ")"
}

// ParseType parses a device type name.
func ParseType(s string) (Type, error) {
	switch strings.ToLower(s) {
	case "cpu", "llvm", "c":
		return CPU, nil
	case "cuda", "gpu":
		return CUDA, nil
	case "cuda_host":
		return CUDAHost, nil
	}
	return 0, fmt.Errorf("unknown device type %q (want cpu or cuda)", s)
}

// Device is one device: a type and an ordinal.
type Device struct {
	Type Type
	ID   int32
}

// CPUDevice is the host CPU.
var CPUDevice = Device{Type: CPU}

// String formats the device as "cpu:0".
func (d Device) String() string { return d.Type.String() + ":" + strconv.Itoa(int(d.ID)) }

// ParseDevice parses "cpu", "cuda:1".
func ParseDevice(s string) (Device, error) {
	name, id, found := strings.Cut(s, ":")
	t, err := ParseType(name)
	if err != nil {
		return Device{}, err
	}
	d := Device{Type: t}
	if found {
		n, err := strconv.ParseInt(id, 10, 32)
		if err != nil || n < 0 {
			return Device{}, fmt.Errorf("device %q: bad ordinal %q", s, id)
		}
		d.ID = int32(n)
	}
	return d, nil
}

// Ptr is an address in a device's memory. For the CPU it is an ordinary C
// pointer; for CUDA a CUdeviceptr. It is never a pointer into the Go heap.
type Ptr uintptr

// Stream is a backend's stream handle; 0 is the default stream.
type Stream uintptr

// AttrKind names a device attribute, as TVM's DeviceAttrKind does.
type AttrKind int

// Device attributes.
const (
	AttrExist AttrKind = iota
	AttrName
	AttrMaxThreadsPerBlock
	AttrWarpSize
	AttrMaxSharedMemoryPerBlock
	AttrComputeVersion
	AttrMultiProcessorCount
	AttrTotalGlobalMemory
	AttrAvailableGlobalMemory
	AttrL2CacheSize
	AttrClockRate
	AttrDriverVersion
	numAttrs
)

var attrNames = [...]string{
	AttrExist:                   "exist",
	AttrName:                    "name",
	AttrMaxThreadsPerBlock:      "max_threads_per_block",
	AttrWarpSize:                "warp_size",
	AttrMaxSharedMemoryPerBlock: "max_shared_memory_per_block",
	AttrComputeVersion:          "compute_version",
	AttrMultiProcessorCount:     "multi_processor_count",
	AttrTotalGlobalMemory:       "total_global_memory",
	AttrAvailableGlobalMemory:   "available_global_memory",
	AttrL2CacheSize:             "l2_cache_size",
	AttrClockRate:               "clock_rate_khz",
	AttrDriverVersion:           "driver_version",
}

// String returns the attribute's snake_case name.
func (k AttrKind) String() string {
	if k >= 0 && k < numAttrs {
		return attrNames[k]
	}
	return "attr(" + strconv.Itoa(int(k)) + ")"
}

// AllAttrs lists every attribute kind in order.
func AllAttrs() []AttrKind {
	out := make([]AttrKind, numAttrs)
	for i := range out {
		out[i] = AttrKind(i)
	}
	return out
}

// Sentinel errors callers branch on.
var (
	// ErrNoBackend: no DeviceAPI is registered for a device type.
	ErrNoBackend = errors.New("no backend for device type")
	// ErrUnsupportedAttr: the backend cannot report this attribute.
	ErrUnsupportedAttr = errors.New("attribute not supported")
	// ErrBadScope: the backend has no such memory scope.
	ErrBadScope = errors.New("unknown memory scope")
	// ErrNoDevice: the device ordinal does not exist.
	ErrNoDevice = errors.New("no such device")
)

// DeviceAPI is the interface every backend implements. Methods are safe for
// concurrent use. Copies and stream operations on a non-default stream are
// ordered on that stream; StreamSync waits for them.
type DeviceAPI interface {
	// Type is the device type this backend serves.
	Type() Type
	// Count is the number of devices of this type present.
	Count() int
	// Alloc allocates nbytes aligned to align bytes (a power of two) in the
	// memory scope ("" and "global" mean the device's main memory).
	Alloc(dev Device, nbytes int64, align int, scope string) (Ptr, error)
	// Free releases memory returned by Alloc.
	Free(dev Device, p Ptr) error
	// Copy copies nbytes from src on srcDev to dst on dstDev. One of the two
	// devices is of this backend's type; the other is that type or the CPU.
	Copy(dst Ptr, dstDev Device, src Ptr, srcDev Device, nbytes int64, s Stream) error
	// CopyFromHost copies a Go byte slice into device memory.
	CopyFromHost(dst Ptr, dev Device, src []byte, s Stream) error
	// CopyToHost copies device memory into a Go byte slice.
	CopyToHost(dst []byte, src Ptr, dev Device, s Stream) error
	// CreateStream makes a new stream on dev.
	CreateStream(dev Device) (Stream, error)
	// FreeStream destroys a stream made by CreateStream.
	FreeStream(dev Device, s Stream) error
	// StreamSync blocks until all work queued on s has finished.
	StreamSync(dev Device, s Stream) error
	// Attr reports one attribute: an int64 or a string. Unsupported ones
	// return ErrUnsupportedAttr; AttrExist never fails.
	Attr(dev Device, kind AttrKind) (any, error)
}

var registry struct {
	sync.RWMutex
	apis   map[Type]DeviceAPI
	absent map[Type]string
}

// Register installs the backend for its device type. Registering a second
// backend for a type panics: that is a broken build, not user input.
func Register(api DeviceAPI) {
	registry.Lock()
	defer registry.Unlock()
	if registry.apis == nil {
		registry.apis = map[Type]DeviceAPI{}
	}
	if _, dup := registry.apis[api.Type()]; dup {
		panic(fmt.Sprintf("devices: backend for %s registered twice", api.Type()))
	}
	registry.apis[api.Type()] = api
	delete(registry.absent, api.Type())
}

// MarkAbsent records why a backend compiled into this binary is not usable
// on this machine (no driver, no device); Get reports the reason.
func MarkAbsent(t Type, reason string) {
	registry.Lock()
	defer registry.Unlock()
	if registry.absent == nil {
		registry.absent = map[Type]string{}
	}
	registry.absent[t] = reason
}

// Absent returns the reason a device type is unusable, or "".
func Absent(t Type) string {
	registry.RLock()
	defer registry.RUnlock()
	return registry.absent[t]
}

// Get returns the backend for a device type.
func Get(t Type) (DeviceAPI, error) {
	registry.RLock()
	api, ok := registry.apis[t]
	why := registry.absent[t]
	registry.RUnlock()
	if ok {
		return api, nil
	}
	if why != "" {
		return nil, fmt.Errorf("%w %s: %s", ErrNoBackend, t, why)
	}
	return nil, fmt.Errorf("%w %s (is its package imported?)", ErrNoBackend, t)
}

// For returns the backend of a device, checking that the ordinal exists.
func For(dev Device) (DeviceAPI, error) {
	api, err := Get(dev.Type)
	if err != nil {
		return nil, err
	}
	if dev.ID < 0 || int(dev.ID) >= api.Count() {
		return nil, fmt.Errorf("%w: %s (%d present)", ErrNoDevice, dev, api.Count())
	}
	return api, nil
}

// Registered lists the registered backends by device type.
func Registered() []DeviceAPI {
	registry.RLock()
	defer registry.RUnlock()
	out := make([]DeviceAPI, 0, len(registry.apis))
	for _, a := range registry.apis {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Type() < out[j].Type() })
	return out
}

// AbsentTypes lists the device types marked absent with their reasons.
func AbsentTypes() map[Type]string {
	registry.RLock()
	defer registry.RUnlock()
	out := make(map[Type]string, len(registry.absent))
	for t, r := range registry.absent {
		out[t] = r
	}
	return out
}

// CopyBetween copies nbytes between any two devices, choosing the backend
// that can see both (the non-CPU one when they differ).
func CopyBetween(dst Ptr, dstDev Device, src Ptr, srcDev Device, nbytes int64, s Stream) error {
	t := dstDev.Type
	if t == CPU {
		t = srcDev.Type
	}
	if dstDev.Type != CPU && srcDev.Type != CPU && dstDev.Type != srcDev.Type {
		return fmt.Errorf("copy %s -> %s: copies between two kinds of accelerator go through the CPU", srcDev, dstDev)
	}
	api, err := Get(t)
	if err != nil {
		return err
	}
	return api.Copy(dst, dstDev, src, srcDev, nbytes, s)
}

// HostBytes returns the n bytes at a host (CPU) address as a byte slice that
// aliases that memory. It must only be used on CPU pointers, while the
// memory is alive.
func (p Ptr) HostBytes(n int64) []byte {
	if n == 0 || p == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(p.Unsafe()), n)
}

// Unsafe returns the address as an unsafe.Pointer for passing to C.
func (p Ptr) Unsafe() unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }
