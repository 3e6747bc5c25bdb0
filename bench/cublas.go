package main

// cuBLAS, the reference of the cuda benchmark's matmuls on a GPU, loaded
// with dlopen at run time (as devices/cuda loads the driver) so the bench
// builds without the CUDA toolkit. Its handle runs on the device's primary
// context, the one kiln's driver calls use, and on the default stream.

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>

static void* kiln_cublas_lib;
static int (*kiln_cublasCreate)(void**);
static int (*kiln_cublasDestroy)(void*);
static int (*kiln_cublasSgemm)(void*, int, int, int, int, int, const float*, const float*, int, const float*, int, const float*, float*, int);
static int (*kiln_cublasGemmEx)(void*, int, int, int, int, int, const void*, const void*, int, int, const void*, int, int, const void*, void*, int, int, int, int);

static const char* kiln_cublas_open(const char* path) {
	void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		return dlerror();
	}
	kiln_cublasCreate = (int (*)(void**))dlsym(h, "cublasCreate_v2");
	kiln_cublasDestroy = (int (*)(void*))dlsym(h, "cublasDestroy_v2");
	kiln_cublasSgemm = (int (*)(void*, int, int, int, int, int, const float*, const float*, int, const float*, int, const float*, float*, int))dlsym(h, "cublasSgemm_v2");
	kiln_cublasGemmEx = (int (*)(void*, int, int, int, int, int, const void*, const void*, int, int, const void*, int, int, const void*, void*, int, int, int, int))dlsym(h, "cublasGemmEx");
	if (!kiln_cublasCreate || !kiln_cublasDestroy || !kiln_cublasSgemm || !kiln_cublasGemmEx) {
		dlclose(h);
		return "it lacks cublasCreate_v2, cublasDestroy_v2, cublasSgemm_v2 or cublasGemmEx";
	}
	kiln_cublas_lib = h;
	return NULL;
}

static int kiln_cublas_create(uintptr_t* out) {
	void* h = NULL;
	int r = kiln_cublasCreate(&h);
	*out = (uintptr_t)h;
	return r;
}

static int kiln_cublas_destroy(uintptr_t h) { return kiln_cublasDestroy((void*)h); }

// Row-major C (m×n) = A (m×k) · B (k×n) is column-major Cᵀ = Bᵀ · Aᵀ.
static int kiln_cublas_sgemm(uintptr_t h, int m, int n, int k, uintptr_t a, uintptr_t b, uintptr_t c) {
	float one = 1, zero = 0;
	return kiln_cublasSgemm((void*)h, 0, 0, n, m, k, &one, (const float*)b, n, (const float*)a, k, &zero, (float*)c, n);
}

// The same over float16 operands and C, accumulated in float32
// (CUDA_R_16F = 2, CUBLAS_COMPUTE_32F = 68, CUBLAS_GEMM_DEFAULT = -1).
static int kiln_cublas_hgemm(uintptr_t h, int m, int n, int k, uintptr_t a, uintptr_t b, uintptr_t c) {
	float one = 1, zero = 0;
	return kiln_cublasGemmEx((void*)h, 0, 0, n, m, k, &one, (const void*)b, 2, n, (const void*)a, 2, k, &zero, (void*)c, 2, n, 68, -1);
}
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"unsafe"

	"github.com/kiln-ml/kiln/devices"
)

// cublasLibs are the names tried, KILN_CUBLAS first when it is set.
var cublasLibs = []string{"libcublas.so.12", "libcublas.so.11", "libcublas.so"}

var cublasOnce struct {
	sync.Once
	path string
	err  error
}

// openCuBLAS loads cuBLAS once and says which library it loaded.
func openCuBLAS() (string, error) {
	cublasOnce.Do(func() {
		libs := cublasLibs
		if p := os.Getenv("KILN_CUBLAS"); p != "" {
			libs = []string{p}
		}
		var why []string
		for _, l := range libs {
			cs := C.CString(l)
			msg := C.kiln_cublas_open(cs)
			C.free(unsafe.Pointer(cs))
			if msg == nil {
				cublasOnce.path = l
				return
			}
			why = append(why, C.GoString(msg))
		}
		cublasOnce.err = fmt.Errorf("no cuBLAS (set KILN_CUBLAS to its library): %s", strings.Join(why, "; "))
	})
	return cublasOnce.path, cublasOnce.err
}

// cublasHandle is a cuBLAS handle on the current device.
type cublasHandle struct{ h C.uintptr_t }

func newCuBLAS() (*cublasHandle, error) {
	if _, err := openCuBLAS(); err != nil {
		return nil, err
	}
	var h C.uintptr_t
	if r := C.kiln_cublas_create(&h); r != 0 {
		return nil, fmt.Errorf("cublasCreate: status %d", int(r))
	}
	return &cublasHandle{h: h}, nil
}

func (c *cublasHandle) Close() { C.kiln_cublas_destroy(c.h) }

// gemm queues row-major C (m×n) = A (m×k) · B (k×n) on the default stream,
// float32 or (half) float16 operands and output.
func (c *cublasHandle) gemm(half bool, m, n, k int, a, b, out devices.Ptr) error {
	var r C.int
	name := "cublasSgemm"
	if half {
		r, name = C.kiln_cublas_hgemm(c.h, C.int(m), C.int(n), C.int(k), C.uintptr_t(a), C.uintptr_t(b), C.uintptr_t(out)), "cublasGemmEx"
	} else {
		r = C.kiln_cublas_sgemm(c.h, C.int(m), C.int(n), C.int(k), C.uintptr_t(a), C.uintptr_t(b), C.uintptr_t(out))
	}
	if r != 0 {
		return fmt.Errorf("%s %d×%d×%d: status %d", name, m, n, k, int(r))
	}
	return nil
}
