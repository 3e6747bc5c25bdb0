package cuda

// The CUDA driver API, loaded with dlopen at run time so that kiln builds on
// machines without the CUDA toolkit or driver. The few types and enum values
// used are declared here (values as in cuda.h); every entry point is looked
// up with dlsym, under its versioned name where one exists.
//
// Each trampoline takes the context to run in and makes it current on the
// calling OS thread before the driver call, inside the same C call: a
// goroutine cannot move to another thread in between, so no Go code needs
// runtime.LockOSThread. Handles (contexts, streams, events, modules,
// functions) cross into Go as uintptr_t and are never dereferenced there.

/*
#cgo LDFLAGS: -ldl
#cgo noescape kiln_cu_launch
#cgo nocallback kiln_cu_launch
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;
typedef struct CUevent_st* CUevent;
typedef int CUjit_option;

enum {
	KILN_CUDA_SUCCESS = 0,
	KILN_CUDA_ERROR_INVALID_VALUE = 1,
	KILN_CUDA_ERROR_OUT_OF_MEMORY = 2,
	KILN_NO_SYMBOL = -1, // not a CUresult: an optional entry point is missing
	KILN_CU_JIT_ERROR_LOG_BUFFER = 5,
	KILN_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
	KILN_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
};

static struct {
	CUresult (*cuInit)(unsigned int);
	CUresult (*cuDriverGetVersion)(int*);
	CUresult (*cuDeviceGetCount)(int*);
	CUresult (*cuDeviceGet)(CUdevice*, int);
	CUresult (*cuDeviceGetName)(char*, int, CUdevice);
	CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
	CUresult (*cuDeviceTotalMem_v2)(size_t*, CUdevice);
	CUresult (*cuDeviceGetPCIBusId)(char*, int, CUdevice);
	CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
	CUresult (*cuCtxSetCurrent)(CUcontext);
	CUresult (*cuCtxSynchronize)(void);
	CUresult (*cuMemAlloc_v2)(CUdeviceptr*, size_t);
	CUresult (*cuMemFree_v2)(CUdeviceptr);
	CUresult (*cuMemGetInfo_v2)(size_t*, size_t*);
	CUresult (*cuMemcpyHtoD_v2)(CUdeviceptr, const void*, size_t);
	CUresult (*cuMemcpyDtoH_v2)(void*, CUdeviceptr, size_t);
	CUresult (*cuMemcpyDtoD_v2)(CUdeviceptr, CUdeviceptr, size_t);
	CUresult (*cuMemcpyHtoDAsync_v2)(CUdeviceptr, const void*, size_t, CUstream);
	CUresult (*cuMemcpyDtoHAsync_v2)(void*, CUdeviceptr, size_t, CUstream);
	CUresult (*cuMemcpyDtoDAsync_v2)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
	CUresult (*cuMemcpyPeer)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t);
	CUresult (*cuMemcpyPeerAsync)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream);
	CUresult (*cuModuleLoadDataEx)(CUmodule*, const void*, unsigned int, CUjit_option*, void**);
	CUresult (*cuModuleUnload)(CUmodule);
	CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
	CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
	CUresult (*cuFuncGetParamInfo)(CUfunction, size_t, size_t*, size_t*);
	CUresult (*cuLaunchKernel)(CUfunction,
		unsigned int, unsigned int, unsigned int,
		unsigned int, unsigned int, unsigned int,
		unsigned int, CUstream, void**, void**);
	CUresult (*cuStreamCreate)(CUstream*, unsigned int);
	CUresult (*cuStreamDestroy_v2)(CUstream);
	CUresult (*cuStreamSynchronize)(CUstream);
	CUresult (*cuEventCreate)(CUevent*, unsigned int);
	CUresult (*cuEventRecord)(CUevent, CUstream);
	CUresult (*cuEventSynchronize)(CUevent);
	CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
	CUresult (*cuEventDestroy_v2)(CUevent);
	CUresult (*cuGetErrorName)(CUresult, const char**);
	CUresult (*cuGetErrorString)(CUresult, const char**);
} kiln_cu;

struct kiln_cu_sym { const char* name; void** slot; int required; };

#define KILN_SYM(n, req) { #n, (void**)&kiln_cu.n, req }

static struct kiln_cu_sym kiln_cu_syms[] = {
	KILN_SYM(cuInit, 1),
	KILN_SYM(cuDriverGetVersion, 1),
	KILN_SYM(cuDeviceGetCount, 1),
	KILN_SYM(cuDeviceGet, 1),
	KILN_SYM(cuDeviceGetName, 1),
	KILN_SYM(cuDeviceGetAttribute, 1),
	KILN_SYM(cuDeviceTotalMem_v2, 1),
	KILN_SYM(cuDeviceGetPCIBusId, 1),
	KILN_SYM(cuDevicePrimaryCtxRetain, 1),
	KILN_SYM(cuCtxSetCurrent, 1),
	KILN_SYM(cuCtxSynchronize, 1),
	KILN_SYM(cuMemAlloc_v2, 1),
	KILN_SYM(cuMemFree_v2, 1),
	KILN_SYM(cuMemGetInfo_v2, 1),
	KILN_SYM(cuMemcpyHtoD_v2, 1),
	KILN_SYM(cuMemcpyDtoH_v2, 1),
	KILN_SYM(cuMemcpyDtoD_v2, 1),
	KILN_SYM(cuMemcpyHtoDAsync_v2, 1),
	KILN_SYM(cuMemcpyDtoHAsync_v2, 1),
	KILN_SYM(cuMemcpyDtoDAsync_v2, 1),
	KILN_SYM(cuMemcpyPeer, 1),
	KILN_SYM(cuMemcpyPeerAsync, 1),
	KILN_SYM(cuModuleLoadDataEx, 1),
	KILN_SYM(cuModuleUnload, 1),
	KILN_SYM(cuModuleGetFunction, 1),
	KILN_SYM(cuFuncSetAttribute, 1),
	KILN_SYM(cuFuncGetParamInfo, 0), // CUDA 12.4+
	KILN_SYM(cuLaunchKernel, 1),
	KILN_SYM(cuStreamCreate, 1),
	KILN_SYM(cuStreamDestroy_v2, 1),
	KILN_SYM(cuStreamSynchronize, 1),
	KILN_SYM(cuEventCreate, 1),
	KILN_SYM(cuEventRecord, 1),
	KILN_SYM(cuEventSynchronize, 1),
	KILN_SYM(cuEventElapsedTime, 1),
	KILN_SYM(cuEventDestroy_v2, 1),
	KILN_SYM(cuGetErrorName, 1),
	KILN_SYM(cuGetErrorString, 1),
	{ NULL, NULL, 0 },
};

// kiln_cu_open loads the driver library. It returns NULL on success or a
// malloc'd copy of dlerror().
static char* kiln_cu_open(const char* path) {
	void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char* e = dlerror();
		return strdup(e ? e : "dlopen failed");
	}
	for (struct kiln_cu_sym* s = kiln_cu_syms; s->name != NULL; s++) {
		*s->slot = dlsym(h, s->name);
		if (*s->slot == NULL && s->required) {
			size_t n = strlen(s->name) + 32;
			char* msg = malloc(n);
			if (msg != NULL) snprintf(msg, n, "missing symbol %s", s->name);
			dlclose(h);
			return msg;
		}
	}
	return NULL;
}

static const char* kiln_cu_error_name(CUresult r) {
	const char* s = NULL;
	if (kiln_cu.cuGetErrorName == NULL || kiln_cu.cuGetErrorName(r, &s) != 0) return NULL;
	return s;
}

static const char* kiln_cu_error_string(CUresult r) {
	const char* s = NULL;
	if (kiln_cu.cuGetErrorString == NULL || kiln_cu.cuGetErrorString(r, &s) != 0) return NULL;
	return s;
}

// Calls that need no context.

static CUresult kiln_cu_init(void) { return kiln_cu.cuInit(0); }
static CUresult kiln_cu_driver_version(int* v) { return kiln_cu.cuDriverGetVersion(v); }
static CUresult kiln_cu_device_count(int* n) { return kiln_cu.cuDeviceGetCount(n); }
static CUresult kiln_cu_device_get(int ordinal, CUdevice* d) { return kiln_cu.cuDeviceGet(d, ordinal); }
static CUresult kiln_cu_device_name(CUdevice d, char* buf, int len) { return kiln_cu.cuDeviceGetName(buf, len, d); }
static CUresult kiln_cu_device_attr(CUdevice d, int attr, int* v) { return kiln_cu.cuDeviceGetAttribute(v, attr, d); }
static CUresult kiln_cu_device_total_mem(CUdevice d, size_t* n) { return kiln_cu.cuDeviceTotalMem_v2(n, d); }
static CUresult kiln_cu_device_pci_bus_id(CUdevice d, char* buf, int len) { return kiln_cu.cuDeviceGetPCIBusId(buf, len, d); }

static CUresult kiln_cu_primary_ctx(CUdevice d, uintptr_t* ctx) {
	CUcontext c = NULL;
	CUresult r = kiln_cu.cuDevicePrimaryCtxRetain(&c, d);
	*ctx = (uintptr_t)c;
	return r;
}

// Calls made in a context.

#define KILN_SET(ctx) do { \
	CUresult r_ = kiln_cu.cuCtxSetCurrent((CUcontext)(ctx)); \
	if (r_ != KILN_CUDA_SUCCESS) return r_; \
} while (0)

static CUresult kiln_cu_mem_info(uintptr_t ctx, size_t* free, size_t* total) {
	KILN_SET(ctx);
	return kiln_cu.cuMemGetInfo_v2(free, total);
}

static CUresult kiln_cu_alloc(uintptr_t ctx, size_t n, CUdeviceptr* p) {
	KILN_SET(ctx);
	return kiln_cu.cuMemAlloc_v2(p, n);
}

static CUresult kiln_cu_free(uintptr_t ctx, CUdeviceptr p) {
	KILN_SET(ctx);
	return kiln_cu.cuMemFree_v2(p);
}

// On a stream, wait_host makes the call return only once the copy is done,
// so the host buffer (Go memory) is not used after the call returns.
static CUresult kiln_cu_htod(uintptr_t ctx, CUdeviceptr dst, const void* src, size_t n, uintptr_t s, int wait_host) {
	KILN_SET(ctx);
	if (s == 0) return kiln_cu.cuMemcpyHtoD_v2(dst, src, n);
	CUresult r = kiln_cu.cuMemcpyHtoDAsync_v2(dst, src, n, (CUstream)s);
	if (r != KILN_CUDA_SUCCESS || !wait_host) return r;
	return kiln_cu.cuStreamSynchronize((CUstream)s);
}

static CUresult kiln_cu_dtoh(uintptr_t ctx, void* dst, CUdeviceptr src, size_t n, uintptr_t s, int wait_host) {
	KILN_SET(ctx);
	if (s == 0) return kiln_cu.cuMemcpyDtoH_v2(dst, src, n);
	CUresult r = kiln_cu.cuMemcpyDtoHAsync_v2(dst, src, n, (CUstream)s);
	if (r != KILN_CUDA_SUCCESS || !wait_host) return r;
	return kiln_cu.cuStreamSynchronize((CUstream)s);
}

static CUresult kiln_cu_dtod(uintptr_t ctx, CUdeviceptr dst, CUdeviceptr src, size_t n, uintptr_t s) {
	KILN_SET(ctx);
	if (s == 0) return kiln_cu.cuMemcpyDtoD_v2(dst, src, n);
	return kiln_cu.cuMemcpyDtoDAsync_v2(dst, src, n, (CUstream)s);
}

static CUresult kiln_cu_peer(uintptr_t ctx, CUdeviceptr dst, uintptr_t dst_ctx, CUdeviceptr src, uintptr_t src_ctx, size_t n, uintptr_t s) {
	KILN_SET(ctx);
	if (s == 0) return kiln_cu.cuMemcpyPeer(dst, (CUcontext)dst_ctx, src, (CUcontext)src_ctx, n);
	return kiln_cu.cuMemcpyPeerAsync(dst, (CUcontext)dst_ctx, src, (CUcontext)src_ctx, n, (CUstream)s);
}

static CUresult kiln_cu_stream_create(uintptr_t ctx, uintptr_t* s) {
	KILN_SET(ctx);
	CUstream st = NULL;
	CUresult r = kiln_cu.cuStreamCreate(&st, 0); // CU_STREAM_DEFAULT
	*s = (uintptr_t)st;
	return r;
}

static CUresult kiln_cu_stream_destroy(uintptr_t ctx, uintptr_t s) {
	KILN_SET(ctx);
	return kiln_cu.cuStreamDestroy_v2((CUstream)s);
}

// The default stream's sync waits for all work in the context.
static CUresult kiln_cu_stream_sync(uintptr_t ctx, uintptr_t s) {
	KILN_SET(ctx);
	if (s == 0) return kiln_cu.cuCtxSynchronize();
	return kiln_cu.cuStreamSynchronize((CUstream)s);
}

static CUresult kiln_cu_event_create(uintptr_t ctx, uintptr_t* e) {
	KILN_SET(ctx);
	CUevent ev = NULL;
	CUresult r = kiln_cu.cuEventCreate(&ev, 0); // CU_EVENT_DEFAULT: timing enabled
	*e = (uintptr_t)ev;
	return r;
}

static CUresult kiln_cu_event_record(uintptr_t ctx, uintptr_t e, uintptr_t s) {
	KILN_SET(ctx);
	return kiln_cu.cuEventRecord((CUevent)e, (CUstream)s);
}

static CUresult kiln_cu_event_sync(uintptr_t ctx, uintptr_t e) {
	KILN_SET(ctx);
	return kiln_cu.cuEventSynchronize((CUevent)e);
}

static CUresult kiln_cu_event_elapsed(uintptr_t ctx, uintptr_t start, uintptr_t end, float* ms) {
	KILN_SET(ctx);
	return kiln_cu.cuEventElapsedTime(ms, (CUevent)start, (CUevent)end);
}

static CUresult kiln_cu_event_destroy(uintptr_t ctx, uintptr_t e) {
	KILN_SET(ctx);
	return kiln_cu.cuEventDestroy_v2((CUevent)e);
}

// kiln_cu_module_load loads a NUL-terminated PTX (or cubin) image; the JIT's
// error log goes to log (C memory of log_len bytes, zeroed by the caller).
static CUresult kiln_cu_module_load(uintptr_t ctx, const char* image, char* log, size_t log_len, uintptr_t* mod) {
	KILN_SET(ctx);
	CUjit_option opts[2] = { KILN_CU_JIT_ERROR_LOG_BUFFER, KILN_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES };
	void* vals[2] = { (void*)log, (void*)(uintptr_t)log_len };
	CUmodule m = NULL;
	CUresult r = kiln_cu.cuModuleLoadDataEx(&m, (const void*)image, 2, opts, vals);
	*mod = (uintptr_t)m;
	return r;
}

// kiln_cu_module_unload waits for the context's work (kernels of the module
// may still run) and unloads the module.
static CUresult kiln_cu_module_unload(uintptr_t ctx, uintptr_t mod) {
	KILN_SET(ctx);
	CUresult sync = kiln_cu.cuCtxSynchronize();
	CUresult r = kiln_cu.cuModuleUnload((CUmodule)mod);
	return r != KILN_CUDA_SUCCESS ? r : sync;
}

static CUresult kiln_cu_module_function(uintptr_t ctx, uintptr_t mod, const char* name, uintptr_t* fn) {
	KILN_SET(ctx);
	CUfunction f = NULL;
	CUresult r = kiln_cu.cuModuleGetFunction(&f, (CUmodule)mod, name);
	*fn = (uintptr_t)f;
	return r;
}

static CUresult kiln_cu_func_set_max_dynamic_smem(uintptr_t ctx, uintptr_t fn, int bytes) {
	KILN_SET(ctx);
	return kiln_cu.cuFuncSetAttribute((CUfunction)fn, KILN_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes);
}

static CUresult kiln_cu_func_param_info(uintptr_t ctx, uintptr_t fn, size_t i, size_t* offset, size_t* size) {
	if (kiln_cu.cuFuncGetParamInfo == NULL) return KILN_NO_SYMBOL;
	KILN_SET(ctx);
	return kiln_cu.cuFuncGetParamInfo((CUfunction)fn, i, offset, size);
}

// kiln_cu_launch launches fn. dims holds gridX, gridY, gridZ, blockX,
// blockY, blockZ. vals holds one 8-byte slot per kernel parameter (a value
// narrower than 8 bytes sits in the slot's low bytes); they are copied into
// C memory and kernelParams points at the copies. cuLaunchKernel copies the
// parameter values before it returns.
static CUresult kiln_cu_launch(uintptr_t ctx, uintptr_t fn, const unsigned int* dims, unsigned int smem, uintptr_t s, const uint64_t* vals, int n) {
	enum { STACK = 32 };
	void* pstack[STACK];
	uint64_t vstack[STACK];
	void** params = pstack;
	uint64_t* copies = vstack;
	CUresult r;
	KILN_SET(ctx);
	if (n > STACK) {
		params = (void**)malloc(sizeof(void*) * (size_t)n);
		copies = (uint64_t*)malloc(sizeof(uint64_t) * (size_t)n);
		if (params == NULL || copies == NULL) {
			free(params);
			free(copies);
			return KILN_CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	for (int i = 0; i < n; i++) {
		copies[i] = vals[i];
		params[i] = &copies[i];
	}
	r = kiln_cu.cuLaunchKernel((CUfunction)fn,
		dims[0], dims[1], dims[2], dims[3], dims[4], dims[5],
		smem, (CUstream)s, n > 0 ? params : NULL, NULL);
	if (n > STACK) {
		free(params);
		free(copies);
	}
	return r;
}

// A host library's view of a loaded device module (see hostmodule.go): the
// context and stream its launches use and its kernels by launch index.
// closed is set when the module is closed; the struct itself is never
// freed, so a launch racing with Close sees closed or a valid handle.
struct kiln_host_mod {
	CUcontext ctx;
	CUstream stream;
	int closed;
	int n;
	CUfunction fns[];
};

static struct kiln_host_mod* kiln_host_mod_new(uintptr_t ctx, uintptr_t stream, const uintptr_t* fns, int n) {
	struct kiln_host_mod* m = (struct kiln_host_mod*)calloc(1, sizeof *m + sizeof(CUfunction) * (size_t)n);
	if (m == NULL) return NULL;
	m->ctx = (CUcontext)ctx;
	m->stream = (CUstream)stream;
	m->n = n;
	for (int i = 0; i < n; i++) m->fns[i] = (CUfunction)fns[i];
	return m;
}

static void kiln_host_mod_close(struct kiln_host_mod* m) { __atomic_store_n(&m->closed, 1, __ATOMIC_RELEASE); }

// kiln_host_launch is the launch hook of host libraries (abi's
// DeviceLaunchHook): dims are grid x, y, z then block x, y, z; args point
// at the kernel's parameter values. A failure writes the CUDA error's name
// and description, with the launch's shape, to err.
static int32_t kiln_host_launch(void* module, int32_t kernel, const int64_t* dims, int32_t shared, void** args, char* err, int32_t err_len) {
	struct kiln_host_mod* m = (struct kiln_host_mod*)module;
	if (m == NULL || __atomic_load_n(&m->closed, __ATOMIC_ACQUIRE)) {
		snprintf(err, (size_t)err_len, "the module's device code was unloaded (module closed)");
		return -1;
	}
	if (kernel < 0 || kernel >= m->n) {
		snprintf(err, (size_t)err_len, "kernel index %d out of range (the device module has %d)", kernel, m->n);
		return -1;
	}
	CUresult r = kiln_cu.cuCtxSetCurrent(m->ctx);
	if (r == KILN_CUDA_SUCCESS) {
		r = kiln_cu.cuLaunchKernel(m->fns[kernel],
			(unsigned int)dims[0], (unsigned int)dims[1], (unsigned int)dims[2],
			(unsigned int)dims[3], (unsigned int)dims[4], (unsigned int)dims[5],
			(unsigned int)shared, m->stream, args, NULL);
	}
	if (r != KILN_CUDA_SUCCESS) {
		const char* name = kiln_cu_error_name(r);
		const char* msg = kiln_cu_error_string(r);
		snprintf(err, (size_t)err_len, "cuLaunchKernel (grid %lldx%lldx%lld, block %lldx%lldx%lld, %d bytes of dynamic shared memory): %s: %s",
			(long long)dims[0], (long long)dims[1], (long long)dims[2], (long long)dims[3], (long long)dims[4], (long long)dims[5], shared,
			name ? name : "CUDA error", msg ? msg : "unknown error");
		return -1;
	}
	return 0;
}

typedef int32_t (*kiln_launch_fn)(void*, int32_t, const int64_t*, int32_t, void**, char*, int32_t);

// kiln_host_install stores the hook and the module in a host library's
// variables (their addresses from dlsym).
static void kiln_host_install(void* hook_slot, void* module_slot, struct kiln_host_mod* m) {
	__atomic_store_n((void**)module_slot, (void*)m, __ATOMIC_RELEASE);
	__atomic_store_n((kiln_launch_fn*)hook_slot, kiln_host_launch, __ATOMIC_RELEASE);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Error is a failed CUDA driver call.
type Error struct {
	Op   string // what was being done ("alloc 4096 bytes on cuda:0")
	Code int    // the CUresult
	Name string // "CUDA_ERROR_OUT_OF_MEMORY"
	Msg  string // the driver's description
	Log  string // the JIT's error log, for module loads
}

// Error formats the error as "cuda <op>: CUDA_ERROR_xxx: <description>".
func (e *Error) Error() string {
	s := "cuda " + e.Op + ": " + e.Name + ": " + e.Msg
	if e.Log != "" {
		s += "\n" + e.Log
	}
	return s
}

// Result codes the package branches on.
const (
	codeInvalidValue = 1
	codeNoSymbol     = -1
)

// cuErr turns a CUresult into an *Error, or nil for CUDA_SUCCESS.
func cuErr(op string, r C.CUresult) error {
	if r == C.KILN_CUDA_SUCCESS {
		return nil
	}
	e := &Error{Op: op, Code: int(r)}
	if r == C.KILN_NO_SYMBOL {
		e.Name, e.Msg = "KILN_NO_SYMBOL", "the driver lacks this entry point"
		return e
	}
	if s := C.kiln_cu_error_name(r); s != nil {
		e.Name = C.GoString(s)
	} else {
		e.Name = fmt.Sprintf("CUDA_ERROR_%d", int(r))
	}
	if s := C.kiln_cu_error_string(r); s != nil {
		e.Msg = C.GoString(s)
	} else {
		e.Msg = "unrecognized error code"
	}
	return e
}

// loadDriver opens libcuda and resolves its entry points; it returns a
// reason the user understands when that fails.
func loadDriver() string {
	var msgs []string
	for _, name := range []string{"libcuda.so.1", "libcuda.so"} {
		cname := C.CString(name)
		cerr := C.kiln_cu_open(cname)
		C.free(unsafe.Pointer(cname))
		if cerr == nil {
			return ""
		}
		msg := C.GoString(cerr)
		C.free(unsafe.Pointer(cerr))
		if len(msg) > len("missing symbol ") && msg[:len("missing symbol ")] == "missing symbol " {
			return fmt.Sprintf("%s lacks %s: the NVIDIA driver is too old for kiln", name, msg[len("missing symbol "):])
		}
		msgs = append(msgs, msg)
	}
	return fmt.Sprintf("libcuda.so.1 not found: no NVIDIA driver on this machine (%s)", msgs[0])
}

func driverInit() error { return cuErr("init", C.kiln_cu_init()) }

func driverVersion() (int, error) {
	var v C.int
	return int(v), cuErr("driver version", C.kiln_cu_driver_version(&v))
}

func deviceCount() (int, error) {
	var n C.int
	return int(n), cuErr("device count", C.kiln_cu_device_count(&n))
}

func deviceGet(ordinal int) (int, error) {
	var d C.CUdevice
	return int(d), cuErr(fmt.Sprintf("get device %d", ordinal), C.kiln_cu_device_get(C.int(ordinal), &d))
}

func deviceName(d int) (string, error) {
	var buf [256]C.char
	if err := cuErr("device name", C.kiln_cu_device_name(C.CUdevice(d), &buf[0], C.int(len(buf)-1))); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

func deviceAttr(d int, attr int) (int, error) {
	var v C.int
	return int(v), cuErr(fmt.Sprintf("device attribute %d", attr), C.kiln_cu_device_attr(C.CUdevice(d), C.int(attr), &v))
}

func deviceTotalMem(d int) (int64, error) {
	var n C.size_t
	return int64(n), cuErr("device total memory", C.kiln_cu_device_total_mem(C.CUdevice(d), &n))
}

func devicePCIBusID(d int) (string, error) {
	var buf [64]C.char
	if err := cuErr("device pci bus id", C.kiln_cu_device_pci_bus_id(C.CUdevice(d), &buf[0], C.int(len(buf)-1))); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

func primaryContext(d int) (uintptr, error) {
	var ctx C.uintptr_t
	return uintptr(ctx), cuErr("", C.kiln_cu_primary_ctx(C.CUdevice(d), &ctx))
}

func memInfo(ctx uintptr) (free, total int64, err error) {
	var f, t C.size_t
	err = cuErr("memory info", C.kiln_cu_mem_info(C.uintptr_t(ctx), &f, &t))
	return int64(f), int64(t), err
}

func memAlloc(ctx uintptr, n int64) (uint64, error) {
	var p C.CUdeviceptr
	err := cuErr("", C.kiln_cu_alloc(C.uintptr_t(ctx), C.size_t(n), &p))
	return uint64(p), err
}

func memFree(ctx uintptr, p uint64) error {
	return cuErr("", C.kiln_cu_free(C.uintptr_t(ctx), C.CUdeviceptr(p)))
}

// memcpyHtoD copies from host memory at src (C memory, or Go memory for the
// duration of the call when waitHost is set).
func memcpyHtoD(ctx uintptr, dst uint64, src unsafe.Pointer, n int64, s uintptr, waitHost bool) error {
	return cuErr("", C.kiln_cu_htod(C.uintptr_t(ctx), C.CUdeviceptr(dst), src, C.size_t(n), C.uintptr_t(s), boolInt(waitHost)))
}

func memcpyDtoH(ctx uintptr, dst unsafe.Pointer, src uint64, n int64, s uintptr, waitHost bool) error {
	return cuErr("", C.kiln_cu_dtoh(C.uintptr_t(ctx), dst, C.CUdeviceptr(src), C.size_t(n), C.uintptr_t(s), boolInt(waitHost)))
}

func memcpyDtoD(ctx uintptr, dst, src uint64, n int64, s uintptr) error {
	return cuErr("", C.kiln_cu_dtod(C.uintptr_t(ctx), C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), C.uintptr_t(s)))
}

func memcpyPeer(ctx uintptr, dst uint64, dstCtx uintptr, src uint64, srcCtx uintptr, n int64, s uintptr) error {
	return cuErr("", C.kiln_cu_peer(C.uintptr_t(ctx), C.CUdeviceptr(dst), C.uintptr_t(dstCtx), C.CUdeviceptr(src), C.uintptr_t(srcCtx), C.size_t(n), C.uintptr_t(s)))
}

func streamCreate(ctx uintptr) (uintptr, error) {
	var s C.uintptr_t
	return uintptr(s), cuErr("", C.kiln_cu_stream_create(C.uintptr_t(ctx), &s))
}

func streamDestroy(ctx, s uintptr) error {
	return cuErr("", C.kiln_cu_stream_destroy(C.uintptr_t(ctx), C.uintptr_t(s)))
}

func streamSync(ctx, s uintptr) error {
	return cuErr("", C.kiln_cu_stream_sync(C.uintptr_t(ctx), C.uintptr_t(s)))
}

func eventCreate(ctx uintptr) (uintptr, error) {
	var e C.uintptr_t
	return uintptr(e), cuErr("create event", C.kiln_cu_event_create(C.uintptr_t(ctx), &e))
}

func eventRecord(ctx, e, s uintptr) error {
	return cuErr("record event", C.kiln_cu_event_record(C.uintptr_t(ctx), C.uintptr_t(e), C.uintptr_t(s)))
}

func eventSync(ctx, e uintptr) error {
	return cuErr("synchronize event", C.kiln_cu_event_sync(C.uintptr_t(ctx), C.uintptr_t(e)))
}

func eventElapsed(ctx, start, end uintptr) (float32, error) {
	var ms C.float
	err := cuErr("event elapsed time", C.kiln_cu_event_elapsed(C.uintptr_t(ctx), C.uintptr_t(start), C.uintptr_t(end), &ms))
	return float32(ms), err
}

func eventDestroy(ctx, e uintptr) error {
	return cuErr("destroy event", C.kiln_cu_event_destroy(C.uintptr_t(ctx), C.uintptr_t(e)))
}

// jitLogSize is the size of the buffer for the PTX JIT's error log.
const jitLogSize = 16 << 10

// moduleLoad loads a PTX image; a JIT failure carries the JIT's log.
func moduleLoad(ctx uintptr, image string) (uintptr, error) {
	cimg := C.CString(image)
	defer C.free(unsafe.Pointer(cimg))
	clog := (*C.char)(C.calloc(jitLogSize, 1))
	if clog == nil {
		return 0, errors.New("cuda load module: out of host memory for the JIT log")
	}
	defer C.free(unsafe.Pointer(clog))
	var mod C.uintptr_t
	err := cuErr("", C.kiln_cu_module_load(C.uintptr_t(ctx), cimg, clog, jitLogSize, &mod))
	var e *Error
	if errors.As(err, &e) {
		e.Log = C.GoString(clog)
	}
	return uintptr(mod), err
}

func moduleUnload(ctx, mod uintptr) error {
	return cuErr("", C.kiln_cu_module_unload(C.uintptr_t(ctx), C.uintptr_t(mod)))
}

func moduleFunction(ctx, mod uintptr, name string) (uintptr, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var fn C.uintptr_t
	err := cuErr(fmt.Sprintf("get function %q", name), C.kiln_cu_module_function(C.uintptr_t(ctx), C.uintptr_t(mod), cname, &fn))
	return uintptr(fn), err
}

func funcSetMaxDynamicSharedMem(ctx, fn uintptr, bytes int) error {
	return cuErr("", C.kiln_cu_func_set_max_dynamic_smem(C.uintptr_t(ctx), C.uintptr_t(fn), C.int(bytes)))
}

// funcParamInfo returns the offset and size of a kernel parameter; code is
// the raw result (codeInvalidValue past the last parameter, codeNoSymbol on
// drivers before CUDA 12.4).
func funcParamInfo(ctx, fn uintptr, i int) (offset, size int, code int) {
	var off, sz C.size_t
	r := C.kiln_cu_func_param_info(C.uintptr_t(ctx), C.uintptr_t(fn), C.size_t(i), &off, &sz)
	return int(off), int(sz), int(r)
}

// launch queues fn on stream s. vals holds one slot per kernel parameter.
func launch(ctx, fn uintptr, dims *[6]uint32, smem uint32, s uintptr, vals []uint64) error {
	var p *C.uint64_t
	if len(vals) > 0 {
		p = (*C.uint64_t)(unsafe.Pointer(&vals[0]))
	}
	return cuErr("", C.kiln_cu_launch(C.uintptr_t(ctx), C.uintptr_t(fn), (*C.uint)(unsafe.Pointer(&dims[0])), C.uint(smem), C.uintptr_t(s), p, C.int(len(vals))))
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// withOp sets the operation an *Error describes when it has none yet; nil
// stays nil.
func withOp(err error, op string) error {
	var e *Error
	if errors.As(err, &e) && e.Op == "" {
		e.Op = op
	}
	return err
}

// hostModNew allocates a host library's view of a loaded module (C memory,
// never freed: see struct kiln_host_mod); nil when out of memory.
func hostModNew(ctx uintptr, fns []uintptr) unsafe.Pointer {
	cf := make([]C.uintptr_t, len(fns)+1)
	for i, f := range fns {
		cf[i] = C.uintptr_t(f)
	}
	return unsafe.Pointer(C.kiln_host_mod_new(C.uintptr_t(ctx), 0, &cf[0], C.int(len(fns))))
}

// hostModClose makes later launches through m fail saying it was closed.
func hostModClose(m unsafe.Pointer) { C.kiln_host_mod_close((*C.struct_kiln_host_mod)(m)) }

// hostInstall stores the launch hook and m in a host library's variables.
func hostInstall(hookSlot, moduleSlot, m unsafe.Pointer) {
	C.kiln_host_install(hookSlot, moduleSlot, (*C.struct_kiln_host_mod)(m))
}
