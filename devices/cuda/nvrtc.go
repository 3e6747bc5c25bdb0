package cuda

// NVRTC, CUDA's runtime compiler, loaded with dlopen on first use. The types
// are declared here; the entry points have had the same names and
// signatures since CUDA 7.

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int nvrtcResult;
typedef struct _nvrtcProgram* nvrtcProgram;

static struct {
	nvrtcResult (*nvrtcVersion)(int*, int*);
	nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*);
	nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*);
	nvrtcResult (*nvrtcGetPTXSize)(nvrtcProgram, size_t*);
	nvrtcResult (*nvrtcGetPTX)(nvrtcProgram, char*);
	nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t*);
	nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char*);
	nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram*);
	const char* (*nvrtcGetErrorString)(nvrtcResult);
	// Optional (NVRTC 11.1 and later): the cubin of a real architecture.
	nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t*);
	nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char*);
} kiln_nvrtc;

struct kiln_nvrtc_sym { const char* name; void** slot; };

#define KILN_NVRTC_SYM(n) { #n, (void**)&kiln_nvrtc.n }

static struct kiln_nvrtc_sym kiln_nvrtc_syms[] = {
	KILN_NVRTC_SYM(nvrtcVersion),
	KILN_NVRTC_SYM(nvrtcCreateProgram),
	KILN_NVRTC_SYM(nvrtcCompileProgram),
	KILN_NVRTC_SYM(nvrtcGetPTXSize),
	KILN_NVRTC_SYM(nvrtcGetPTX),
	KILN_NVRTC_SYM(nvrtcGetProgramLogSize),
	KILN_NVRTC_SYM(nvrtcGetProgramLog),
	KILN_NVRTC_SYM(nvrtcDestroyProgram),
	KILN_NVRTC_SYM(nvrtcGetErrorString),
	{ NULL, NULL },
};

// kiln_nvrtc_open loads NVRTC; NULL on success, else a malloc'd message.
static char* kiln_nvrtc_open(const char* path) {
	void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char* e = dlerror();
		return strdup(e ? e : "dlopen failed");
	}
	for (struct kiln_nvrtc_sym* s = kiln_nvrtc_syms; s->name != NULL; s++) {
		*s->slot = dlsym(h, s->name);
		if (*s->slot == NULL) {
			const char* prefix = "missing symbol ";
			char* msg = malloc(strlen(prefix) + strlen(s->name) + 1);
			if (msg != NULL) {
				strcpy(msg, prefix);
				strcat(msg, s->name);
			}
			dlclose(h);
			return msg;
		}
	}
	kiln_nvrtc.nvrtcGetCUBINSize = dlsym(h, "nvrtcGetCUBINSize");
	kiln_nvrtc.nvrtcGetCUBIN = dlsym(h, "nvrtcGetCUBIN");
	return NULL;
}

static int kiln_nvrtc_has_cubin(void) { return kiln_nvrtc.nvrtcGetCUBIN != NULL && kiln_nvrtc.nvrtcGetCUBINSize != NULL; }

static void kiln_nvrtc_version(int* major, int* minor) {
	if (kiln_nvrtc.nvrtcVersion(major, minor) != 0) *major = *minor = 0;
}

static const char* kiln_nvrtc_error(nvrtcResult r) { return kiln_nvrtc.nvrtcGetErrorString(r); }

// kiln_nvrtc_compile compiles src. *out (PTX, or the cubin when cubin is
// set) and *log come back malloc'd (or NULL), with *out_size bytes in *out;
// *stage names the call that failed.
static nvrtcResult kiln_nvrtc_compile(const char* src, const char* name, int nopts, const char* const* opts,
		int cubin, char** out, size_t* out_size, char** log, const char** stage) {
	nvrtcProgram prog = NULL;
	nvrtcResult r;
	size_t n = 0;
	*out = NULL;
	*out_size = 0;
	*log = NULL;
	*stage = "create program";
	r = kiln_nvrtc.nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL);
	if (r != 0) return r;
	*stage = "compile";
	r = kiln_nvrtc.nvrtcCompileProgram(prog, nopts, opts);
	if (kiln_nvrtc.nvrtcGetProgramLogSize(prog, &n) == 0 && n > 0) {
		*log = (char*)calloc(n + 1, 1);
		if (*log != NULL && kiln_nvrtc.nvrtcGetProgramLog(prog, *log) != 0) (*log)[0] = 0;
	}
	if (r == 0) {
		*stage = cubin ? "get cubin" : "get ptx";
		n = 0;
		r = cubin ? kiln_nvrtc.nvrtcGetCUBINSize(prog, &n) : kiln_nvrtc.nvrtcGetPTXSize(prog, &n);
		if (r == 0) {
			*out = (char*)calloc(n + 1, 1);
			if (*out == NULL) {
				*stage = "allocate output";
			} else {
				*out_size = n;
				r = cubin ? kiln_nvrtc.nvrtcGetCUBIN(prog, *out) : kiln_nvrtc.nvrtcGetPTX(prog, *out);
			}
		}
	}
	kiln_nvrtc.nvrtcDestroyProgram(&prog);
	return r;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"
)

// ErrNoNVRTC reports that no NVRTC library could be loaded.
var ErrNoNVRTC = errors.New("nvrtc not found")

// NVRTCEnv is the environment variable that, when set, names the one NVRTC
// library to load (a path or a file name), instead of the search below.
const NVRTCEnv = "KILN_NVRTC"

// nvrtcNames are tried in order, bare (the loader's search path) and then
// in the CUDA toolkit's library folders.
var nvrtcNames = []string{"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2"}

func nvrtcCandidates() []string {
	if p := os.Getenv(NVRTCEnv); p != "" {
		return []string{p}
	}
	out := append([]string(nil), nvrtcNames...)
	var dirs []string
	for _, env := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if d := os.Getenv(env); d != "" {
			dirs = append(dirs, filepath.Join(d, "lib64"))
		}
	}
	dirs = append(dirs, "/usr/local/cuda/lib64")
	for _, d := range dirs {
		for _, n := range nvrtcNames {
			out = append(out, filepath.Join(d, n))
		}
	}
	return out
}

var nvrtc struct {
	once    sync.Once
	err     error
	mu      sync.Mutex // serializes compiles
	path    string
	version [2]int
}

func loadNVRTC() error {
	nvrtc.once.Do(func() {
		var first string
		for _, path := range nvrtcCandidates() {
			cpath := C.CString(path)
			cerr := C.kiln_nvrtc_open(cpath)
			C.free(unsafe.Pointer(cpath))
			if cerr == nil {
				nvrtc.path = path
				var major, minor C.int
				C.kiln_nvrtc_version(&major, &minor)
				nvrtc.version = [2]int{int(major), int(minor)}
				return
			}
			msg := C.GoString(cerr)
			C.free(unsafe.Pointer(cerr))
			if strings.HasPrefix(msg, "missing symbol ") {
				nvrtc.err = fmt.Errorf("%w: %s lacks %s", ErrNoNVRTC, path, strings.TrimPrefix(msg, "missing symbol "))
				return
			}
			if first == "" {
				first = msg
			}
		}
		if p := os.Getenv(NVRTCEnv); p != "" {
			nvrtc.err = fmt.Errorf("%w: $%s names %s: %s", ErrNoNVRTC, NVRTCEnv, p, first)
			return
		}
		nvrtc.err = fmt.Errorf("%w: tried %s and the same names in $CUDA_HOME/lib64 and /usr/local/cuda/lib64; set $%s to its path (first error: %s)",
			ErrNoNVRTC, strings.Join(nvrtcNames, ", "), NVRTCEnv, first)
	})
	return nvrtc.err
}

// NVRTCVersion loads NVRTC and returns its version and the library path.
func NVRTCVersion() (major, minor int, path string, err error) {
	if err := loadNVRTC(); err != nil {
		return 0, 0, "", err
	}
	return nvrtc.version[0], nvrtc.version[1], nvrtc.path, nil
}

// CompilePTX compiles CUDA C++ source to PTX with NVRTC. name is the
// program's file name in messages; opts are NVRTC options
// ("--gpu-architecture=compute_90", "-default-device", "--use_fast_math").
// The compile log (warnings, or the errors on failure) is returned as log
// and, on failure, included in err. Without NVRTC the error wraps
// ErrNoNVRTC.
func CompilePTX(src, name string, opts []string) (ptx string, log string, err error) {
	out, log, err := compile(src, name, opts, false)
	return string(out), log, err
}

// CompileCUBIN is CompilePTX for a real architecture's machine code: opts
// name one ("--gpu-architecture=sm_90"), and with "--ptxas-options=-v" the
// log holds ptxas's resource report of every kernel. NVRTC before 11.1
// cannot produce cubins; that is an error naming its version.
func CompileCUBIN(src, name string, opts []string) (cubin []byte, log string, err error) {
	if err := loadNVRTC(); err != nil {
		return nil, "", err
	}
	if C.kiln_nvrtc_has_cubin() == 0 {
		return nil, "", fmt.Errorf("nvrtc %d.%d (%s) cannot produce cubins (NVRTC 11.1 or later can)", nvrtc.version[0], nvrtc.version[1], nvrtc.path)
	}
	return compile(src, name, opts, true)
}

func compile(src, name string, opts []string, cubin bool) (out []byte, log string, err error) {
	if err := loadNVRTC(); err != nil {
		return nil, "", err
	}
	if name == "" {
		name = "kernel.cu"
	}
	csrc, cname := C.CString(src), C.CString(name)
	defer C.free(unsafe.Pointer(csrc))
	defer C.free(unsafe.Pointer(cname))
	var copts **C.char
	if len(opts) > 0 {
		copts = (**C.char)(C.calloc(C.size_t(len(opts)), C.size_t(unsafe.Sizeof((*C.char)(nil)))))
		if copts == nil {
			return nil, "", errors.New("nvrtc: out of host memory")
		}
		list := unsafe.Slice(copts, len(opts))
		for i, o := range opts {
			list[i] = C.CString(o)
		}
		defer func() {
			for _, p := range list {
				C.free(unsafe.Pointer(p))
			}
			C.free(unsafe.Pointer(copts))
		}()
	}
	var cout, clog *C.char
	var n C.size_t
	var stage *C.char
	want := C.int(0)
	if cubin {
		want = 1
	}
	nvrtc.mu.Lock()
	r := C.kiln_nvrtc_compile(csrc, cname, C.int(len(opts)), copts, want, &cout, &n, &clog, &stage)
	nvrtc.mu.Unlock()
	if clog != nil {
		log = strings.TrimRight(C.GoString(clog), "\x00\n ")
		C.free(unsafe.Pointer(clog))
	}
	if cout != nil {
		if cubin {
			out = C.GoBytes(unsafe.Pointer(cout), C.int(n))
		} else {
			out = []byte(C.GoString(cout))
		}
		C.free(unsafe.Pointer(cout))
	}
	if r != 0 {
		msg := C.GoString(C.kiln_nvrtc_error(r))
		err := fmt.Errorf("nvrtc %s %q: %s", C.GoString(stage), name, msg)
		if log != "" {
			err = fmt.Errorf("%w:\n%s", err, log)
		}
		return nil, log, err
	}
	return out, log, nil
}

// NVRTC is this package's NVRTC as the compiler's build-time CUDA compiler
// (compiler.CUDACompiler): the kiln command registers it, so builds for
// cuda compile their kernels with the NVRTC installed on the build machine.
type NVRTC struct{}

// CompilePTX is the package's CompilePTX.
func (NVRTC) CompilePTX(src, name string, opts []string) (string, string, error) {
	return CompilePTX(src, name, opts)
}

// CompileCUBIN is the package's CompileCUBIN.
func (NVRTC) CompileCUBIN(src, name string, opts []string) ([]byte, string, error) {
	return CompileCUBIN(src, name, opts)
}

// Identity is "nvrtc MAJOR.MINOR", or the error (wrapping ErrNoNVRTC) that
// says NVRTC cannot be loaded and where it was looked for.
func (NVRTC) Identity() (string, error) {
	major, minor, _, err := NVRTCVersion()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("nvrtc %d.%d", major, minor), nil
}
