// Package load opens an artifact into a runtime, the one way every runner
// does it (the device daemon's worker, kiln run and kiln bench, the C API,
// the ONNX conformance runner, the benches): it checks that this machine
// can run the artifact's host code (its architecture and the CPU features
// the manifest says the code may use), loads its kernels (the host library,
// and on a GPU its device code), makes the VM of a graph artifact and binds
// the weights the artifact bundles, so a graph function can be called with
// its inputs alone. Close closes the VM, then its kernels, then removes the
// files the load wrote.
//
// load runs artifacts; it must not import the compiler, rpcserver or cli.
package load

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/hostcpu"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/vm"
)

// Options say where and how an artifact is loaded.
type Options struct {
	// Dir is the directory the load writes the host library (and a cuda
	// artifact's device code) into; it must exist unless Root is set.
	// Empty, a fresh temporary directory is made and Close removes it;
	// given, the caller owns it and removes it after Close.
	Dir string
	// Root, when set, is the directory Dir is relative to: the files are
	// written through it (a symbolic link there is refused, not
	// followed) and Dir is made when missing.
	Root *os.Root
	// Device runs the artifact: a cuda device for a cuda artifact, the
	// CPU otherwise; zero means cuda:0 for a cuda artifact, else cpu:0.
	Device devices.Device
	// MemoryCfg is the VM's allocator ("naive" or "pooled"; "" for the
	// default).
	MemoryCfg string
	// Profile times every kernel call of the VM (see vm.Options).
	Profile bool
}

// Module is a loaded artifact: its kernels, and for a graph artifact the
// VM that runs them with the bundled weights bound. It is a
// packedfunc.Module: GetFunction returns the VM's functions (which then
// also take their inputs alone) or, for an artifact of kernels, the
// kernels.
type Module struct {
	packedfunc.ImportList
	kernels packedfunc.Module
	vm      *vm.VM // nil for an artifact of kernels
	dev     devices.Device
	// weights are the bundled weights by parameter name (dotted module
	// paths also as underscores), on the host.
	weights map[string]*ndarray.NDArray
	tmp     string // a directory the load made, removed by Close

	memoryCfg string
	mu        sync.Mutex
	// prof is the VM that profiles (Profile), made the first time.
	prof *vm.VM
	// onDev holds the weights copied to a device that is not the CPU,
	// each the first time a call needs it.
	onDev map[*ndarray.NDArray]*ndarray.NDArray
}

// Kernels loads the kernels of an artifact built for a device that is not
// the CPU onto dev, writing what it needs into dir.
type Kernels func(dev devices.Device, a *artifact.Artifact, dir string) (packedfunc.Module, error)

var (
	kernelsMu     sync.Mutex
	deviceKernels = map[devices.Type]Kernels{}
)

// Register makes Artifact load the kernels of artifacts for devices of
// type t with k. Package load/cudaload registers cuda's: programs that run
// cuda artifacts import it, and the others (the C API's shared library)
// link no GPU driver helpers.
func Register(t devices.Type, k Kernels) {
	kernelsMu.Lock()
	defer kernelsMu.Unlock()
	deviceKernels[t] = k
}

// hostFeatures is what this machine's CPU runs (a test pretends another).
var hostFeatures = hostcpu.Host

// File loads the artifact at path.
func File(path string, o Options) (*Module, error) {
	a, err := artifact.Load(path)
	if err != nil {
		return nil, err
	}
	return Artifact(a, o)
}

// Artifact loads a. An artifact with a host library alone (Files holding
// artifact.HostLib, as a bare shared object uploaded to a daemon) loads as
// a module of kernels.
func Artifact(a *artifact.Artifact, o Options) (_ *Module, err error) {
	if _, ok := a.Files[artifact.HostLib]; !ok {
		return nil, fmt.Errorf("load artifact: it has no %s (entries: %s)", artifact.HostLib, strings.Join(a.Names(), ", "))
	}
	if err := RunsHere(a); err != nil {
		return nil, fmt.Errorf("load artifact: %w", err)
	}
	onCUDA := IsCUDA(a)
	dev := o.Device
	switch {
	case dev == (devices.Device{}) && onCUDA:
		dev = devices.Device{Type: devices.CUDA}
	case dev == (devices.Device{}):
		dev = devices.CPUDevice
	}
	if onCUDA && dev.Type != devices.CUDA {
		return nil, fmt.Errorf("load artifact: it is built for %q, which runs on a cuda device, not on %s", a.Manifest.Target, dev)
	}
	if !onCUDA && dev.Type != devices.CPU {
		return nil, fmt.Errorf("load artifact: it is built for %q, which runs on the CPU, not on %s", a.Manifest.Target, dev)
	}
	m := &Module{dev: dev, memoryCfg: o.MemoryCfg}
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	dir, err := m.dir(o)
	if err != nil {
		return nil, fmt.Errorf("load artifact: %w", err)
	}
	if onCUDA {
		kernelsMu.Lock()
		kernelsOf := deviceKernels[devices.CUDA]
		kernelsMu.Unlock()
		if kernelsOf == nil {
			return nil, fmt.Errorf("load artifact: the artifact is built for %s, which this program does not run itself (it has no cuda backend): run it on a device daemon with a cuda device", a.Manifest.Target)
		}
		k, err := kernelsOf(dev, a, dir)
		if err != nil {
			return nil, err
		}
		m.kernels = k
	} else {
		k, err := loadHost(a, o, dir)
		if err != nil {
			return nil, err
		}
		m.kernels = k
	}
	exeBytes, ok := a.Files[artifact.VMExec]
	if !ok {
		return m, nil
	}
	exe, err := vm.Unmarshal(exeBytes)
	if err != nil {
		return nil, fmt.Errorf("load artifact: %s: %w", artifact.VMExec, err)
	}
	if m.vm, err = vm.New(exe, m.kernels, dev, vm.Options{MemoryCfg: o.MemoryCfg, Profile: o.Profile}); err != nil {
		return nil, fmt.Errorf("load artifact: the VM on %s: %w", dev, err)
	}
	if m.weights, err = bundledWeights(a); err != nil {
		return nil, fmt.Errorf("load artifact: %w", err)
	}
	return m, nil
}

// dir is the directory the load writes into: o.Dir (made through o.Root
// when set, and then named by its full path), or a fresh one.
func (m *Module) dir(o Options) (string, error) {
	switch {
	case o.Root != nil:
		if err := o.Root.MkdirAll(o.Dir, 0o700); err != nil {
			return "", fmt.Errorf("make %s: %w", o.Dir, err)
		}
		return filepath.Join(o.Root.Name(), o.Dir), nil
	case o.Dir != "":
		return o.Dir, nil
	}
	d, err := os.MkdirTemp("", "kiln-load-")
	m.tmp = d
	return d, err
}

// loadHost writes a's host library into dir and loads it.
func loadHost(a *artifact.Artifact, o Options, dir string) (*cpu.Module, error) {
	if o.Root == nil {
		return cpu.LoadArtifact(a, dir)
	}
	name := filepath.Join(o.Dir, artifact.HostLib)
	f, err := o.Root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o700)
	if err != nil {
		return nil, fmt.Errorf("load artifact: write %s: %w", name, err)
	}
	_, err = f.Write(a.Files[artifact.HostLib])
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("load artifact: write %s: %w", name, err)
	}
	mod, err := cpu.LoadModule(filepath.Join(dir, artifact.HostLib))
	if err != nil {
		return nil, fmt.Errorf("load artifact: %w", err)
	}
	return mod, nil
}

// IsCUDA reports an artifact built for a cuda target.
func IsCUDA(a *artifact.Artifact) bool {
	kind, _, _ := strings.Cut(a.Manifest.Target, " ")
	return kind == "cuda" || kind == "nvptx"
}

// RunsHere fails, naming what this machine lacks, when its CPU cannot run
// a's host code: another architecture, or CPU features the code may use
// (as the manifest lists them) that it does not have. An artifact whose
// manifest says neither is not checked here (the library's ELF machine
// still is, when it loads), nor are features on a CPU whose features
// cannot be read.
func RunsHere(a *artifact.Artifact) error {
	arch := a.Manifest.Attrs[artifact.AttrCPUArch]
	var need []string
	if f := a.Manifest.Attrs[artifact.AttrCPUFeatures]; f != "" {
		need = strings.Split(f, ",")
	}
	if arch == "" && need == nil {
		return nil
	}
	h := hostFeatures()
	if h.Unread {
		// What cannot be read is not refused: only the architecture is
		// checked (a kernel that does crash is still reported).
		need = nil
	}
	err := h.Check(fmt.Sprintf("it is built for %q, which", a.Manifest.Target), arch, need)
	if err != nil {
		return fmt.Errorf("%w: build it for this machine (target \"cpu\", or a -mcpu it has) or run it on a device that has them", err)
	}
	return nil
}

// bundledWeights reads a's params.safetensors by parameter name: a
// dotted module path ("fc1.weight") also names parameter fc1_weight. Nil
// when a bundles none.
func bundledWeights(a *artifact.Artifact) (map[string]*ndarray.NDArray, error) {
	b, ok := a.Files[artifact.Params]
	if !ok {
		return nil, nil
	}
	ps, _, err := ndarray.ReadSafetensors(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return nil, fmt.Errorf("bundled %s: %w", artifact.Params, err)
	}
	w := map[string]*ndarray.NDArray{}
	for k, v := range ps {
		w[k] = v
		w[strings.ReplaceAll(k, ".", "_")] = v
	}
	return w, nil
}

// onDevice is weight w on the module's device: w itself on the CPU, else
// a copy made the first time.
func (m *Module) onDevice(name string, w *ndarray.NDArray) (*ndarray.NDArray, error) {
	if m.dev.Type == devices.CPU {
		return w, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if d := m.onDev[w]; d != nil {
		return d, nil
	}
	data, err := w.Bytes()
	if err != nil {
		return nil, fmt.Errorf("bundled weight %s: %w", name, err)
	}
	d, err := ndarray.FromBytes(data, w.Shape(), w.DType(), m.dev)
	if err != nil {
		return nil, fmt.Errorf("bundled weight %s onto %s: %w", name, m.dev, err)
	}
	if m.onDev == nil {
		m.onDev = map[*ndarray.NDArray]*ndarray.NDArray{}
	}
	m.onDev[w] = d
	return d, nil
}

// VM is the graph artifact's VM (nil for an artifact of kernels).
func (m *Module) VM() *vm.VM { return m.vm }

// Kernels is the module of compiled kernels (a *cpu.Module, or what the
// device's Kernels returned: a *cuda.HostModule for a cuda artifact).
func (m *Module) Kernels() packedfunc.Module { return m.kernels }

// Device is where the artifact runs and its tensors live.
func (m *Module) Device() devices.Device { return m.dev }

// Weights are the bundled weights by parameter name, on the host (nil
// when none).
func (m *Module) Weights() map[string]*ndarray.NDArray { return m.weights }

// Inputs names the parameters of graph function name that no bundled
// weight supplies, in order: what a call with the weights bound takes.
func (m *Module) Inputs(name string) ([]string, error) {
	if m.vm == nil {
		return nil, fmt.Errorf("function %q: the artifact has no graph functions", name)
	}
	f, ok := m.vm.Executable().Function(name)
	if !ok {
		return nil, fmt.Errorf("no graph function %q (the artifact has %s): %w", name, strings.Join(m.vm.Functions(), ", "), packedfunc.ErrNotFound)
	}
	var in []string
	for _, p := range f.Params {
		if m.weights[p.Name] == nil {
			in = append(in, p.Name)
		}
	}
	return in, nil
}

// Type is "vm" for a graph artifact, else the kernels' module type.
func (m *Module) Type() string {
	if m.vm != nil {
		return m.vm.Type()
	}
	return m.kernels.Type()
}

// Functions lists the VM's functions, or the kernels.
func (m *Module) Functions() []string {
	if m.vm != nil {
		return m.vm.Functions()
	}
	return m.kernels.Functions()
}

// GetFunction returns a function of the VM, or a kernel. A graph function
// with bundled weights takes either every parameter (weights too, which
// then replace the bundled ones for that call) or its inputs alone. A
// graph artifact also has ProfileFunc.
func (m *Module) GetFunction(name string) (*packedfunc.Func, error) {
	if m.vm == nil {
		return m.kernels.GetFunction(name)
	}
	f, err := m.vm.GetFunction(name)
	if errors.Is(err, packedfunc.ErrNotFound) && name == ProfileFunc {
		return m.profileFunc(), nil
	}
	if err != nil {
		return nil, err
	}
	info, ok := m.vm.Executable().Function(name)
	if !ok || m.weights == nil {
		return f, nil
	}
	n := len(info.Params)
	return packedfunc.New(name, func(args []packedfunc.Value) (packedfunc.Value, error) {
		if len(args) == n {
			return f.Call(args...)
		}
		full, err := m.bind(name, args)
		if err != nil {
			return packedfunc.Nil, err
		}
		return f.Call(full...)
	}), nil
}

// Invoke runs graph function name as vm.VM.Invoke does, with the bundled
// weights filled in when args are its inputs alone.
func (m *Module) Invoke(name string, args ...packedfunc.Value) (vm.Value, error) {
	if m.vm == nil {
		return vm.Value{}, fmt.Errorf("invoke %q: the artifact has no graph functions", name)
	}
	if info, ok := m.vm.Executable().Function(name); ok && m.weights != nil && len(args) != len(info.Params) {
		full, err := m.bind(name, args)
		if err != nil {
			return vm.Value{}, err
		}
		args = full
	}
	return m.vm.Invoke(name, args...)
}

// bind places inputs among the bundled weights, in parameter order.
func (m *Module) bind(name string, inputs []packedfunc.Value) ([]packedfunc.Value, error) {
	in, err := m.Inputs(name)
	if err != nil {
		return nil, err
	}
	if len(inputs) != len(in) {
		return nil, fmt.Errorf("%s: %w: want the inputs %s (the weights are bundled), got %d arguments",
			name, packedfunc.ErrArity, strings.Join(in, ", "), len(inputs))
	}
	info, _ := m.vm.Executable().Function(name)
	full := make([]packedfunc.Value, 0, len(info.Params))
	i := 0
	for _, p := range info.Params {
		if w := m.weights[p.Name]; w != nil {
			d, err := m.onDevice(p.Name, w)
			if err != nil {
				return nil, err
			}
			full = append(full, packedfunc.Array(d))
			continue
		}
		full = append(full, inputs[i])
		i++
	}
	return full, nil
}

// Close closes the VM (its storage), then the kernels, then removes the
// directory the load made; functions taken from the module fail
// afterwards. Close is idempotent.
func (m *Module) Close() error {
	var errs []error
	if m.vm != nil {
		errs = append(errs, m.vm.Close())
	}
	m.mu.Lock()
	if m.prof != nil {
		errs = append(errs, m.prof.Close())
	}
	m.mu.Unlock()
	if m.kernels != nil {
		errs = append(errs, m.kernels.Close())
	}
	m.mu.Lock()
	for _, d := range m.onDev {
		errs = append(errs, d.Release())
	}
	m.onDev = nil
	m.mu.Unlock()
	if m.tmp != "" {
		errs = append(errs, os.RemoveAll(m.tmp))
		m.tmp = ""
	}
	return errors.Join(errs...)
}

var _ packedfunc.Module = (*Module)(nil)
