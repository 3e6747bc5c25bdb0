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
	void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
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

// kiln_call_packed calls a kernel; on failure it returns a malloc'd copy of
// the thread's error message in *err, read on the thread that failed.
static int32_t kiln_call_packed(void* fn, void* last_error, KilnValue* args, int32_t* codes, int32_t n, char** err) {
	int32_t rc = ((KilnPackedFunc)fn)(args, codes, n);
	if (rc != 0) {
		const char* msg = last_error ? ((kiln_str_fn)last_error)() : NULL;
		*err = strdup(msg && msg[0] ? msg : "kernel failed without a message");
	}
	return rc;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"
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
	path     string
	handle   unsafe.Pointer
	lastErr  unsafe.Pointer
	meta     *abi.Metadata
	funcs    map[string]*packedfunc.Func
	inflight atomic.Int64
	closed   atomic.Bool
	once     sync.Once
}

// Load opens a shared object that follows the kernel ABI, reads its
// metadata and exposes each function as a packedfunc.Func whose calls check
// their arguments against the metadata before entering C.
func Load(path string) (packedfunc.Module, error) {
	return LoadModule(path)
}

// LoadModule is Load returning the concrete type (for Metadata).
func LoadModule(path string) (*Module, error) {
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
	for _, fi := range meta.Functions {
		fp := m.sym(fi.Name)
		if fp == nil {
			return fail(fmt.Errorf("metadata lists function %q but the library does not export it", fi.Name))
		}
		plan, err := newCallPlan(fi)
		if err != nil {
			return fail(err)
		}
		m.funcs[fi.Name] = packedfunc.New(fi.Name, m.caller(fp, plan))
	}
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

// Close unloads the library once calls in flight have returned (waiting up
// to a minute); later calls fail with ErrClosed.
func (m *Module) Close() error {
	var err error
	m.once.Do(func() {
		m.closed.Store(true)
		deadline := time.Now().Add(time.Minute)
		for m.inflight.Load() > 0 {
			if time.Now().After(deadline) {
				err = fmt.Errorf("close module %q: calls still running after a minute; library left loaded", m.path)
				return
			}
			time.Sleep(time.Millisecond)
		}
		if C.dlclose(m.handle) != 0 {
			err = fmt.Errorf("close module %q: dlclose failed", m.path)
		}
	})
	return err
}

// callPlan is the precomputed argument check of one function.
type callPlan struct {
	info  abi.FuncInfo
	dtype []ndarray.DType // per tensor param
	syms  []string        // symbolic dimension names, indexed by symIdx
	dims  [][]dimCheck    // per param
}

type dimCheck struct {
	static int64
	sym    int // index into syms, or -1
}

func newCallPlan(fi abi.FuncInfo) (*callPlan, error) {
	p := &callPlan{info: fi, dtype: make([]ndarray.DType, len(fi.Params)), dims: make([][]dimCheck, len(fi.Params))}
	symIdx := map[string]int{}
	for i, prm := range fi.Params {
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
	if len(args) != len(p.info.Params) {
		return fmt.Errorf("%s: %w: want %d, got %d", name, packedfunc.ErrArity, len(p.info.Params), len(args))
	}
	var symStack [8]int64
	var symSet [8]bool
	symVal, symOK := symStack[:], symSet[:]
	if len(p.syms) > len(symStack) {
		symVal, symOK = make([]int64, len(p.syms)), make([]bool, len(p.syms))
	}
	for i, prm := range p.info.Params {
		v := args[i]
		slot := unsafe.Pointer(&vals[i])
		switch prm.Kind {
		case abi.ParamTensor:
			a, err := v.AsArray()
			if err != nil {
				return packedfunc.ArgError(name, i, "%q: %w", prm.Name, err)
			}
			if a.Released() {
				return packedfunc.ArgError(name, i, "%q: %w", prm.Name, ndarray.ErrReleased)
			}
			if a.Device().Type != devices.CPU {
				return packedfunc.ArgError(name, i, "%q: array is on %s, want cpu", prm.Name, a.Device())
			}
			if p.dtype[i] != (ndarray.DType{}) && a.DType() != p.dtype[i] {
				return packedfunc.ArgError(name, i, "%q: dtype %s, want %s", prm.Name, a.DType(), p.dtype[i])
			}
			if dims := p.dims[i]; dims != nil {
				shape := a.Shape()
				if len(shape) != len(dims) {
					return packedfunc.ArgError(name, i, "%q: %d dimensions (shape %s), want %d", prm.Name, len(shape), shape, len(dims))
				}
				for j, d := range dims {
					if d.sym < 0 {
						if shape[j] != d.static {
							return packedfunc.ArgError(name, i, "%q: shape %s, want %s", prm.Name, shape, p.describe(prm))
						}
						continue
					}
					if symOK[d.sym] && symVal[d.sym] != shape[j] {
						return packedfunc.ArgError(name, i, "%q: dimension %d is %d but %s is already %d from an earlier argument", prm.Name, j, shape[j], p.syms[d.sym], symVal[d.sym])
					}
					symVal[d.sym], symOK[d.sym] = shape[j], true
				}
			}
			*(*unsafe.Pointer)(slot) = a.DLTensor()
			codes[i] = C.int32_t(abi.CodeDLTensor)
		case abi.ParamInt:
			n, err := v.AsInt()
			if err != nil {
				return packedfunc.ArgError(name, i, "%q: %w", prm.Name, err)
			}
			*(*int64)(slot) = n
			codes[i] = C.int32_t(abi.CodeInt)
		case abi.ParamFloat:
			f, err := v.AsFloat()
			if err != nil {
				return packedfunc.ArgError(name, i, "%q: %w", prm.Name, err)
			}
			*(*float64)(slot) = f
			codes[i] = C.int32_t(abi.CodeFloat)
		case abi.ParamHandle:
			if !v.IsNil() {
				return packedfunc.ArgError(name, i, "%q: only nil handles can be passed from Go, got %s", prm.Name, v.Kind())
			}
			*(*uintptr)(slot) = 0
			codes[i] = C.int32_t(abi.CodeNull)
		}
	}
	return nil
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
		m.inflight.Add(1)
		defer m.inflight.Add(-1)
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
		rc := C.kiln_call_packed(fp, m.lastErr, (*C.KilnValue)(unsafe.Pointer(&vals[0])), &codes[0], C.int32_t(n), &cerr)
		runtime.KeepAlive(args)
		if rc != 0 {
			msg := C.GoString(cerr)
			C.free(unsafe.Pointer(cerr))
			return packedfunc.Nil, &KernelError{Func: plan.info.Name, Code: int32(rc), Msg: msg}
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
