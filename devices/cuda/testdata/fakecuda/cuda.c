// A fake CUDA driver (libcuda.so.1) for testing devices/cuda without a GPU.
//
// It implements the entry points kiln uses with the signatures and result
// codes of cuda.h, and is strict where the real driver is: calls before
// cuInit fail, calls that need a context fail without a current one on the
// calling thread, device memory lives in its own address range (so a host
// pointer passed as a device pointer is caught), copies are bounds-checked
// against the allocation and its device, streams and modules must belong to
// the current context. Kernels are native C implementations of the kernels
// the tests compile, reading their parameters through kernelParams as the
// real driver does. Streams run their work at once.
//
// KILN_FAKE_CUDA_DEVICES sets the number of devices (default 2; 0 makes
// cuInit fail with CUDA_ERROR_NO_DEVICE). CUDA_VISIBLE_DEVICES, when set,
// shows only the ordinals it lists (up to the first that does not exist),
// numbered from 0 in its order, as the real driver does; the log names
// devices by their ordinals among all of them.
//
// A kernel of a loaded module that has no native implementation here (the
// kernels kiln generates) is still found and launched: its parameters are
// counted and sized from the PTX entry's .param list, checked at launch and
// recorded, and nothing is computed. One kernel kiln generates is computed:
// add_f32_kernel(A, B, C), the kernel of a float32 elementwise add
// C = A + B with one thread per element, so that tests can check numbers
// that went through kiln's own host function and launch. KILN_FAKE_CUDA_LOG
// names a file that receives one line per module load, function lookup,
// launch (grid, block, dynamic shared bytes, stream, each parameter's
// value) and copy between host and device (its bytes), so tests check what
// kiln asks the driver. A launch of a recorded
// kernel named by KILN_FAKE_CUDA_FAIL_LAUNCH fails with
// CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES.

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef int CUjit_option;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_PTX = 218,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_ILLEGAL_ADDRESS = 700,
};

#define MAXDEV 8
#define MAGIC_CTX 0x637478u
#define MAGIC_STREAM 0x737472u
#define MAGIC_EVENT 0x657674u
#define MAGIC_MOD 0x6d6f64u
#define MAGIC_FUNC 0x666e63u
#define DEV_BASE 10 /* CUdevice handles are DEV_BASE + ordinal */
#define TOTAL_MEM (80ull << 30)
#define SMEM_DEFAULT 49152
#define SMEM_OPTIN 232448

struct fctx { unsigned magic; int dev; };
typedef struct fctx* CUcontext;
struct fstream { unsigned magic; struct fctx* ctx; };
typedef struct fstream* CUstream;
struct fevent { unsigned magic; struct fctx* ctx; int recorded; double t; };
typedef struct fevent* CUevent;
struct kdef;
struct fmod { unsigned magic; struct fctx* ctx; char* image; size_t size; int cubin; };
typedef struct fmod* CUmodule;
struct ffunc { unsigned magic; struct fmod* mod; const struct kdef* def; int max_smem; };
typedef struct ffunc* CUfunction;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int inited;
static int ndev = -1;
static struct fctx ctxs[MAXDEV];
static __thread struct fctx* cur;
static int sticky;

static int phys[MAXDEV]; // the ordinal among all devices of each visible one

static int device_count(void) {
	if (ndev < 0) {
		const char* e = getenv("KILN_FAKE_CUDA_DEVICES");
		int all = e ? atoi(e) : 2;
		if (all < 0) all = 0;
		if (all > MAXDEV) all = MAXDEV;
		const char* v = getenv("CUDA_VISIBLE_DEVICES");
		int n = 0;
		if (v == NULL) {
			for (; n < all; n++) phys[n] = n;
		} else {
			while (n < MAXDEV && *v != 0) {
				char* end;
				long o = strtol(v, &end, 10);
				if (end == v || o < 0 || o >= all) break;
				phys[n++] = (int)o;
				v = end;
				while (*v == ' ' || *v == ',') v++;
			}
		}
		ndev = n;
	}
	return ndev;
}

#define NEED_INIT() do { if (!inited) return CUDA_ERROR_NOT_INITIALIZED; } while (0)
#define NEED_CTX() do { NEED_INIT(); if (cur == NULL) return CUDA_ERROR_INVALID_CONTEXT; if (sticky) return sticky; } while (0)

static int dev_index(CUdevice d) {
	int i = d - DEV_BASE;
	return (i >= 0 && i < device_count()) ? i : -1;
}

static int stream_ok(CUstream s) {
	return s == NULL || (s->magic == MAGIC_STREAM && s->ctx == cur);
}

// ---- device memory ------------------------------------------------------

#define MAXALLOC 65536
struct alloc { CUdeviceptr base; size_t size; unsigned char* host; int dev; };
static struct alloc allocs[MAXALLOC];
static int nallocs;
static CUdeviceptr next_addr = 0x7d0000000000ull;

static CUresult mem_alloc(CUdeviceptr* p, size_t n) {
	if (p == NULL || n == 0) return CUDA_ERROR_INVALID_VALUE;
	unsigned char* host = malloc(n);
	if (host == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
	memset(host, 0xcd, n); // device memory is not zeroed
	pthread_mutex_lock(&mu);
	int slot = -1;
	for (int i = 0; i < nallocs; i++) {
		if (allocs[i].host == NULL) { slot = i; break; }
	}
	if (slot < 0) {
		if (nallocs == MAXALLOC) {
			pthread_mutex_unlock(&mu);
			free(host);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		slot = nallocs++;
	}
	CUdeviceptr base = (next_addr + 511) & ~511ull;
	next_addr = base + n + 4096; // a gap: neighbours never look contiguous
	allocs[slot] = (struct alloc){ base, n, host, cur->dev };
	pthread_mutex_unlock(&mu);
	*p = base;
	return CUDA_SUCCESS;
}

static CUresult mem_free(CUdeviceptr p) {
	pthread_mutex_lock(&mu);
	for (int i = 0; i < nallocs; i++) {
		if (allocs[i].host != NULL && allocs[i].base == p) {
			if (allocs[i].dev != cur->dev) break;
			free(allocs[i].host);
			allocs[i].host = NULL;
			pthread_mutex_unlock(&mu);
			return CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&mu);
	return CUDA_ERROR_INVALID_VALUE;
}

// translate returns the host address backing [p, p+n) on device dev, or NULL.
static unsigned char* translate(CUdeviceptr p, size_t n, int dev) {
	unsigned char* out = NULL;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < nallocs; i++) {
		struct alloc* a = &allocs[i];
		if (a->host != NULL && p >= a->base && p < a->base + a->size) {
			if (a->dev == dev && n <= a->size - (p - a->base)) out = a->host + (p - a->base);
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	return out;
}

// ---- errors ---------------------------------------------------------------

static const struct { CUresult code; const char* name; const char* msg; } errs[] = {
	{ CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
	{ CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
	{ CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed" },
	{ CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
	{ CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
	{ CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered" },
	{ 701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch" },
};

CUresult cuGetErrorName(CUresult r, const char** s) {
	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
		if (errs[i].code == r) { *s = errs[i].name; return CUDA_SUCCESS; }
	}
	*s = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult r, const char** s) {
	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
		if (errs[i].code == r) { *s = errs[i].msg; return CUDA_SUCCESS; }
	}
	*s = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

// ---- init, devices, contexts ---------------------------------------------

CUresult cuInit(unsigned int flags) {
	if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
	if (device_count() == 0) return CUDA_ERROR_NO_DEVICE;
	inited = 1;
	return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* v) {
	if (v == NULL) return CUDA_ERROR_INVALID_VALUE;
	*v = 12040;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* n) {
	NEED_INIT();
	if (n == NULL) return CUDA_ERROR_INVALID_VALUE;
	*n = device_count();
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* d, int ordinal) {
	NEED_INIT();
	if (d == NULL) return CUDA_ERROR_INVALID_VALUE;
	if (ordinal < 0 || ordinal >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
	*d = DEV_BASE + ordinal;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
	NEED_INIT();
	int i = dev_index(d);
	if (i < 0) return CUDA_ERROR_INVALID_DEVICE;
	if (name == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
	snprintf(name, (size_t)len, "Kiln Fake GPU %d", phys[i]);
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice d) {
	NEED_INIT();
	if (dev_index(d) < 0) return CUDA_ERROR_INVALID_DEVICE;
	if (v == NULL) return CUDA_ERROR_INVALID_VALUE;
	switch (attr) {
	case 1: *v = 1024; break;        // max threads per block
	case 2: case 3: *v = 1024; break; // max block dim x, y
	case 4: *v = 64; break;          // max block dim z
	case 5: *v = 2147483647; break;  // max grid dim x
	case 6: case 7: *v = 65535; break;
	case 8: *v = SMEM_DEFAULT; break;
	case 10: *v = 32; break;
	case 13: *v = 1755000; break;
	case 16: *v = 132; break;
	case 38: *v = 52428800; break;
	case 75: case 76: {
		// Compute capability: 9.0, or KILN_FAKE_CUDA_CC ("80" is 8.0).
		const char* e = getenv("KILN_FAKE_CUDA_CC");
		int cc = e ? atoi(e) : 90;
		*v = attr == 75 ? cc / 10 : cc % 10;
		break;
	}
	case 97: *v = SMEM_OPTIN; break;
	default: return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* n, CUdevice d) {
	NEED_INIT();
	if (dev_index(d) < 0) return CUDA_ERROR_INVALID_DEVICE;
	*n = TOTAL_MEM;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char* buf, int len, CUdevice d) {
	NEED_INIT();
	int i = dev_index(d);
	if (i < 0) return CUDA_ERROR_INVALID_DEVICE;
	if (buf == NULL || len < 13) return CUDA_ERROR_INVALID_VALUE;
	snprintf(buf, (size_t)len, "0000:%02x:00.0", 0x40 + i);
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
	NEED_INIT();
	int i = dev_index(d);
	if (i < 0) return CUDA_ERROR_INVALID_DEVICE;
	if (c == NULL) return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	ctxs[i].magic = MAGIC_CTX;
	ctxs[i].dev = i;
	pthread_mutex_unlock(&mu);
	*c = &ctxs[i];
	return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext c) {
	NEED_INIT();
	if (c != NULL && c->magic != MAGIC_CTX) return CUDA_ERROR_INVALID_CONTEXT;
	cur = c;
	return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
	NEED_CTX();
	return CUDA_SUCCESS;
}

// ---- memory ---------------------------------------------------------------

CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
	NEED_CTX();
	return mem_alloc(p, n);
}

CUresult cuMemFree_v2(CUdeviceptr p) {
	NEED_CTX();
	return mem_free(p);
}

CUresult cuMemGetInfo_v2(size_t* free_, size_t* total) {
	NEED_CTX();
	size_t used = 0;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < nallocs; i++) {
		if (allocs[i].host != NULL && allocs[i].dev == cur->dev) used += allocs[i].size;
	}
	pthread_mutex_unlock(&mu);
	*free_ = TOTAL_MEM - used;
	*total = TOTAL_MEM;
	return CUDA_SUCCESS;
}

static void fake_log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
	NEED_CTX();
	unsigned char* d = translate(dst, n, cur->dev);
	if (d == NULL || src == NULL) return CUDA_ERROR_INVALID_VALUE;
	memcpy(d, src, n);
	fake_log("copy htod %zu bytes dev %d\n", n, phys[cur->dev]);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
	NEED_CTX();
	unsigned char* s = translate(src, n, cur->dev);
	if (s == NULL || dst == NULL) return CUDA_ERROR_INVALID_VALUE;
	memcpy(dst, s, n);
	fake_log("copy dtoh %zu bytes dev %d\n", n, phys[cur->dev]);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
	NEED_CTX();
	unsigned char* d = translate(dst, n, cur->dev);
	unsigned char* s = translate(src, n, cur->dev);
	if (d == NULL || s == NULL) return CUDA_ERROR_INVALID_VALUE;
	memmove(d, s, n);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
	NEED_CTX();
	if (!stream_ok(s)) return CUDA_ERROR_INVALID_HANDLE;
	return cuMemcpyHtoD_v2(dst, src, n);
}

CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream s) {
	NEED_CTX();
	if (!stream_ok(s)) return CUDA_ERROR_INVALID_HANDLE;
	return cuMemcpyDtoH_v2(dst, src, n);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
	NEED_CTX();
	if (!stream_ok(s)) return CUDA_ERROR_INVALID_HANDLE;
	return cuMemcpyDtoD_v2(dst, src, n);
}

CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n) {
	NEED_CTX();
	if (dctx == NULL || sctx == NULL || dctx->magic != MAGIC_CTX || sctx->magic != MAGIC_CTX) return CUDA_ERROR_INVALID_CONTEXT;
	unsigned char* d = translate(dst, n, dctx->dev);
	unsigned char* s = translate(src, n, sctx->dev);
	if (d == NULL || s == NULL) return CUDA_ERROR_INVALID_VALUE;
	memmove(d, s, n);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n, CUstream s) {
	NEED_CTX();
	if (!stream_ok(s)) return CUDA_ERROR_INVALID_HANDLE;
	return cuMemcpyPeer(dst, dctx, src, sctx, n);
}

// ---- streams and events -------------------------------------------------

CUresult cuStreamCreate(CUstream* s, unsigned int flags) {
	NEED_CTX();
	if (s == NULL || flags > 1) return CUDA_ERROR_INVALID_VALUE;
	struct fstream* st = calloc(1, sizeof *st);
	st->magic = MAGIC_STREAM;
	st->ctx = cur;
	*s = st;
	return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream s) {
	NEED_CTX();
	if (s == NULL || !stream_ok(s)) return CUDA_ERROR_INVALID_HANDLE;
	s->magic = 0;
	free(s);
	return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s) {
	NEED_CTX();
	if (!stream_ok(s)) return CUDA_ERROR_INVALID_HANDLE;
	return CUDA_SUCCESS;
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

CUresult cuEventCreate(CUevent* e, unsigned int flags) {
	NEED_CTX();
	if (e == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
	struct fevent* ev = calloc(1, sizeof *ev);
	ev->magic = MAGIC_EVENT;
	ev->ctx = cur;
	*e = ev;
	return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent e, CUstream s) {
	NEED_CTX();
	if (e == NULL || e->magic != MAGIC_EVENT || e->ctx != cur || !stream_ok(s)) return CUDA_ERROR_INVALID_HANDLE;
	e->t = now();
	e->recorded = 1;
	return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(CUevent e) {
	NEED_CTX();
	if (e == NULL || e->magic != MAGIC_EVENT) return CUDA_ERROR_INVALID_HANDLE;
	return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
	NEED_CTX();
	if (ms == NULL) return CUDA_ERROR_INVALID_VALUE;
	if (a == NULL || b == NULL || a->magic != MAGIC_EVENT || b->magic != MAGIC_EVENT) return CUDA_ERROR_INVALID_HANDLE;
	if (!a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
	*ms = (float)((b->t - a->t) * 1e3);
	return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent e) {
	NEED_CTX();
	if (e == NULL || e->magic != MAGIC_EVENT) return CUDA_ERROR_INVALID_HANDLE;
	e->magic = 0;
	free(e);
	return CUDA_SUCCESS;
}

// ---- kernels ----------------------------------------------------------------

// A kernel runs for every thread index i in [0, threads) of a 1-D launch;
// it returns non-zero on an out-of-bounds access.
struct kdef {
	const char* name;
	int nparams;
	size_t sizes[8];
	int (*run)(void** params, long long threads, int dev);
};

// add_f32 computes c[i] = a[i] + b[i] for the first m elements.
static int add_f32(CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, long long m, int dev) {
	if (m <= 0) return 0;
	float* x = (float*)translate(a, (size_t)m * 4, dev);
	float* y = (float*)translate(b, (size_t)m * 4, dev);
	float* z = (float*)translate(c, (size_t)m * 4, dev);
	if (!x || !y || !z) return 1;
	for (long long i = 0; i < m; i++) z[i] = x[i] + y[i];
	return 0;
}

static int k_vadd(void** p, long long threads, int dev) {
	int n = *(int*)p[3];
	return add_f32(*(CUdeviceptr*)p[0], *(CUdeviceptr*)p[1], *(CUdeviceptr*)p[2], n < threads ? n : threads, dev);
}

static int k_scale_f32(void** p, long long threads, int dev) {
	CUdeviceptr xp = *(CUdeviceptr*)p[0];
	float s = *(float*)p[1];
	int n = *(int*)p[2];
	long long m = n < threads ? n : threads;
	if (m <= 0) return 0;
	float* x = (float*)translate(xp, (size_t)m * 4, dev);
	if (!x) return 1;
	for (long long i = 0; i < m; i++) x[i] *= s;
	return 0;
}

static int k_axpy_f64(void** p, long long threads, int dev) {
	double alpha = *(double*)p[0];
	CUdeviceptr xp = *(CUdeviceptr*)p[1], yp = *(CUdeviceptr*)p[2];
	long long n = *(long long*)p[3];
	long long m = n < threads ? n : threads;
	if (m <= 0) return 0;
	double* x = (double*)translate(xp, (size_t)m * 8, dev);
	double* y = (double*)translate(yp, (size_t)m * 8, dev);
	if (!x || !y) return 1;
	for (long long i = 0; i < m; i++) y[i] = alpha * x[i] + y[i];
	return 0;
}

// k_add_f32 is kiln's add_f32_kernel(A, B, C): C[i] = A[i] + B[i] for each
// of the launch's threads.
static int k_add_f32(void** p, long long threads, int dev) {
	return add_f32(*(CUdeviceptr*)p[0], *(CUdeviceptr*)p[1], *(CUdeviceptr*)p[2], threads, dev);
}

static const struct kdef kdefs[] = {
	{ "vadd", 4, { 8, 8, 8, 4 }, k_vadd },
	{ "add_f32_kernel", 3, { 8, 8, 8 }, k_add_f32 },
	{ "scale_f32", 3, { 8, 4, 4 }, k_scale_f32 },
	{ "axpy_f64", 4, { 8, 8, 8, 8 }, k_axpy_f64 },
};

static void fake_log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void fake_log(const char* fmt, ...) {
	const char* path = getenv("KILN_FAKE_CUDA_LOG");
	if (path == NULL || *path == 0) return;
	static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
	pthread_mutex_lock(&log_mu);
	FILE* f = fopen(path, "a");
	if (f != NULL) {
		va_list ap;
		va_start(ap, fmt);
		vfprintf(f, fmt, ap);
		va_end(ap);
		fclose(f);
	}
	pthread_mutex_unlock(&log_mu);
}

// recording_def makes the definition of a kernel without a native
// implementation from its PTX entry: .param .u64/.s64/.f64/.b64 are 8
// bytes, .u32/.s32/.f32/.b32 4, .u16/.s16/.f16/.b16 2, .u8/.s8/.b8 1.
static const struct kdef* recording_def(const char* image, const char* name) {
	char entry[256];
	snprintf(entry, sizeof entry, ".entry %s(", name);
	const char* p = strstr(image, entry);
	if (p == NULL) return NULL;
	p += strlen(entry);
	const char* end = strchr(p, ')');
	if (end == NULL) return NULL;
	struct kdef* d = calloc(1, sizeof *d);
	d->name = strdup(name);
	for (const char* q = strstr(p, ".param"); q != NULL && q < end; q = strstr(q + 6, ".param")) {
		const char* t = q + 6;
		while (*t == ' ' || *t == '\t') t++;
		size_t size = 0;
		if (*t == '.') {
			int bits = atoi(t + 2);
			size = (size_t)(bits / 8);
		}
		if (size == 0 || d->nparams >= 8) {
			free((void*)d->name);
			free(d);
			return NULL;
		}
		d->sizes[d->nparams++] = size;
	}
	return d;
}

CUresult cuModuleLoadDataEx(CUmodule* m, const void* image, unsigned int nopts, CUjit_option* opts, void** vals) {
	NEED_CTX();
	if (m == NULL || image == NULL || (nopts > 0 && (opts == NULL || vals == NULL))) return CUDA_ERROR_INVALID_VALUE;
	char* log = NULL;
	size_t loglen = 0;
	for (unsigned i = 0; i < nopts; i++) {
		if (opts[i] == 5) log = (char*)vals[i];
		else if (opts[i] == 6) loglen = (size_t)(uintptr_t)vals[i];
		else return CUDA_ERROR_INVALID_VALUE;
	}
	const char* text = (const char*)image;
	if (memcmp(text, "\x7f" "ELF", 4) == 0) {
		// A cubin: an ELF64 file whose section headers end it.
		const unsigned char* h = (const unsigned char*)image;
		uint64_t shoff;
		uint16_t shentsize, shnum;
		memcpy(&shoff, h + 0x28, 8);
		memcpy(&shentsize, h + 0x3a, 2);
		memcpy(&shnum, h + 0x3c, 2);
		if (h[4] != 2 || shoff == 0 || shnum == 0 || shoff > (1u << 30)) {
			if (log != NULL && loglen > 0) snprintf(log, loglen, "fake driver: not a 64-bit ELF cubin");
			return CUDA_ERROR_INVALID_PTX;
		}
		size_t size = (size_t)shoff + (size_t)shnum * shentsize;
		fake_log("load cubin %zu bytes\n", size);
		struct fmod* mod = calloc(1, sizeof *mod);
		mod->magic = MAGIC_MOD;
		mod->ctx = cur;
		mod->image = malloc(size);
		memcpy(mod->image, image, size);
		mod->size = size;
		mod->cubin = 1;
		*m = mod;
		return CUDA_SUCCESS;
	}
	if (strstr(text, ".version") == NULL || strstr(text, ".entry") == NULL) {
		if (log != NULL && loglen > 0) snprintf(log, loglen, "ptxas fatal   : fake driver: image is not PTX");
		return CUDA_ERROR_INVALID_PTX;
	}
	fake_log("load ptx %zu bytes\n", strlen(text));
	struct fmod* mod = calloc(1, sizeof *mod);
	mod->magic = MAGIC_MOD;
	mod->ctx = cur;
	mod->image = strdup(text);
	*m = mod;
	return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule m) {
	NEED_CTX();
	if (m == NULL || m->magic != MAGIC_MOD || m->ctx != cur) return CUDA_ERROR_INVALID_HANDLE;
	m->magic = 0;
	free(m->image);
	free(m);
	return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
	NEED_CTX();
	if (f == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
	if (m == NULL || m->magic != MAGIC_MOD || m->ctx != cur) return CUDA_ERROR_INVALID_HANDLE;
	if (m->cubin) {
		// The kernel's symbol in the cubin's string table; its parameters
		// are not read from the cubin, so it cannot be launched here.
		size_t n = strlen(name) + 1;
		for (size_t i = 0; i + n <= m->size; i++) {
			if (memcmp(m->image + i, name, n) == 0 && (i == 0 || m->image[i - 1] == 0 || m->image[i - 1] == '.')) {
				fake_log("function %s in cubin\n", name);
				struct ffunc* fn = calloc(1, sizeof *fn);
				fn->magic = MAGIC_FUNC;
				fn->mod = m;
				fn->def = NULL;
				fn->max_smem = SMEM_DEFAULT;
				*f = fn;
				return CUDA_SUCCESS;
			}
		}
		return CUDA_ERROR_NOT_FOUND;
	}
	if (m->cubin) {
		// The kernel's symbol in the cubin's string table; its parameters
		// are not read from the cubin, so it cannot be launched here.
		size_t n = strlen(name) + 1;
		for (size_t i = 0; i + n <= m->size; i++) {
			if (memcmp(m->image + i, name, n) == 0 && (i == 0 || m->image[i - 1] == 0 || m->image[i - 1] == '.')) {
				fake_log("function %s in cubin\n", name);
				struct ffunc* fn = calloc(1, sizeof *fn);
				fn->magic = MAGIC_FUNC;
				fn->mod = m;
				fn->def = NULL;
				fn->max_smem = SMEM_DEFAULT;
				*f = fn;
				return CUDA_SUCCESS;
			}
		}
		return CUDA_ERROR_NOT_FOUND;
	}
	char entry[256];
	snprintf(entry, sizeof entry, ".entry %s(", name);
	if (strstr(m->image, entry) == NULL) return CUDA_ERROR_NOT_FOUND;
	for (size_t i = 0; i < sizeof(kdefs) / sizeof(kdefs[0]); i++) {
		if (strcmp(kdefs[i].name, name) == 0) {
			struct ffunc* fn = calloc(1, sizeof *fn);
			fn->magic = MAGIC_FUNC;
			fn->mod = m;
			fn->def = &kdefs[i];
			fn->max_smem = SMEM_DEFAULT;
			*f = fn;
			return CUDA_SUCCESS;
		}
	}
	const struct kdef* d = recording_def(m->image, name);
	if (d == NULL) return CUDA_ERROR_NOT_FOUND;
	fake_log("function %s params %d\n", name, d->nparams);
	struct ffunc* fn = calloc(1, sizeof *fn);
	fn->magic = MAGIC_FUNC;
	fn->mod = m;
	fn->def = d;
	fn->max_smem = SMEM_DEFAULT;
	*f = fn;
	return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction f, int attr, int v) {
	NEED_CTX();
	if (f == NULL || f->magic != MAGIC_FUNC) return CUDA_ERROR_INVALID_HANDLE;
	if (attr != 8 || v < 0 || v > SMEM_OPTIN) return CUDA_ERROR_INVALID_VALUE;
	f->max_smem = v;
	return CUDA_SUCCESS;
}

CUresult cuFuncGetParamInfo(CUfunction f, size_t i, size_t* offset, size_t* size) {
	NEED_CTX();
	if (f == NULL || f->magic != MAGIC_FUNC) return CUDA_ERROR_INVALID_HANDLE;
	if (f->def == NULL) return CUDA_ERROR_NOT_FOUND; // a cubin's kernel: parameters unknown here
	if (offset == NULL || size == NULL || i >= (size_t)f->def->nparams) return CUDA_ERROR_INVALID_VALUE;
	size_t off = 0;
	for (size_t j = 0; j < i; j++) off += f->def->sizes[j];
	*offset = off;
	*size = f->def->sizes[i];
	return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
		unsigned int bx, unsigned int by, unsigned int bz,
		unsigned int smem, CUstream s, void** params, void** extra) {
	NEED_CTX();
	if (f == NULL || f->magic != MAGIC_FUNC || f->mod->magic != MAGIC_MOD || f->mod->ctx != cur) return CUDA_ERROR_INVALID_HANDLE;
	if (!stream_ok(s)) return CUDA_ERROR_INVALID_HANDLE;
	if (extra != NULL) return CUDA_ERROR_INVALID_VALUE;
	if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0) return CUDA_ERROR_INVALID_VALUE;
	if ((unsigned long long)bx * by * bz > 1024 || bz > 64 || gy > 65535 || gz > 65535) return CUDA_ERROR_INVALID_VALUE;
	if ((int)smem > f->max_smem) return CUDA_ERROR_INVALID_VALUE;
	if (f->def == NULL) return CUDA_ERROR_NOT_FOUND; // a cubin's kernel: parameters unknown here
	if (f->def->nparams > 0 && params == NULL) return CUDA_ERROR_INVALID_VALUE;
	for (int i = 0; i < f->def->nparams; i++) {
		if (params[i] == NULL) return CUDA_ERROR_INVALID_VALUE;
	}
	if (f->def->run == NULL) {
		const char* failing = getenv("KILN_FAKE_CUDA_FAIL_LAUNCH");
		if (failing != NULL && strcmp(failing, f->def->name) == 0) return 701;
	}
	// Log the launch and each parameter's value.
	char vals[512];
	size_t off = 0;
	vals[0] = 0;
	for (int i = 0; i < f->def->nparams && off < sizeof vals; i++) {
		unsigned long long v = 0;
		memcpy(&v, params[i], f->def->sizes[i]);
		off += (size_t)snprintf(vals + off, sizeof vals - off, " %#llx", v);
	}
	fake_log("launch %s grid %u %u %u block %u %u %u smem %u stream %s dev %d params%s\n", f->def->name,
		gx, gy, gz, bx, by, bz, smem, s == NULL ? "default" : "created", phys[cur->dev], vals);
	if (f->def->run == NULL) return CUDA_SUCCESS; // a recorded kernel computes nothing
	// The fake kernels are 1-D: threads of the x dimensions only.
	if (f->def->run(params, (long long)gx * bx, cur->dev) != 0) sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
	return CUDA_SUCCESS;
}
