package cuda

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// ParamKind is the C type of one kernel parameter.
type ParamKind string

// Kernel parameter kinds.
const (
	ParamPtr     ParamKind = "ptr"     // a pointer to device memory: pass an NDArray
	ParamInt32   ParamKind = "int32"   // int: pass an int Value
	ParamInt64   ParamKind = "int64"   // long long: pass an int Value
	ParamFloat32 ParamKind = "float32" // float: pass a float (or int) Value
	ParamFloat64 ParamKind = "float64" // double: pass a float (or int) Value
)

// size is the parameter's size in bytes as the kernel declares it.
func (k ParamKind) size() int {
	switch k {
	case ParamPtr, ParamInt64, ParamFloat64:
		return 8
	case ParamInt32, ParamFloat32:
		return 4
	}
	return 0
}

// KernelInfo describes one extern "C" __global__ function of a PTX module.
type KernelInfo struct {
	// Name is the kernel's symbol.
	Name string `json:"name"`
	// Params are the kinds of the kernel's parameters, in order.
	Params []ParamKind `json:"params"`
	// SharedMem is the dynamic shared memory of each block, in bytes.
	SharedMem int `json:"shared_mem,omitempty"`
}

// LaunchArgs is the number of launch dimensions that follow a kernel's
// parameters in a call: gridX, gridY, gridZ, blockX, blockY, blockZ.
const LaunchArgs = 6

var launchArgNames = [LaunchArgs]string{"gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"}

// ErrClosed reports a call into a module that was closed.
var ErrClosed = errors.New("module closed")

// Module is a loaded PTX module. Each kernel is a packedfunc.Func called as
//
//	f.Call(p0, …, pN-1, gridX, gridY, gridZ, blockX, blockY, blockZ)
//
// with one argument per KernelInfo.Params entry (an NDArray on the module's
// device for "ptr", whose Data() address is passed; an int for "int32" and
// "int64"; a float or int for "float32" and "float64") followed by the six
// launch dimensions as ints. Arguments are checked before the launch; a bad
// one fails with an error naming the kernel and the argument. The kernel is
// queued on the module's stream (SetStream; 0 by default) and the call
// returns without waiting for it: the arrays must stay alive until the
// stream is synchronized. Reading results with NDArray.Bytes or CopyTo
// waits for kernels on stream 0 and on streams from CreateStream, which
// order with it.
type Module struct {
	packedfunc.ImportList
	dev     devices.Device
	ctx     uintptr
	lim     limits
	stream  atomic.Uintptr
	funcs   map[string]*packedfunc.Func
	kernels map[string]KernelInfo

	mu     sync.RWMutex // held shared by launches, exclusively by Close
	handle uintptr      // 0 once closed
}

// limits are the launch limits of a device; zero means unknown.
type limits struct {
	maxThreads int64
	block      [3]int64
	grid       [3]int64
}

// LoadPTX loads PTX text on a device and exposes the listed kernels as
// functions (see Module for their calling convention).
func LoadPTX(dev devices.Device, ptx string, kernels []KernelInfo) (packedfunc.Module, error) {
	m, err := LoadModule(dev, ptx, kernels)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// LoadModule is LoadPTX returning the concrete type (for SetStream).
func LoadModule(dev devices.Device, ptx string, kernels []KernelInfo) (*Module, error) {
	if err := validateKernels(kernels); err != nil {
		return nil, fmt.Errorf("load ptx on %s: %w", dev, err)
	}
	g, err := lookup(dev)
	if err != nil {
		return nil, err
	}
	ctx, err := contextOf(dev)
	if err != nil {
		return nil, err
	}
	if i := indexNUL(ptx); i >= 0 {
		ptx = ptx[:i]
	}
	handle, err := moduleLoad(ctx, ptx)
	if err != nil {
		return nil, withOp(err, "load ptx on "+dev.String())
	}
	m := &Module{dev: dev, ctx: ctx, handle: handle, lim: deviceLimits(g),
		funcs: map[string]*packedfunc.Func{}, kernels: map[string]KernelInfo{}}
	fail := func(err error) (*Module, error) {
		_ = moduleUnload(ctx, handle)
		return nil, fmt.Errorf("load ptx on %s: %w", dev, err)
	}
	optin, _ := deviceAttr(g.dev, attrMaxSharedMemPerBlockOptin)
	for _, k := range kernels {
		fn, err := moduleFunction(ctx, handle, k.Name)
		if err != nil {
			return fail(err)
		}
		if err := checkParams(ctx, fn, k); err != nil {
			return fail(err)
		}
		if err := allowDynamicShared(ctx, fn, dev, k.Name, k.SharedMem, optin); err != nil {
			return fail(err)
		}
		k.Params = append([]ParamKind(nil), k.Params...)
		m.kernels[k.Name] = k
		m.funcs[k.Name] = packedfunc.New(k.Name, m.caller(k, fn))
	}
	return m, nil
}

func indexNUL(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return i
		}
	}
	return -1
}

// validateKernels checks kernel descriptions before anything is loaded.
func validateKernels(kernels []KernelInfo) error {
	seen := map[string]bool{}
	for i, k := range kernels {
		if k.Name == "" {
			return fmt.Errorf("kernel %d has no name", i)
		}
		if seen[k.Name] {
			return fmt.Errorf("kernel %q is listed twice", k.Name)
		}
		seen[k.Name] = true
		for j, p := range k.Params {
			if p.size() == 0 {
				return fmt.Errorf("kernel %q parameter %d: unknown kind %q (want ptr, int32, int64, float32 or float64)", k.Name, j, p)
			}
		}
		if k.SharedMem < 0 || k.SharedMem > math.MaxInt32 {
			return fmt.Errorf("kernel %q: dynamic shared memory %d out of range", k.Name, k.SharedMem)
		}
	}
	return nil
}

// checkParams compares a kernel's description with the parameters the
// driver reports (CUDA 12.4+; skipped on older drivers).
func checkParams(ctx, fn uintptr, k KernelInfo) error {
	for i, p := range k.Params {
		_, size, code := funcParamInfo(ctx, fn, i)
		switch code {
		case 0:
		case codeInvalidValue:
			return fmt.Errorf("kernel %q takes %d parameters, KernelInfo lists %d", k.Name, i, len(k.Params))
		default:
			return nil // cannot tell (old driver)
		}
		if size != p.size() {
			return fmt.Errorf("kernel %q parameter %d is %d bytes, KernelInfo says %s (%d bytes)", k.Name, i, size, p, p.size())
		}
	}
	if _, _, code := funcParamInfo(ctx, fn, len(k.Params)); code == 0 {
		return fmt.Errorf("kernel %q takes more than the %d parameters KernelInfo lists", k.Name, len(k.Params))
	}
	return nil
}

func deviceLimits(g *gpu) limits {
	var l limits
	get := func(a int) int64 {
		v, err := deviceAttr(g.dev, a)
		if err != nil {
			return 0
		}
		return int64(v)
	}
	l.maxThreads = get(attrMaxThreadsPerBlock)
	for i := range 3 {
		l.block[i] = get(attrMaxBlockDimX + i)
		l.grid[i] = get(attrMaxGridDimX + i)
	}
	return l
}

// maxStackParams is the parameter count up to which a launch packs its
// arguments without allocating a slice of its own.
const maxStackParams = 16

func (m *Module) caller(k KernelInfo, fn uintptr) packedfunc.Impl {
	return func(args []packedfunc.Value) (packedfunc.Value, error) {
		var stack [maxStackParams]uint64
		vals := stack[:0]
		if len(k.Params) > maxStackParams {
			vals = make([]uint64, 0, len(k.Params))
		}
		vals = vals[:len(k.Params)]
		dims, err := packArgs(k, m.dev, &m.lim, args, vals)
		if err != nil {
			return packedfunc.Nil, err
		}
		m.mu.RLock()
		defer m.mu.RUnlock()
		if m.handle == 0 {
			return packedfunc.Nil, fmt.Errorf("%s: %w", k.Name, ErrClosed)
		}
		err = launch(m.ctx, fn, &dims, uint32(k.SharedMem), m.stream.Load(), vals)
		runtime.KeepAlive(args)
		if err != nil {
			return packedfunc.Nil, withOp(err, fmt.Sprintf("launch %q on %s (grid %dx%dx%d, block %dx%dx%d)", k.Name, m.dev, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]))
		}
		return packedfunc.Nil, nil
	}
}

// packArgs checks a call's arguments against the kernel and fills one
// 8-byte slot per parameter (4-byte values in the low bytes, as the kernel
// reads them on a little-endian host); it returns the launch dimensions.
func packArgs(k KernelInfo, dev devices.Device, lim *limits, args []packedfunc.Value, vals []uint64) (dims [LaunchArgs]uint32, err error) {
	np := len(k.Params)
	if len(args) != np+LaunchArgs {
		return dims, fmt.Errorf("%s: %w: want %d (%d parameters, then gridX, gridY, gridZ, blockX, blockY, blockZ), got %d",
			k.Name, packedfunc.ErrArity, np+LaunchArgs, np, len(args))
	}
	for i, kind := range k.Params {
		v := args[i]
		switch kind {
		case ParamPtr:
			a, err := v.AsArray()
			if err != nil {
				return dims, packedfunc.ArgError(k.Name, i, "ptr: %w", err)
			}
			if a.Released() {
				return dims, packedfunc.ArgError(k.Name, i, "ptr: %w", ndarray.ErrReleased)
			}
			if a.Device() != dev {
				return dims, packedfunc.ArgError(k.Name, i, "array is on %s, the module is loaded on %s", a.Device(), dev)
			}
			vals[i] = uint64(a.Data())
		case ParamInt32:
			n, err := v.AsInt()
			if err != nil {
				return dims, packedfunc.ArgError(k.Name, i, "int32: %w", err)
			}
			if n < math.MinInt32 || n > math.MaxInt32 {
				return dims, packedfunc.ArgError(k.Name, i, "%d does not fit int32", n)
			}
			vals[i] = uint64(uint32(int32(n)))
		case ParamInt64:
			n, err := v.AsInt()
			if err != nil {
				return dims, packedfunc.ArgError(k.Name, i, "int64: %w", err)
			}
			vals[i] = uint64(n)
		case ParamFloat32:
			f, err := v.AsFloat()
			if err != nil {
				return dims, packedfunc.ArgError(k.Name, i, "float32: %w", err)
			}
			vals[i] = uint64(math.Float32bits(float32(f)))
		case ParamFloat64:
			f, err := v.AsFloat()
			if err != nil {
				return dims, packedfunc.ArgError(k.Name, i, "float64: %w", err)
			}
			vals[i] = math.Float64bits(f)
		default:
			return dims, packedfunc.ArgError(k.Name, i, "unknown parameter kind %q", kind)
		}
	}
	for j := range LaunchArgs {
		i := np + j
		n, err := args[i].AsInt()
		if err != nil {
			return dims, packedfunc.ArgError(k.Name, i, "launch dimension %s: %w", launchArgNames[j], err)
		}
		hi := lim.grid[j%3]
		if j >= 3 {
			hi = lim.block[j%3]
		}
		if hi <= 0 {
			hi = math.MaxUint32
		}
		if n < 1 || n > hi {
			return dims, packedfunc.ArgError(k.Name, i, "launch dimension %s is %d, want 1 to %d", launchArgNames[j], n, hi)
		}
		dims[j] = uint32(n)
	}
	threads := int64(dims[3]) * int64(dims[4]) * int64(dims[5])
	if lim.maxThreads > 0 && threads > lim.maxThreads {
		return dims, fmt.Errorf("%s: block %dx%dx%d has %d threads, the device allows at most %d per block",
			k.Name, dims[3], dims[4], dims[5], threads, lim.maxThreads)
	}
	return dims, nil
}

// Type is "cuda".
func (m *Module) Type() string { return "cuda" }

// Device is the device the module is loaded on.
func (m *Module) Device() devices.Device { return m.dev }

// SetStream sets the stream later launches are queued on (0: the default
// stream). The stream must belong to the module's device.
func (m *Module) SetStream(s devices.Stream) { m.stream.Store(uintptr(s)) }

// Stream is the stream launches are queued on.
func (m *Module) Stream() devices.Stream { return devices.Stream(m.stream.Load()) }

// Kernel returns the description a kernel was loaded with.
func (m *Module) Kernel(name string) (KernelInfo, bool) {
	k, ok := m.kernels[name]
	return k, ok
}

// GetFunction returns a kernel or a function of an imported module.
func (m *Module) GetFunction(name string) (*packedfunc.Func, error) {
	if f, ok := m.funcs[name]; ok {
		return f, nil
	}
	if f, err := m.Lookup(name); err == nil {
		return f, nil
	}
	return nil, fmt.Errorf("cuda module on %s: function %q: %w", m.dev, name, packedfunc.ErrNotFound)
}

// Functions lists the module's kernels.
func (m *Module) Functions() []string {
	out := make([]string, 0, len(m.funcs))
	for n := range m.funcs {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Close waits for the device's queued work and unloads the module; later
// calls fail with ErrClosed. Closing twice is harmless.
func (m *Module) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.handle == 0 {
		return nil
	}
	h := m.handle
	m.handle = 0
	return withOp(moduleUnload(m.ctx, h), "unload module on "+m.dev.String())
}

// allowDynamicShared lets kernel fn (named name) launch with shared bytes
// of dynamic shared memory: past the default 48 KiB, the kernel opts in
// up to optin, the device's limit (0: unknown, the driver checks).
func allowDynamicShared(ctx, fn uintptr, dev devices.Device, name string, shared, optin int) error {
	if shared <= 48<<10 {
		return nil
	}
	if optin > 0 && shared > optin {
		return fmt.Errorf("kernel %q: %d bytes of dynamic shared memory, %s allows %d per block", name, shared, dev, optin)
	}
	if err := funcSetMaxDynamicSharedMem(ctx, fn, shared); err != nil {
		return withOp(err, fmt.Sprintf("kernel %q: allow %d bytes of dynamic shared memory", name, shared))
	}
	return nil
}
