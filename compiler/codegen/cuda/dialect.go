package cuda

import (
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/compiler/codegen/c"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/ndarray"
)

// dialect is CUDA C as a dialect of the C renderer. The shared and local
// buffers in aligned (by their data variable) are declared aligned to 16
// bytes, for vector copies; the shared.dyn buffers lie at their offset in dyn in the
// block's dynamic shared memory.
func dialect(aligned map[*ir.Var]bool, dyn map[*ir.Var]int64) c.Dialect {
	return c.Dialect{
		Name:      "cuda",
		Restrict:  "__restrict__",
		Signature: signature,
		Loop:      loop,
		Fail:      func(string, bool) string { return "{ __trap(); }" },
		Allocate: func(r *c.Renderer, b *ir.Buffer) (string, bool, error) {
			if b.StorageScope() == "shared.dyn" {
				return dynShared(r, b, dyn)
			}
			return allocate(r, b, aligned[b.Data])
		},
		Externs:    map[string]bool{transform.SyncThreads: true},
		Return:     "return;",
		VectorDecl: vectorDecl,
		Call:       call,
		BFloat16:   true,
		Float8:     true,
	}
}

// vectorDecl declares vector type t as a struct of its lanes aligned to
// its size (so a load or store of one, 16 bytes at most, is one vector
// instruction: ld.global.v4.f32 for a float32x4), with the helpers the C
// renderer prints for vector loads and stores. Kernels use vectors only to
// copy (see checker.dtype).
func vectorDecl(t ir.DType, elem string) string {
	name := t.String()
	size := int(t.Lanes) * int(t.Bits) / 8
	return fmt.Sprintf(`struct __align__(%d) %s { %s v[%d]; };
static __device__ __forceinline__ %s kiln_vload_%s(const %s* p) { return *(const %s*)p; }
static __device__ __forceinline__ void kiln_vstore_%s(%s* p, %s v) { *(%s*)p = v; }
`, size, name, elem, t.Lanes, name, name, elem, name, name, elem, name, name)
}

func signature(r *c.Renderer, name string, f *ir.PrimFunc) (string, error) {
	var ps []string
	for _, p := range f.Params {
		if b, ok := f.BufferMap[p]; ok {
			ps = append(ps, fmt.Sprintf("%s* __restrict__ %s", r.Type(b.DType), r.VarName(b.Data)))
			continue
		}
		if p.Type.Lanes > 1 || p.Type.Code == ndarray.Handle {
			return "", fmt.Errorf("parameter %q of type %s cannot be passed to a kernel", p.Name, p.Type)
		}
		ps = append(ps, fmt.Sprintf("%s %s", r.Type(p.Type), r.VarName(p)))
	}
	return fmt.Sprintf(`extern "C" __global__ void %s(%s) {`, name, strings.Join(ps, ", ")), nil
}

func loop(r *c.Renderer, f *ir.For) ([]string, bool, error) {
	switch f.Kind {
	case ir.ForThreadBinding:
		if _, ok := axes[f.ThreadTag]; !ok {
			// verify refuses it first; the tag is printed as code.
			return nil, false, fmt.Errorf("loop %q is bound to %q, which is not a CUDA thread axis", f.Var.Name, f.ThreadTag)
		}
		return []string{"{", fmt.Sprintf("  %s %s = (%s)%s;", r.Type(f.Var.Type), r.VarName(f.Var), r.Type(f.Var.Type), f.ThreadTag)}, true, nil
	case ir.ForUnrolled:
		return []string{"#pragma unroll", r.ForHeader(f)}, true, nil
	case ir.ForVectorized:
		return []string{r.ForHeader(f)}, true, nil
	}
	return nil, false, nil
}

func allocate(r *c.Renderer, b *ir.Buffer, aligned bool) (string, bool, error) {
	n, ok := constElems(b)
	scope := b.StorageScope()
	switch scope {
	case "shared", "local":
	case "global":
		// Verified to lie inside the threadIdx loops (or in a kernel of
		// one thread per block): private to the thread that runs it.
		scope = "local"
	default:
		return "", false, fmt.Errorf("buffer %q in %s memory is allocated inside the kernel; a kernel allocates only shared and local buffers", b.Name, scope)
	}
	if !ok {
		return "", false, fmt.Errorf("%s buffer %q has no constant size", scope, b.Name)
	}
	decl := fmt.Sprintf("%s %s[%d];", r.Type(b.DType), r.VarName(b.Data), max(n, 1))
	if aligned {
		// Aligned for the widest vector copy (16 bytes).
		decl = "__align__(16) " + decl
	}
	if scope == "shared" {
		decl = "__shared__ " + decl
	}
	return decl, true, nil
}

// dynShared declares shared.dyn buffer b as a pointer into the block's
// dynamic shared memory at its offset (see checker.walk). KILN_DYN_SHARED
// names that memory: an extern __shared__ array under CUDA (every such
// array starts at the same address), one of the given size elsewhere.
func dynShared(r *c.Renderer, b *ir.Buffer, dyn map[*ir.Var]int64) (string, bool, error) {
	off, ok := dyn[b.Data]
	if !ok {
		return "", false, fmt.Errorf("shared.dyn buffer %q has no offset in dynamic shared memory", b.Name)
	}
	n, _ := constElems(b)
	name := r.VarName(b.Data)
	t := r.Type(b.DType)
	return fmt.Sprintf("KILN_DYN_SHARED(%s_dyn, %d); %s* %s = (%s*)(%s_dyn + %d);", name, off+n*int64(b.DType.Size()), t, name, t, name, off), true, nil
}

// float8Prelude defines the 8-bit float types of kernels that use them
// (sm_89 and newer): kiln_fp8_e4m3 and kiln_fp8_e5m2 (the layouts of
// CUDA's __nv_fp8_e4m3 and __nv_fp8_e5m2, whose cuda_fp8.h NVRTC does not
// have here), storage types converted to float exactly and from float
// rounding to nearest even and saturating to the largest finite value (NaN
// stays NaN). On sm_90 the conversions are PTX's cvt.rn.satfinite (which
// NVRTC 11.8's ptxas takes for sm_90 only); elsewhere, and in the host
// emulation harness, float bit arithmetic computing the same.
const float8Prelude = `// 8-bit floats: storage types converted through float. kiln_f2fp8 rounds
// |f| to a multiple of the format's quantum at its exponent (nearest even,
// by adding and removing 2^23), saturating; kiln_fp82f decodes exactly.
static __device__ __forceinline__ float kiln_pow2(int n) {
  kiln_f32_bits x;
  x.u = (unsigned int)(n + 127) << 23;
  return x.f;
}
static __device__ __forceinline__ unsigned char kiln_f2fp8(float f, int man, int bias, float maxv) {
  kiln_f32_bits x;
  x.f = f;
  const unsigned char sign = (unsigned char)((x.u >> 24) & 0x80u);
  x.u &= 0x7fffffffu;
  if (x.u > 0x7f800000u) return sign | 0x7f;
  if (x.u == 0) return sign;
  if (x.f > maxv) x.f = maxv;
  const int min_exp = 1 - bias;
  int e = (int)(x.u >> 23) - 127;
  if (e < min_exp) e = min_exp;
  volatile float scaled = x.f * kiln_pow2(man - e);
  float v = ((scaled + 8388608.0f) - 8388608.0f) * kiln_pow2(e - man);
  if (v > maxv) v = maxv;
  if (v == 0.0f) return sign;
  if (v < kiln_pow2(min_exp)) return sign | (unsigned char)(v * kiln_pow2(man - min_exp));
  x.f = v;
  e = (int)(x.u >> 23) - 127;
  return sign | (unsigned char)((e + bias) << man) | (unsigned char)((int)(v * kiln_pow2(man - e)) - (1 << man));
}
static __device__ __forceinline__ float kiln_fp82f(unsigned char b, int man, int bias, bool inf) {
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int exp = (b & 0x7f) >> man, mant = b & ((1 << man) - 1), ones = (1 << (7 - man)) - 1;
  kiln_f32_bits special;
  special.u = 0x7fc00000u;
  if (inf && exp == ones && mant == 0) special.u = 0x7f800000u;
  if (exp == ones && (inf || mant == (1 << man) - 1)) return sign * special.f;
  if (exp == 0) return sign * (float)mant * kiln_pow2(1 - bias - man);
  return sign * (float)(mant + (1 << man)) * kiln_pow2(exp - bias - man);
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KILN_FP8_CVT(N, P, MAN, BIAS, MAX, INF) \
static __device__ __forceinline__ unsigned char kiln_f2##N(float f) { \
  unsigned short r; \
  asm("cvt.rn.satfinite." P "x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(f)); \
  return (unsigned char)r; \
} \
static __device__ __forceinline__ float kiln_##N##2f(unsigned char b) { \
  unsigned int h; \
  asm("cvt.rn.f16x2." P "x2 %0, %1;" : "=r"(h) : "h"((unsigned short)b)); \
  return kiln_h2f((unsigned short)h); \
}
#else
#define KILN_FP8_CVT(N, P, MAN, BIAS, MAX, INF) \
static __device__ __forceinline__ unsigned char kiln_f2##N(float f) { return kiln_f2fp8(f, MAN, BIAS, MAX); } \
static __device__ __forceinline__ float kiln_##N##2f(unsigned char b) { return kiln_fp82f(b, MAN, BIAS, INF); }
#endif
KILN_FP8_CVT(e4m3, "e4m3", 3, 7, 448.0f, false)
KILN_FP8_CVT(e5m2, "e5m2", 2, 15, 57344.0f, true)
#define KILN_FP8(T, F2X, X2F) \
struct T { \
  unsigned char bits; \
  __device__ __forceinline__ T() {} \
  __device__ __forceinline__ T(float f) : bits(F2X(f)) {} \
  __device__ __forceinline__ T(double f) : bits(F2X((float)f)) {} \
  __device__ __forceinline__ T(int i) : bits(F2X((float)i)) {} \
  __device__ __forceinline__ operator float() const { return X2F(bits); } \
};
KILN_FP8(kiln_fp8_e4m3, kiln_f2e4m3, kiln_e4m32f)
KILN_FP8(kiln_fp8_e5m2, kiln_f2e5m2, kiln_e5m22f)
`

// prelude defines what generated kernels use: NVRTC has no standard
// headers, so the fixed-width integer types are defined here under NVRTC
// (other compilers of the source take stdint.h).
const prelude = `#ifdef __CUDACC_RTC__
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

// float16 without cuda_fp16.h (NVRTC has no headers): a 16-bit storage type
// whose arithmetic is float's, rounded to nearest even after every
// operation (as the interpreter computes it). The C renderer's _Float16
// names it. On the GPU the conversions are PTX's cvt; the host emulation
// harness supplies kiln_emulate_f2h and kiln_emulate_h2f.
#if defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
static __device__ __forceinline__ unsigned short kiln_f2h(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
static __device__ __forceinline__ float kiln_h2f(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
#else
static __device__ __forceinline__ unsigned short kiln_f2h(float f) { return kiln_emulate_f2h(f); }
static __device__ __forceinline__ float kiln_h2f(unsigned short h) { return kiln_emulate_h2f(h); }
#endif
// bfloat16 likewise: the upper half of a float, rounded to nearest even
// (bit arithmetic, the same under NVRTC and on the host).
union kiln_f32_bits { float f; unsigned int u; };
static __device__ __forceinline__ unsigned short kiln_f2bf(float f) {
  kiln_f32_bits x;
  x.f = f;
  if (f != f) return (unsigned short)((x.u >> 16) | 0x40u);
  x.u += 0x7fffu + ((x.u >> 16) & 1u);
  return (unsigned short)(x.u >> 16);
}
static __device__ __forceinline__ float kiln_bf2f(unsigned short h) {
  kiln_f32_bits x;
  x.u = (unsigned int)h << 16;
  return x.f;
}
// KILN_16BIT defines 16-bit float type T stored as bits, converted from
// float by F2X and to float by X2F, with float's arithmetic rounded to T
// after every operation, comparisons, negation and warp shuffles (of its
// 16 bits).
#define KILN_16BIT(T, F2X, X2F) \
struct T { \
  unsigned short bits; \
  __device__ __forceinline__ T() {} \
  __device__ __forceinline__ T(float f) : bits(F2X(f)) {} \
  __device__ __forceinline__ T(double f) : bits(F2X((float)f)) {} \
  __device__ __forceinline__ T(int i) : bits(F2X((float)i)) {} \
  __device__ __forceinline__ T(long long i) : bits(F2X((float)i)) {} \
  __device__ __forceinline__ operator float() const { return X2F(bits); } \
}; \
static __device__ __forceinline__ T operator+(T a, T b) { return T((float)a + (float)b); } \
static __device__ __forceinline__ T operator-(T a, T b) { return T((float)a - (float)b); } \
static __device__ __forceinline__ T operator*(T a, T b) { return T((float)a * (float)b); } \
static __device__ __forceinline__ T operator/(T a, T b) { return T((float)a / (float)b); } \
static __device__ __forceinline__ bool operator<(T a, T b) { return (float)a < (float)b; } \
static __device__ __forceinline__ bool operator>(T a, T b) { return (float)a > (float)b; } \
static __device__ __forceinline__ bool operator<=(T a, T b) { return (float)a <= (float)b; } \
static __device__ __forceinline__ bool operator>=(T a, T b) { return (float)a >= (float)b; } \
static __device__ __forceinline__ bool operator==(T a, T b) { return (float)a == (float)b; } \
static __device__ __forceinline__ bool operator!=(T a, T b) { return (float)a != (float)b; } \
static __device__ __forceinline__ T operator-(T a) { T r; r.bits = (unsigned short)(a.bits ^ 0x8000u); return r; } \
static __device__ __forceinline__ T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width) { \
  T r; \
  r.bits = (unsigned short)__shfl_down_sync(mask, (unsigned)v.bits, delta, width); \
  return r; \
}
KILN_16BIT(kiln_half, kiln_f2h, kiln_h2f)
KILN_16BIT(kiln_bf16, kiln_f2bf, kiln_bf2f)
#define _Float16 kiln_half
// Tensor cores (ptx_mma): d[0..3] += A·B for one warp, each thread passing
// its fragments of A (8 elements) and B (4) as PTX lays them out for
// mma.m16n8k16 (.row.col, float32 accumulators). The host emulation
// harness supplies kiln_emulate_mma_m16n8k16, the same product computed
// from the fragments of the 32 threads of the warp.
#if defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
template <typename T> static __device__ __forceinline__ unsigned kiln_pack2(const T* p) {
  return (unsigned)p[0].bits | ((unsigned)p[1].bits << 16);
}
#define KILN_MMA(NAME, AB, T) \
static __device__ __forceinline__ void NAME(float* d, const T* a, const T* b) { \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." AB "." AB ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) \
               : "r"(kiln_pack2(a)), "r"(kiln_pack2(a + 2)), "r"(kiln_pack2(a + 4)), "r"(kiln_pack2(a + 6)), \
                 "r"(kiln_pack2(b)), "r"(kiln_pack2(b + 2))); \
}
KILN_MMA(kiln_mma_m16n8k16_f32_fp16, "f16", kiln_half)
KILN_MMA(kiln_mma_m16n8k16_f32_bf16, "bf16", kiln_bf16)
#else
static __device__ __forceinline__ void kiln_mma_m16n8k16_f32_fp16(float* d, const kiln_half* a, const kiln_half* b) { kiln_emulate_mma_m16n8k16(d, a, b); }
static __device__ __forceinline__ void kiln_mma_m16n8k16_f32_bf16(float* d, const kiln_bf16* a, const kiln_bf16* b) { kiln_emulate_mma_m16n8k16(d, a, b); }
#endif
// Dynamic shared memory (shared.dyn buffers): every extern __shared__
// array starts at the block's dynamic shared memory; the launch gives its
// size. Elsewhere (the host emulation harness) an array of the given bytes.
#ifndef KILN_DYN_SHARED
#define KILN_DYN_SHARED(name, bytes) extern __shared__ __align__(16) unsigned char name[]
#endif

// The integer helpers printed expressions call (the C dialect's are GNU
// statement expressions, which NVRTC does not read): the result has the
// first operand's type, as in C.
template <typename A, typename B> static __device__ __forceinline__ A kiln_min(A a, B b) { return a < (A)b ? a : (A)b; }
template <typename A, typename B> static __device__ __forceinline__ A kiln_max(A a, B b) { return a > (A)b ? a : (A)b; }
template <typename A, typename B> static __device__ __forceinline__ A kiln_floordiv(A a, B b) {
  A q = a / (A)b;
  return (q * (A)b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
template <typename A, typename B> static __device__ __forceinline__ A kiln_floormod(A a, B b) {
  A r = a % (A)b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + (A)b : r;
}
template <typename A> static __device__ __forceinline__ A kiln_abs(A a) { return a < 0 ? -a : a; }
#define KILN_MIN(a, b) kiln_min((a), (b))
#define KILN_MAX(a, b) kiln_max((a), (b))
#define KILN_FLOORDIV(a, b) kiln_floordiv((a), (b))
#define KILN_FLOORMOD(a, b) kiln_floormod((a), (b))
#define KILN_ABS(a) kiln_abs((a))
`
