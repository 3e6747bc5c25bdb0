package cpu

/*
#cgo CFLAGS: -I${SRCDIR}/../../abi
#cgo LDFLAGS: -ldl
#cgo noescape kiln_call_packed
#cgo nocallback kiln_call_packed
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include "kiln_abi.h"

typedef const char* (*kiln_str_fn)(void);

static void* kiln_dlopen(const char* path, char** err) {
	void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (h == NULL) {
		const char* e = dlerror();
		*err = strdup(e ? e : "dlopen failed");
	}
	return h;
}

static void* kiln_dlsym(void* h, const char* name) {
	dlerror();
	return dlsym(h, name);
}

static const char* kiln_call_str(void* fn) { return ((kiln_str_fn)fn)(); }

// kiln_call_packed calls a kernel; on failure it stores a malloc'd copy of
// the thread's error message in *err, read on the thread that failed. The
// argument arrays come as integers (see Module.caller for why). ret, when
// not 0, is the place of a function's result (KilnPackedFuncRet): its value
// at ret, its type code at ret+8.
static int32_t kiln_call_packed(void* fn, void* last_error, uintptr_t args, uintptr_t codes, int32_t n, uintptr_t err, uintptr_t ret) {
	int32_t rc;
	if (ret != 0) {
		rc = ((KilnPackedFuncRet)fn)((KilnValue*)args, (int32_t*)codes, n, (KilnValue*)ret, (int32_t*)(ret + 8));
	} else {
		rc = ((KilnPackedFunc)fn)((KilnValue*)args, (int32_t*)codes, n);
	}
	if (rc != 0) {
		const char* msg = last_error ? ((kiln_str_fn)last_error)() : NULL;
		*(char**)err = strdup(msg && msg[0] ? msg : "kernel failed without a message");
	}
	return rc;
}

static void kiln_dlclose(uintptr_t h) { dlclose((void*)h); }
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sort"
	"strings"
	"sync/atomic"
	"unsafe"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

func init() {
	packedfunc.MustRegister("runtime.module.load_cpu", Load)
}

// ErrClosed reports a call into a module that was closed.
var ErrClosed = errors.New("module closed")

// maxStackArgs is the argument count up to which a call does not allocate.
const maxStackArgs = 16

// Module is a loaded CPU shared object.
type Module struct {
	packedfunc.ImportList
	path    string
	handle  unsafe.Pointer
	lastErr unsafe.Pointer
	meta    *abi.Metadata
	funcs   map[string]*packedfunc.Func
	closed  atomic.Bool
	dev     devices.Device // where the functions' tensors must be
}

// targetKind is the kind of a target string ("cuda" of "cuda -arch=sm_80").
func targetKind(target string) string {
	kind, _, _ := strings.Cut(strings.TrimSpace(target), " ")
	return kind
}

// Load opens a shared object that follows the kernel ABI, reads its
// metadata and exposes each function as a packedfunc.Func whose calls check
// their arguments against the metadata before entering C.
func Load(path string) (packedfunc.Module, error) {
	return LoadModule(path)
}

// LoadModule is Load returning the concrete type (for Metadata).
func LoadModule(path string) (*Module, error) {
	return load(path, devices.CPUDevice)
}

// LoadDeviceHost loads the host library of a module built for a device
// (a cuda artifact's host.so): its functions take tensors on dev, and the
// backend of dev must give the library its device code (Symbol) before
// they can run. Only device backends call it.
func LoadDeviceHost(path string, dev devices.Device) (*Module, error) {
	if dev.Type == devices.CPU {
		return nil, fmt.Errorf("load module %q: LoadDeviceHost is for device modules; use LoadModule", path)
	}
	return load(path, dev)
}

// Symbol returns the address of a symbol the library exports, or nil.
func (m *Module) Symbol(name string) unsafe.Pointer { return m.sym(name) }

func load(path string, dev devices.Device) (*Module, error) {
	if err := checkArch(path); err != nil {
		return nil, fmt.Errorf("load module %q: %w", path, err)
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var cerr *C.char
	h := C.kiln_dlopen(cpath, &cerr)
	if h == nil {
		msg := C.GoString(cerr)
		C.free(unsafe.Pointer(cerr))
		return nil, fmt.Errorf("load module %q: %s", path, msg)
	}
	m := &Module{path: path, handle: h, funcs: map[string]*packedfunc.Func{}}
	fail := func(err error) (*Module, error) {
		C.dlclose(h)
		return nil, fmt.Errorf("load module %q: %w", path, err)
	}
	metaFn := m.sym("kiln_module_metadata")
	if metaFn == nil {
		return fail(errors.New("no kiln_module_metadata symbol: not a kiln module"))
	}
	m.lastErr = m.sym("kiln_last_error")
	if m.lastErr == nil {
		return fail(errors.New("no kiln_last_error symbol"))
	}
	text := C.kiln_call_str(metaFn)
	if text == nil {
		return fail(errors.New("kiln_module_metadata returned NULL"))
	}
	meta, err := abi.ParseMetadata([]byte(C.GoString(text)))
	if err != nil {
		return fail(err)
	}
	m.meta = meta
	m.dev = dev
	// A module with parallel loops runs them on the process's pool; one
	// without the variable (hand-written, or no parallel loop) needs none.
	if slot := m.sym("kiln_parallel_launch"); slot != nil {
		if err := attachPool(slot); err != nil {
			return fail(err)
		}
	}
	if kind := targetKind(meta.Target); dev.Type == devices.CPU && (kind == "cuda" || kind == "nvptx") {
		return fail(fmt.Errorf("the module is built for %q: its functions launch device code and run only where a %s backend loads it, not on %s", meta.Target, kind, dev))
	} else if dev.Type != devices.CPU && kind != dev.Type.String() {
		return fail(fmt.Errorf("the module is built for %q, not for %s", meta.Target, dev.Type))
	}
	for _, fi := range meta.Functions {
		fp := m.sym(fi.SymbolName())
		if fp == nil {
			return fail(fmt.Errorf("metadata lists function %q but the library does not export %s", fi.Name, fi.SymbolName()))
		}
		plan, err := newCallPlan(fi, dev)
		if err != nil {
			return fail(err)
		}
		m.funcs[fi.Name] = packedfunc.New(fi.Name, m.caller(fp, plan))
	}
	runtime.AddCleanup(m, func(h uintptr) { C.kiln_dlclose(C.uintptr_t(h)) }, uintptr(h))
	return m, nil
}

func (m *Module) sym(name string) unsafe.Pointer {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return C.kiln_dlsym(m.handle, cname)
}

// Type is "cpu".
func (m *Module) Type() string { return "cpu" }

// Path is the file the module was loaded from.
func (m *Module) Path() string { return m.path }

// Metadata is the module's metadata document.
func (m *Module) Metadata() *abi.Metadata { return m.meta }

// GetFunction returns an exported function or one from an import.
func (m *Module) GetFunction(name string) (*packedfunc.Func, error) {
	if f, ok := m.funcs[name]; ok {
		return f, nil
	}
	if f, err := m.Lookup(name); err == nil {
		return f, nil
	}
	return nil, fmt.Errorf("module %q: function %q: %w", m.path, name, packedfunc.ErrNotFound)
}

// Functions lists the exported function names.
func (m *Module) Functions() []string {
	out := make([]string, 0, len(m.funcs))
	for n := range m.funcs {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Close ends the module: later calls fail with ErrClosed. Calls already
// running finish normally. The library stays mapped for the life of the
// process (it is opened with RTLD_NODELETE): a library other code may have
// linked against (libgomp in modules built with OpenMP) can keep threads
// running in it, so unloading one can crash the process. Close is
// idempotent.
func (m *Module) Close() error {
	m.closed.Store(true)
	return nil
}

// callPlan is the precomputed argument check of one function.
type callPlan struct {
	info  abi.FuncInfo
	dev   devices.Device  // where tensor arguments must be
	kinds []paramKind     // per param, for the hot path
	dtype []ndarray.DType // per tensor param
	syms  []string        // symbolic dimension names, indexed by symIdx
	dims  [][]dimCheck    // per param
}

// paramKind is abi's parameter kind as a small integer for the hot path.
type paramKind uint8

const (
	kindTensor paramKind = iota
	kindInt
	kindFloat
	kindHandle
)

// kindOf maps a validated metadata kind (abi.ParseMetadata checked it).
func kindOf(k string) paramKind {
	switch k {
	case abi.ParamInt:
		return kindInt
	case abi.ParamFloat:
		return kindFloat
	case abi.ParamHandle:
		return kindHandle
	}
	return kindTensor
}

type dimCheck struct {
	static int64
	sym    int // index into syms, or -1
}

func newCallPlan(fi abi.FuncInfo, dev devices.Device) (*callPlan, error) {
	p := &callPlan{info: fi, dev: dev, kinds: make([]paramKind, len(fi.Params)), dtype: make([]ndarray.DType, len(fi.Params)), dims: make([][]dimCheck, len(fi.Params))}
	symIdx := map[string]int{}
	for i, prm := range fi.Params {
		p.kinds[i] = kindOf(prm.Kind)
		if prm.Kind != abi.ParamTensor {
			continue
		}
		if prm.DType != "" {
			dt, err := ndarray.ParseDType(prm.DType)
			if err != nil {
				return nil, fmt.Errorf("function %q parameter %q: %w", fi.Name, prm.Name, err)
			}
			p.dtype[i] = dt
		}
		if prm.Shape == nil {
			continue
		}
		p.dims[i] = make([]dimCheck, len(prm.Shape))
		for j, d := range prm.Shape {
			if d.Name == "" {
				p.dims[i][j] = dimCheck{static: d.Value, sym: -1}
				continue
			}
			k, ok := symIdx[d.Name]
			if !ok {
				k = len(p.syms)
				symIdx[d.Name] = k
				p.syms = append(p.syms, d.Name)
			}
			p.dims[i][j] = dimCheck{sym: k}
		}
	}
	return p, nil
}

// check validates args against the plan and fills the packed arrays.
func (p *callPlan) check(args []packedfunc.Value, vals []uint64, codes []C.int32_t) error {
	name := p.info.Name
	if len(args) != len(p.kinds) {
		return fmt.Errorf("%s: %w: want %d, got %d", name, packedfunc.ErrArity, len(p.kinds), len(args))
	}
	var symStack [8]int64
	var symSet [8]bool
	symVal, symOK := symStack[:], symSet[:]
	if len(p.syms) > len(symStack) {
		symVal, symOK = make([]int64, len(p.syms)), make([]bool, len(p.syms))
	}
	for i, kind := range p.kinds {
		v := &args[i]
		slot := unsafe.Pointer(&vals[i])
		switch kind {
		case kindTensor:
			a, err := v.AsArray()
			if err != nil {
				return packedfunc.ArgError(name, i, "%q: %w", p.info.Params[i].Name, err)
			}
			if a.Released() {
				return packedfunc.ArgError(name, i, "%q: %w", p.info.Params[i].Name, ndarray.ErrReleased)
			}
			if d := a.Device(); d.Type != p.dev.Type || (d.Type != devices.CPU && d.ID != p.dev.ID) {
				want := p.dev.String()
				if p.dev.Type == devices.CPU {
					want = "cpu"
				}
				return packedfunc.ArgError(name, i, "%q: array is on %s, want %s", p.info.Params[i].Name, d, want)
			}
			if p.dtype[i] != (ndarray.DType{}) && a.DType() != p.dtype[i] {
				return packedfunc.ArgError(name, i, "%q: dtype %s, want %s", p.info.Params[i].Name, a.DType(), p.dtype[i])
			}
			if dims := p.dims[i]; dims != nil {
				shape := a.Shape()
				if len(shape) != len(dims) {
					return packedfunc.ArgError(name, i, "%q: %d dimensions (shape %s), want %d", p.info.Params[i].Name, len(shape), shape, len(dims))
				}
				for j, d := range dims {
					if d.sym < 0 {
						if shape[j] != d.static {
							return packedfunc.ArgError(name, i, "%q: shape %s, want %s", p.info.Params[i].Name, shape, p.describe(p.info.Params[i]))
						}
						continue
					}
					if symOK[d.sym] && symVal[d.sym] != shape[j] {
						return packedfunc.ArgError(name, i, "%q: dimension %d is %d but %s is already %d from an earlier argument", p.info.Params[i].Name, j, shape[j], p.syms[d.sym], symVal[d.sym])
					}
					symVal[d.sym], symOK[d.sym] = shape[j], true
				}
			}
			*(*unsafe.Pointer)(slot) = a.DLTensor()
			codes[i] = C.int32_t(abi.CodeDLTensor)
		case kindInt:
			n, err := v.AsInt()
			if err != nil {
				return packedfunc.ArgError(name, i, "%q: %w", p.info.Params[i].Name, err)
			}
			*(*int64)(slot) = n
			codes[i] = C.int32_t(abi.CodeInt)
		case kindFloat:
			f, err := v.AsFloat()
			if err != nil {
				return packedfunc.ArgError(name, i, "%q: %w", p.info.Params[i].Name, err)
			}
			*(*float64)(slot) = f
			codes[i] = C.int32_t(abi.CodeFloat)
		case kindHandle:
			if !v.IsNil() {
				return packedfunc.ArgError(name, i, "%q: only nil handles can be passed from Go, got %s", p.info.Params[i].Name, v.Kind())
			}
			*(*uintptr)(slot) = 0
			codes[i] = C.int32_t(abi.CodeNull)
		}
	}
	return nil
}

// result converts what a function with a result stored: nil when it ended
// without a return (TVM's None), an int64 or a float64.
func (p *callPlan) result(ret [2]uint64) (packedfunc.Value, error) {
	switch abi.TypeCode(int32(uint32(ret[1]))) {
	case abi.CodeNull:
		return packedfunc.Nil, nil
	case abi.CodeInt:
		return packedfunc.Int(int64(ret[0])), nil
	case abi.CodeFloat:
		return packedfunc.Float(math.Float64frombits(ret[0])), nil
	}
	return packedfunc.Nil, fmt.Errorf("%s: returned a value of type code %d, want int or float (%s)", p.info.Name, int32(uint32(ret[1])), p.info.Ret)
}

func (p *callPlan) describe(prm abi.ParamInfo) string {
	s := "("
	for j, d := range prm.Shape {
		if j > 0 {
			s += ", "
		}
		if d.Name != "" {
			s += d.Name
		} else {
			s += fmt.Sprint(d.Value)
		}
	}
	if len(prm.Shape) == 1 {
		s += ","
	}
	return s + ")"
}

func (m *Module) caller(fp unsafe.Pointer, plan *callPlan) packedfunc.Impl {
	return func(args []packedfunc.Value) (packedfunc.Value, error) {
		if m.closed.Load() {
			return packedfunc.Nil, fmt.Errorf("%s: %w", plan.info.Name, ErrClosed)
		}
		var valStack [maxStackArgs]uint64 // KilnValue is 8 bytes; uint64 keeps it aligned
		var codeStack [maxStackArgs]C.int32_t
		vals, codes := valStack[:], codeStack[:]
		if len(args) > maxStackArgs {
			vals, codes = make([]uint64, len(args)), make([]C.int32_t, len(args))
		}
		if err := plan.check(args, vals, codes); err != nil {
			return packedfunc.Nil, err
		}
		n := len(args)
		if n > math.MaxInt32 {
			return packedfunc.Nil, fmt.Errorf("%s: too many arguments", plan.info.Name)
		}
		var cerr *C.char
		// ret is the result's place for a function that returns one: the
		// value, then the type code, which the function sets.
		var ret [2]uint64
		var retp uintptr
		if plan.info.Ret != "" {
			ret[1] = uint64(abi.CodeNull)
			retp = uintptr(unsafe.Pointer(&ret[0]))
		}
		// The arrays go to C as integers, which spares the per-call cgo
		// pointer check (a fifth of the call's cost). That is sound: they
		// hold no Go pointers (DLTensors live in C memory), a goroutine's
		// stack is never moved while it is inside a cgo call, heap objects
		// never move, and KeepAlive below keeps them, the arguments and the
		// module (whose cleanup unloads the library) alive until C returns.
		rc := C.kiln_call_packed(fp, m.lastErr,
			C.uintptr_t(uintptr(unsafe.Pointer(&vals[0]))),
			C.uintptr_t(uintptr(unsafe.Pointer(&codes[0]))),
			C.int32_t(n),
			C.uintptr_t(uintptr(unsafe.Pointer(&cerr))),
			C.uintptr_t(retp))
		runtime.KeepAlive(&ret)
		runtime.KeepAlive(vals)
		runtime.KeepAlive(codes)
		runtime.KeepAlive(&cerr)
		runtime.KeepAlive(args)
		runtime.KeepAlive(m)
		if rc != 0 {
			msg := C.GoString(cerr)
			C.free(unsafe.Pointer(cerr))
			return packedfunc.Nil, &KernelError{Func: plan.info.Name, Code: int32(rc), Msg: msg}
		}
		if retp != 0 {
			return plan.result(ret)
		}
		return packedfunc.Nil, nil
	}
}

// KernelError is a non-zero return from a kernel, carrying the message the
// kernel left in kiln_last_error().
type KernelError struct {
	Func string
	Code int32
	Msg  string
}

func (e *KernelError) Error() string {
	return fmt.Sprintf("%s: kernel returned %d: %s", e.Func, e.Code, e.Msg)
}
