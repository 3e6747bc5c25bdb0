// Package compiler owns Build: it lowers an IRModule's PrimFuncs
// (compiler/transform), prints them as C (compiler/codegen/c), compiles
// the C with the system compiler (compiler/toolchain) into host.so and
// packs a .kiln artifact (package artifact), with a build cache keyed by
// the IR's structural hash, the target, the toolchain's identity and the
// flags.
//
// Sub-packages hold the phases: ir, script, te, schedule, transform,
// arith, interp, codegen/c, toolchain. This package must not import
// devices, packedfunc or cli: it produces artifacts, it does not run them.
package compiler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/compiler/codegen/c"
	vmgen "github.com/kiln-ml/kiln/compiler/codegen/vm"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/toolchain"
	"github.com/kiln-ml/kiln/compiler/transform"
)

// codegenVersion changes whenever generated code changes for the same IR,
// so cached builds of older generators are not reused.
const codegenVersion = "kiln-c-6+vm-1"

// DefaultPipeline is the graph-level pipeline Build runs when
// BuildOptions.Pipeline is empty: "O2" (the zero pipeline, then
// LiftTransformParams, so weight transforms run once per set of weights).
const DefaultPipeline = "O2"

// SourceName is the name of the generated C file (in KeepSource).
const SourceName = "host.c"

// BuildOptions control Build.
type BuildOptions struct {
	// CC is the C compiler; "" means $CC, then cc (TRIPLE-gcc when the
	// target has a triple).
	CC string
	// CFlags replace the target's default flags (-O3 -march=native, or
	// -O3 -march=MCPU, or -O3 when cross-compiling).
	CFlags []string
	// KeepSource, when not empty, is a directory that receives the
	// generated C source and kiln_abi.h.
	KeepSource string
	// DumpIR names passes after which the IR is printed to Dump ("all"
	// for every pass); see transform.ParseDumpIR.
	DumpIR []string
	// Dump receives IR dumps; nil means os.Stderr when DumpIR is set.
	Dump io.Writer
	// Cache stores built artifacts; nil means toolchain.DefaultCache()
	// unless NoCache is set.
	Cache *toolchain.Cache
	// NoCache disables the build cache.
	NoCache bool
	// VerifyIR runs ir.Verify before lowering and after every pass.
	VerifyIR bool
	// Pipeline is the graph-level pipeline run first on a module with
	// graph functions ("" means DefaultPipeline; "none" runs nothing; see
	// compiler/relax/transform.PipelineNames).
	Pipeline string
	// NoDefaultSchedule skips the default schedules
	// (compiler/schedule/auto) that Build gives every PrimFunc not
	// already scheduled (auto.Scheduled): the tensor programs of a graph
	// module after its pipeline and the kernels of a module of PrimFuncs
	// alike. On CUDA a function without loops bound to threads cannot
	// run: it gets the GPU rules all the same.
	NoDefaultSchedule bool
	// Params, when set, is a safetensors file bundled into the artifact
	// as params.safetensors (a graph function's weights).
	Params []byte
	// CUDA compiles the kernels of a cuda build; nil means the one given
	// to RegisterCUDACompiler.
	CUDA CUDACompiler
	// Schedule, when set, rewrites the module's PrimFuncs before they
	// are lowered: after the graph-level pipeline (so it sees the fused
	// kernels) and before the default schedules, which leave the
	// functions it scheduled alone. kiln build --tuning-db applies a
	// tuning database's best records through it.
	Schedule func(*ir.IRModule) (*ir.IRModule, error)
	// Layouts, when set, makes the graph-level layout choices (each
	// convolution's kernel layout and each dense layer's weight layout,
	// see relax/transform.LayoutSite) before the graph pipeline: given the
	// Lowering of the module as given to Build, with its sites, it returns
	// the choice (nil: the defaults). kiln build --tuning-db takes what
	// the database's records measured fastest (tune.ChooseLayouts).
	Layouts func(lower *Lowering) (map[string]string, error)
	// Progress, when set, hears each phase of the build start and end
	// (see Stage), on the goroutine that called Build.
	Progress func(Stage)
}

// Stage is a phase of a build as BuildOptions.Progress hears it: Name
// ("graph pipeline O2", "schedule", "lower and generate code", "C
// compile of 3 function(s)", "pack the artifact"), once with Done false as it starts
// and once with Done true and Took as it ends.
type Stage struct {
	Name string
	Done bool
	Took time.Duration
}

// stage reports the start of a phase to progress and returns the func
// that reports its end.
func stage(progress func(Stage), name string) func() {
	if progress == nil {
		return func() {}
	}
	start := time.Now()
	progress(Stage{Name: name})
	return func() { progress(Stage{Name: name, Done: true, Took: time.Since(start)}) }
}

// Result is a build's artifact and how it was made.
type Result struct {
	Artifact *artifact.Artifact
	// Cached reports that the artifact came from the build cache.
	Cached bool
	// Source is the generated C ("" when Cached).
	Source string
	// Lower is the time spent lowering and generating C; Compile the
	// time in the C compiler (both zero when Cached).
	Lower, Compile time.Duration
	// Key is the build cache key.
	Key string
	// Schedules says, per PrimFunc in module order, which schedule it
	// was built with (also when Cached).
	Schedules []FuncSchedule
}

// Build compiles every PrimFunc of mod for target into a .kiln artifact.
// A C compiler failure returns an error wrapping *toolchain.CompileError
// (its stderr with the generated source line).
func Build(ctx context.Context, mod *ir.IRModule, target Target, opts BuildOptions) (*artifact.Artifact, error) {
	r, err := BuildWithResult(ctx, mod, target, opts)
	if err != nil {
		return nil, err
	}
	return r.Artifact, nil
}

// BuildWithResult is Build, also reporting whether the build cache
// answered and how long the phases took.
func BuildWithResult(ctx context.Context, mod *ir.IRModule, target Target, opts BuildOptions) (*Result, error) {
	if mod == nil {
		return nil, errors.New("build: nil module")
	}
	if target.Kind == "" {
		target.Kind = "cpu"
	}
	info, err := target.Info()
	if err != nil {
		return nil, fmt.Errorf("build: %w", err)
	}
	var nvrtc CUDACompiler
	if info.DeviceCompiler {
		if nvrtc, err = cudaCompiler(opts); err != nil {
			return nil, fmt.Errorf("build: target %q: %w", target, err)
		}
	}
	if vmgen.HasGraphFunctions(mod) && opts.Pipeline != "none" {
		p := opts.Pipeline
		if p == "" {
			p = DefaultPipeline
		}
		end := stage(opts.Progress, "graph pipeline "+p)
		var layouts map[string]string
		if lower := LayoutLowering(mod, target, p, opts.NoDefaultSchedule); opts.Layouts != nil && lower != nil {
			if layouts, err = opts.Layouts(lower); err != nil {
				return nil, fmt.Errorf("build: kernel layouts: %w", err)
			}
		}
		if mod, err = GraphPipeline(mod, target, p, opts.NoDefaultSchedule, layouts); err != nil {
			return nil, fmt.Errorf("build: %w", err)
		}
		end()
	}
	end := stage(opts.Progress, "schedule")
	before := mod
	if opts.Schedule != nil {
		if mod, err = opts.Schedule(mod); err != nil {
			return nil, fmt.Errorf("build: %w", err)
		}
	}
	mod, schedules, err := defaultSchedules(before, mod, info, opts)
	if err != nil {
		return nil, fmt.Errorf("build: %w", err)
	}
	end()
	n := 0
	for range mod.PrimFuncs() {
		n++
	}
	if n == 0 {
		return nil, errors.New("build: the module has no PrimFuncs")
	}
	if opts.DumpIR != nil {
		for _, p := range opts.DumpIR {
			if p != "all" && !slices.Contains(transform.PassNames(), p) {
				return nil, fmt.Errorf("build: --dump-ir: unknown pass %q (passes: %s)", p, strings.Join(transform.PassNames(), ", "))
			}
		}
	}
	flags := opts.CFlags
	if flags == nil {
		flags = target.cflags()
	}
	tc, err := findToolchain(ctx, toolchain.Options{CC: opts.CC, Flags: flags, Triple: target.Triple})
	if err != nil {
		return nil, fmt.Errorf("build: %w", err)
	}
	if opts.KeepSource != "" {
		// The C compiler runs in another directory: a relative path would
		// name a different place there.
		if opts.KeepSource, err = filepath.Abs(opts.KeepSource); err != nil {
			return nil, fmt.Errorf("build: keep source: %w", err)
		}
	}
	cache := opts.Cache
	if cache == nil && !opts.NoCache {
		if cache, err = toolchain.DefaultCache(); err != nil {
			return nil, fmt.Errorf("build: %w", err)
		}
	}
	if opts.NoCache {
		cache = nil
	}
	key := cacheKey(mod, target, tc)
	if nvrtc != nil {
		id, err := nvrtc.Identity()
		if err != nil {
			return nil, fmt.Errorf("build: target %q: %w", target, err)
		}
		key = toolchain.Key(key, cudaCodegenVersion, id)
	}
	if opts.Params != nil {
		key = toolchain.Key(key, "params", string(opts.Params))
	}
	res := &Result{Key: key, Schedules: schedules}
	if cache != nil && len(opts.DumpIR) == 0 && opts.KeepSource == "" {
		if data, ok := cache.Get(key); ok {
			if a, err := artifact.Read(bytes.NewReader(data), int64(len(data))); err == nil {
				res.Artifact, res.Cached = a, true
				return res, nil
			}
		}
	}

	start := time.Now()
	end = stage(opts.Progress, "lower and generate code")
	if opts.VerifyIR {
		if err := ir.VerifyModule(mod); err != nil {
			return nil, fmt.Errorf("build: %w", err)
		}
	}
	dump := opts.Dump
	if dump == nil && len(opts.DumpIR) > 0 {
		dump = os.Stderr
	}
	var exe []byte
	if vmgen.HasGraphFunctions(mod) {
		e, err := vmgen.Generate(mod)
		if err != nil {
			return nil, fmt.Errorf("build: %w", err)
		}
		if exe, err = e.Marshal(); err != nil {
			return nil, fmt.Errorf("build: %w", err)
		}
	}
	var (
		src    string
		meta   *abi.Metadata
		device map[string][]byte
	)
	if !info.Float8 {
		if err := refuseFloat8(mod, target); err != nil {
			return nil, fmt.Errorf("build: %w", err)
		}
	}
	topts := transform.Options{DumpAfter: opts.DumpIR, Dump: dump, Verify: opts.VerifyIR}
	if info.HostDeviceSplit {
		src, meta, device, err = generateCUDA(mod, target, nvrtc, topts)
		if err != nil {
			return nil, fmt.Errorf("build: %w", err)
		}
	} else if src, meta, err = generateC(mod, target, info, topts); err != nil {
		return nil, fmt.Errorf("build: %w", err)
	}
	res.Source = src
	res.Lower = time.Since(start)
	end()

	start = time.Now()
	end = stage(opts.Progress, fmt.Sprintf("C compile of %d function(s)", n))
	dir, err := os.MkdirTemp("", "kiln-build-")
	if err != nil {
		return nil, fmt.Errorf("build: %w", err)
	}
	defer os.RemoveAll(dir)
	so := filepath.Join(dir, artifact.HostLib)
	if err := tc.BuildShared(ctx, []toolchain.Source{{Name: SourceName, Text: src}}, so, opts.KeepSource); err != nil {
		return nil, fmt.Errorf("build: %w", err)
	}
	res.Compile = time.Since(start)
	end()
	what := "pack the artifact"
	if opts.Params != nil {
		what = fmt.Sprintf("bundle %.1f MB of weights into the artifact", float64(len(opts.Params))/1e6)
	}
	end = stage(opts.Progress, what)
	lib, err := os.ReadFile(so)
	if err != nil {
		return nil, fmt.Errorf("build: %w", err)
	}
	a := artifact.New(target.String(), tc.Identity())
	if arch, need, ok := target.Requires(); arch != "" {
		// What a CPU needs to run the kernels, which the loader checks
		// before they can crash on an instruction it lacks.
		a.Manifest.Attrs = map[string]string{artifact.AttrCPUArch: arch}
		if ok {
			a.Manifest.Attrs[artifact.AttrCPUFeatures] = strings.Join(need, ",")
		}
	}
	if err := a.Add(artifact.HostLib, lib); err != nil {
		return nil, fmt.Errorf("build: %w", err)
	}
	for _, name := range slices.Sorted(maps.Keys(device)) {
		if err := a.Add(name, device[name]); err != nil {
			return nil, fmt.Errorf("build: %w", err)
		}
	}
	if exe != nil {
		if err := a.Add(artifact.VMExec, exe); err != nil {
			return nil, fmt.Errorf("build: %w", err)
		}
	}
	if opts.Params != nil {
		if err := a.Add(artifact.Params, opts.Params); err != nil {
			return nil, fmt.Errorf("build: %w", err)
		}
	}
	a.Manifest.Functions = meta.Functions
	res.Artifact = a
	if cache != nil {
		data, err := a.Bytes()
		if err != nil {
			return nil, fmt.Errorf("build: %w", err)
		}
		if err := cache.Put(key, data); err != nil {
			return nil, fmt.Errorf("build: %w", err)
		}
	}
	end()
	return res, nil
}

// generateC lowers mod's PrimFuncs for a CPU target, their vectors split
// to the target's width, and prints them as C.
func generateC(mod *ir.IRModule, target Target, info TargetInfo, topts transform.Options) (string, *abi.Metadata, error) {
	for name, f := range mod.PrimFuncs() {
		if _, ok := f.Attrs[transform.AttrVectorBytes]; !ok {
			mod = mod.With(name, f.WithAttr(transform.AttrVectorBytes, info.VectorBytes))
		}
	}
	lowered, err := transform.LowerModule(mod, topts)
	if err != nil {
		return "", nil, err
	}
	src, meta, err := c.Generate(onlyPrimFuncs(lowered), c.Options{Target: target.String()})
	if err != nil {
		return "", nil, fmt.Errorf("codegen: %w", err)
	}
	return src, meta, nil
}

// refuseFloat8 refuses the 8-bit float dtypes on a CPU target, naming the
// function and the buffer (or expression) that has one: they exist on
// CUDA GPUs of sm_89 and newer only.
func refuseFloat8(mod *ir.IRModule, target Target) error {
	names := make([]string, 0)
	for name := range mod.PrimFuncs() {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		f := mod.PrimFunc(name)
		var err error
		fail := func(what string, t ir.DType) {
			if err == nil {
				err = fmt.Errorf("function %q: %s: %s is not supported on %s (8-bit floats need a CUDA target of sm_89 or newer)", name, what, t.Scalar(), target.Kind)
			}
		}
		for _, p := range f.Params {
			if b, ok := f.BufferMap[p]; ok && b.DType.IsFloat8() {
				fail(fmt.Sprintf("buffer %q", b.Name), b.DType)
			} else if !ok && p.Type.IsFloat8() {
				fail(fmt.Sprintf("parameter %q", p.Name), p.Type)
			}
		}
		ir.Visit(f.Body, func(n ir.Node) bool {
			switch n := n.(type) {
			case *ir.Allocate:
				if n.Buffer.DType.IsFloat8() {
					fail(fmt.Sprintf("buffer %q", n.Buffer.Name), n.Buffer.DType)
				}
			case *ir.Block:
				for _, b := range n.AllocBuffers {
					if b.DType.IsFloat8() {
						fail(fmt.Sprintf("buffer %q", b.Name), b.DType)
					}
				}
			case ir.Expr:
				if n.DType().IsFloat8() {
					fail(n.String(), n.DType())
				}
			}
			return err == nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// onlyPrimFuncs drops graph-level functions, which the C generator does
// not print.
func onlyPrimFuncs(m *ir.IRModule) *ir.IRModule {
	out := ir.NewIRModule()
	for name, f := range m.PrimFuncs() {
		out = out.With(name, f)
	}
	return out
}

// cacheKey hashes what decides the output: the generator's version, the
// target, the toolchain (compiler, version, flags) and each
// PrimFunc's name, structural hash and text.
func cacheKey(mod *ir.IRModule, target Target, tc *toolchain.Toolchain) string {
	parts := []string{codegenVersion, target.String(), tc.Identity(), tc.CC}
	for name, f := range mod.PrimFuncs() {
		parts = append(parts, name, strconv.FormatUint(ir.StructuralHash(f), 16), script.Print(f))
	}
	for _, name := range mod.Names() {
		if f, ok := mod.Lookup(name); ok {
			if g, ok := f.(*ir.Function); ok {
				parts = append(parts, "graph", name, script.Print(g))
				// The model operators calls come from are not printed,
				// but the executable records them.
				ir.RVisit(g, func(e ir.RExpr) bool {
					if c, ok := e.(*ir.RCall); ok {
						for _, src := range c.Sources {
							parts = append(parts, src.Name, src.Op)
						}
					}
					return true
				})
			}
		}
	}
	return toolchain.Key(parts...)
}

var toolchains sync.Map // key string → *toolchain.Toolchain

// findToolchain finds a toolchain once per process and options.
func findToolchain(ctx context.Context, o toolchain.Options) (*toolchain.Toolchain, error) {
	key := o.CC + "\x00" + o.Triple + "\x00" + strings.Join(o.Flags, "\x00") + "\x00" + os.Getenv("CC")
	if tc, ok := toolchains.Load(key); ok {
		return tc.(*toolchain.Toolchain), nil
	}
	tc, err := toolchain.Find(ctx, o)
	if err != nil {
		return nil, err
	}
	toolchains.Store(key, tc)
	return tc, nil
}
