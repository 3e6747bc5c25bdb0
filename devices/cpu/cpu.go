// Package cpu is the host CPU backend: a DeviceAPI over aligned C memory,
// the host's attributes, and the loader of compiled CPU modules (shared
// objects that follow the kernel ABI of package abi).
//
// Importing cpu registers the backend with package devices.
package cpu

/*
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

static void* kiln_cpu_alloc(size_t n, size_t align) {
	void* p = NULL;
	if (posix_memalign(&p, align, n) != 0) return NULL;
	return p;
}

static void kiln_memcpy(uintptr_t dst, uintptr_t src, size_t n) {
	memcpy((void*)dst, (const void*)src, n);
}
*/
import "C"

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/kiln-ml/kiln/devices"
)

func init() { devices.Register(api{}) }

type api struct{}

func (api) Type() devices.Type { return devices.CPU }
func (api) Count() int         { return 1 }

func checkScope(scope string) error {
	if scope != "" && scope != "global" {
		return fmt.Errorf("%w %q on cpu (cpu has \"global\")", devices.ErrBadScope, scope)
	}
	return nil
}

func (api) Alloc(dev devices.Device, nbytes int64, align int, scope string) (devices.Ptr, error) {
	if err := checkScope(scope); err != nil {
		return 0, err
	}
	if nbytes < 0 {
		return 0, fmt.Errorf("cpu alloc: negative size %d", nbytes)
	}
	if align < int(unsafe.Sizeof(uintptr(0))) {
		align = int(unsafe.Sizeof(uintptr(0)))
	}
	if align&(align-1) != 0 {
		return 0, fmt.Errorf("cpu alloc: alignment %d is not a power of two", align)
	}
	p := C.kiln_cpu_alloc(C.size_t(max(nbytes, 1)), C.size_t(align))
	if p == nil {
		return 0, fmt.Errorf("cpu alloc: out of memory for %d bytes", nbytes)
	}
	return devices.Ptr(uintptr(p)), nil
}

func (api) Free(dev devices.Device, p devices.Ptr) error {
	C.free(p.Unsafe())
	return nil
}

// largeCopy is the size from which host copies use Go's memmove rather
// than the C library's memcpy (faster below it).
const largeCopy = 4 << 20

func (api) Copy(dst devices.Ptr, dstDev devices.Device, src devices.Ptr, srcDev devices.Device, nbytes int64, s devices.Stream) error {
	if dstDev.Type != devices.CPU || srcDev.Type != devices.CPU {
		return fmt.Errorf("cpu copy %s -> %s: not a host-to-host copy", srcDev, dstDev)
	}
	switch {
	case nbytes >= largeCopy:
		// Go's memmove keeps large copies in regular stores; glibc's memcpy
		// switches to non-temporal stores past the cache size, which ran at
		// three quarters of the speed on the machines we measured (bench copy).
		copy(dst.HostBytes(nbytes), src.HostBytes(nbytes))
	case nbytes > 0:
		C.kiln_memcpy(C.uintptr_t(dst), C.uintptr_t(src), C.size_t(nbytes))
	}
	return nil
}

func (api) CopyFromHost(dst devices.Ptr, dev devices.Device, src []byte, s devices.Stream) error {
	copy(dst.HostBytes(int64(len(src))), src)
	return nil
}

func (api) CopyToHost(dst []byte, src devices.Ptr, dev devices.Device, s devices.Stream) error {
	copy(dst, src.HostBytes(int64(len(dst))))
	return nil
}

func (api) CreateStream(dev devices.Device) (devices.Stream, error) { return 0, nil }
func (api) FreeStream(dev devices.Device, s devices.Stream) error   { return nil }
func (api) StreamSync(dev devices.Device, s devices.Stream) error   { return nil }

func (api) Attr(dev devices.Device, kind devices.AttrKind) (any, error) {
	if dev.ID != 0 {
		if kind == devices.AttrExist {
			return int64(0), nil
		}
		return nil, fmt.Errorf("%w: %s", devices.ErrNoDevice, dev)
	}
	info := Info()
	switch kind {
	case devices.AttrExist:
		return int64(1), nil
	case devices.AttrName:
		return info.Model, nil
	case devices.AttrMultiProcessorCount:
		return int64(runtime.NumCPU()), nil
	case devices.AttrTotalGlobalMemory:
		if v, ok := meminfo("MemTotal"); ok {
			return v, nil
		}
	case devices.AttrAvailableGlobalMemory:
		if v, ok := meminfo("MemAvailable"); ok {
			return v, nil
		}
	case devices.AttrL2CacheSize:
		if info.L2Bytes > 0 {
			return info.L2Bytes, nil
		}
	case devices.AttrClockRate:
		if info.MHz > 0 {
			return int64(info.MHz * 1000), nil
		}
	}
	return nil, fmt.Errorf("%w: %s on cpu", devices.ErrUnsupportedAttr, kind)
}

// HostInfo describes the host CPU.
type HostInfo struct {
	Model    string   // model name from /proc/cpuinfo, or GOARCH
	Arch     string   // GOARCH
	Triple   string   // target triple of this host ("x86_64-linux-gnu")
	Features []string // CPU flags (avx2, avx512f, fma, neon…)
	MHz      float64  // nominal clock, 0 when unknown
	L2Bytes  int64    // L2 cache of cpu0, 0 when unknown
	Cores    int      // logical CPUs
}

// HasFeature reports whether the CPU lists a feature flag.
func (h HostInfo) HasFeature(f string) bool {
	for _, x := range h.Features {
		if x == f {
			return true
		}
	}
	return false
}

var hostInfo = sync.OnceValue(readHostInfo)

// Info returns the host CPU's description (read once).
func Info() HostInfo { return hostInfo() }

func readHostInfo() HostInfo {
	h := HostInfo{Model: runtime.GOARCH, Arch: runtime.GOARCH, Cores: runtime.NumCPU(), Triple: triple()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			switch k {
			case "model name", "Model":
				if h.Model == runtime.GOARCH {
					h.Model = v
				}
			case "flags", "Features":
				if h.Features == nil {
					h.Features = strings.Fields(v)
				}
			case "cpu MHz":
				if h.MHz == 0 {
					h.MHz, _ = strconv.ParseFloat(v, 64)
				}
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/cache/index2/size"); err == nil {
		h.L2Bytes = parseSize(strings.TrimSpace(string(b)))
	}
	return h
}

func parseSize(s string) int64 {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0
	}
	return n * mult
}

func meminfo(key string) (int64, bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || k != key {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			return 0, false
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, false
		}
		if len(f) > 1 && f[1] == "kB" {
			n <<= 10
		}
		return n, true
	}
	return 0, false
}

func triple() string {
	arch := map[string]string{"amd64": "x86_64", "arm64": "aarch64", "386": "i686", "riscv64": "riscv64"}[runtime.GOARCH]
	if arch == "" {
		arch = runtime.GOARCH
	}
	return arch + "-" + runtime.GOOS + "-gnu"
}
