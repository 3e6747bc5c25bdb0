package compiler

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/compiler/codegen/c"
	"github.com/kiln-ml/kiln/compiler/codegen/cuda"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/transform"
)

// cudaCodegenVersion changes whenever generated CUDA code changes for the
// same IR.
const cudaCodegenVersion = "kiln-cuda-1"

// CUDACompiler compiles CUDA C at build time (NVRTC). The compiler does not
// load NVRTC itself: a program that builds for cuda registers one
// (RegisterCUDACompiler; the kiln command registers devices/cuda's NVRTC)
// or passes one in BuildOptions.CUDA.
type CUDACompiler interface {
	// CompilePTX compiles src to PTX with NVRTC options opts; log is the
	// compiler's log.
	CompilePTX(src, name string, opts []string) (ptx string, log string, err error)
	// CompileCUBIN compiles src to a cubin (opts name a real architecture
	// and may ask ptxas for its resource report).
	CompileCUBIN(src, name string, opts []string) (cubin []byte, log string, err error)
	// Identity names the compiler and its version for the build cache, or
	// fails when it cannot be used (NVRTC not installed).
	Identity() (string, error)
}

var registered struct {
	sync.Mutex
	cc CUDACompiler
}

// RegisterCUDACompiler sets the CUDA compiler builds use when
// BuildOptions.CUDA is nil.
func RegisterCUDACompiler(cc CUDACompiler) {
	registered.Lock()
	registered.cc = cc
	registered.Unlock()
}

// cudaCompiler returns the CUDA compiler of a build and checks it is usable.
func cudaCompiler(opts BuildOptions) (CUDACompiler, error) {
	cc := opts.CUDA
	if cc == nil {
		registered.Lock()
		cc = registered.cc
		registered.Unlock()
	}
	if cc == nil {
		return nil, errors.New("no CUDA compiler (NVRTC) is linked into this program; building for cuda needs one")
	}
	if _, err := cc.Identity(); err != nil {
		return nil, fmt.Errorf("building for cuda needs NVRTC: %w", err)
	}
	return cc, nil
}

func hasThreadBinding(f *ir.PrimFunc) bool {
	found := false
	ir.Visit(f.Body, func(n ir.Node) bool {
		if l, ok := n.(*ir.For); ok && l.Kind == ir.ForThreadBinding {
			found = true
		}
		return !found
	})
	return found
}

// deviceTypeCUDA is DLPack's kDLCUDA.
const deviceTypeCUDA = 2

// generateCUDA lowers mod's PrimFuncs, splits each into kernels and a host
// function, prints the kernels as CUDA C and compiles them with NVRTC, and
// prints the host functions as C. It returns the host source, the host
// module's metadata and the device files of the artifact.
func generateCUDA(mod *ir.IRModule, target Target, nv CUDACompiler, topts transform.Options) (string, *abi.Metadata, map[string][]byte, error) {
	lim, err := target.CUDA()
	if err != nil {
		return "", nil, nil, err
	}
	topts.StopAfter = "storage_rewrite"
	lowered, err := transform.LowerModule(onlyPrimFuncs(mod), topts)
	if err != nil {
		return "", nil, nil, err
	}
	hosts := ir.NewIRModule()
	kernels := ir.NewIRModule()
	funcOf := map[string]string{}
	for name, f := range lowered.PrimFuncs() {
		if !ir.IsVoid(f.RetType) {
			return "", nil, nil, fmt.Errorf("function %q returns %s: functions with a result build for cpu targets only", name, f.RetType)
		}
		host, ks, _, err := transform.SplitHostDevice(f, deviceTypeCUDA)
		if err != nil {
			return "", nil, nil, err
		}
		// The host only launches the kernels: what the function writes
		// is read from it before the split.
		host = host.WithAttr(transform.AttrOutputs, transform.WrittenParams(f))
		packed, err := transform.MakePackedAPI(host)
		if err != nil {
			return "", nil, nil, fmt.Errorf("function %q: make_packed_api: %w", name, err)
		}
		hosts = hosts.With(name, packed)
		for _, k := range ks {
			sym := transform.FuncName(k)
			if other, dup := funcOf[sym]; dup {
				return "", nil, nil, fmt.Errorf("kernel %q of function %q has the name of a kernel of function %q", sym, name, other)
			}
			funcOf[sym] = transform.FuncName(f)
			kernels = kernels.With(sym, k)
		}
	}
	devSrc, ks, err := cuda.Generate(kernels, lim)
	if err != nil {
		return "", nil, nil, fmt.Errorf("cuda codegen: %w", err)
	}
	dialect, err := cuda.HostDialect(ks)
	if err != nil {
		return "", nil, nil, fmt.Errorf("cuda codegen: %w", err)
	}
	hostSrc, meta, err := c.Generate(hosts, c.Options{Target: target.String(), Dialect: &dialect})
	if err != nil {
		return "", nil, nil, fmt.Errorf("codegen: %w", err)
	}

	arch := lim.Arch
	ptx, log, err := nv.CompilePTX(devSrc, "kernels.cu", []string{"--gpu-architecture=compute_" + strings.TrimPrefix(arch, "sm_")})
	if err != nil {
		return "", nil, nil, fmt.Errorf("compile kernels to PTX for %s: %w", arch, err)
	}
	cubin, log, err := nv.CompileCUBIN(devSrc, "kernels.cu", []string{"--gpu-architecture=" + arch, "--ptxas-options=-v"})
	if err != nil {
		return "", nil, nil, fmt.Errorf("compile kernels for %s: %w", arch, err)
	}
	report, err := cuda.ParsePTXASReport(log)
	if err != nil {
		return "", nil, nil, fmt.Errorf("compile kernels for %s: %w", arch, err)
	}
	dm := abi.DeviceMetadata{
		FormatVersion: abi.Version, Kind: "cuda", Arch: arch,
		PTX:    "device/kernels.ptx",
		Cubins: map[string]string{arch: "device/" + arch + ".cubin"},
	}
	for _, k := range ks {
		res, ok := report[k.Name]
		if !ok {
			return "", nil, nil, fmt.Errorf("kernel %q: ptxas reported no resources for it on %s", k.Name, arch)
		}
		switch {
		case res.SharedBytes > lim.MaxSharedMemPerBlock:
			return "", nil, nil, fmt.Errorf("kernel %q on %s uses %d bytes of shared memory, past the limit %d per block", k.Name, arch, res.SharedBytes, lim.MaxSharedMemPerBlock)
		case res.Registers*k.Threads() > lim.MaxRegistersPerBlock:
			return "", nil, nil, fmt.Errorf("kernel %q on %s needs %d registers per thread × %d threads, past the limit %d registers per block", k.Name, arch, res.Registers, k.Threads(), lim.MaxRegistersPerBlock)
		}
		dk := abi.DeviceKernel{
			Name: k.Name, Func: funcOf[k.Name], Grid: k.Grid, Block: k.Block, SharedBytes: k.SharedBytes, DynamicSharedBytes: k.DynSharedBytes,
			Params: []abi.DeviceParam{},
			Resources: map[string]abi.DeviceResources{arch: {
				Registers: res.Registers, SpillStores: res.SpillStores, SpillLoads: res.SpillLoads, SharedBytes: res.SharedBytes,
			}},
		}
		for _, p := range k.Params {
			dk.Params = append(dk.Params, abi.DeviceParam{Name: p.Name, DType: p.DType, Pointer: p.Pointer})
		}
		dm.Kernels = append(dm.Kernels, dk)
	}
	mj, err := json.MarshalIndent(dm, "", "  ")
	if err != nil {
		return "", nil, nil, err
	}
	if _, err := abi.ParseDeviceMetadata(mj); err != nil {
		return "", nil, nil, fmt.Errorf("internal error: %w", err)
	}
	files := map[string][]byte{
		abi.DeviceMetadataName: mj,
		dm.PTX:                 []byte(ptx),
		dm.Cubins[arch]:        cubin,
		"device/kernels.cu":    []byte(devSrc),
	}
	return hostSrc, meta, files, nil
}
