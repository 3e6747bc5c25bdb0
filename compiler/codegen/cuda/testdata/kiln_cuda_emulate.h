// Runs generated CUDA C on the host, for tests: each block of the grid in
// turn, the threads of a block as real threads meeting at __syncthreads.
// __shared__ variables are static (one copy, used by one block at a time),
// locals are per thread. Warp shuffles exchange through the block (every
// thread of the block must call them, as full-mask shuffles in uniform
// code do); atomics are std::atomic_ref. Test tool only.
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};

static thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static std::barrier<>* kiln_block_barrier;

#define __global__
#define __device__
#define __forceinline__ inline
#define __align__(n) __attribute__((aligned(n)))
#define __host__

// float16 conversions, rounding to nearest even (x86's F16C).
#include <immintrin.h>
__attribute__((target("f16c"))) inline unsigned short kiln_emulate_f2h(float f) {
  return (unsigned short)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
__attribute__((target("f16c"))) inline float kiln_emulate_h2f(unsigned short h) { return _cvtsh_ss(h); }
#define __shared__ static
// Dynamic shared memory: one static array of the bytes the kernel's
// buffers need (one block runs at a time), in place of CUDA's extern
// __shared__ array sized at launch.
#define KILN_DYN_SHARED(name, bytes) static __align__(16) unsigned char name[bytes]

inline void __syncthreads() { kiln_block_barrier->arrive_and_wait(); }

static constexpr int warpSize = 32;
static std::vector<unsigned long long> kiln_shfl;  // one slot per thread of the block

inline unsigned kiln_thread_rank() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

// kiln_shfl_from publishes v and returns the value of the thread of rank
// src (the caller's own when src is outside its warp or the block).
template <typename T>
T kiln_shfl_from(T v, long src) {
  static_assert(sizeof(T) <= sizeof(unsigned long long));
  const unsigned me = kiln_thread_rank();
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  kiln_shfl[me] = bits;
  __syncthreads();
  unsigned long long got = bits;
  if (src >= 0 && (unsigned long)src < kiln_shfl.size() && (unsigned)src / warpSize == me / warpSize) got = kiln_shfl[src];
  __syncthreads();
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}
template <typename T> T __shfl_sync(unsigned, T v, int lane, int = warpSize) {
  return kiln_shfl_from(v, long(kiln_thread_rank() / warpSize * warpSize + lane));
}
template <typename T> T __shfl_down_sync(unsigned, T v, unsigned delta, int = warpSize) {
  return kiln_shfl_from(v, long(kiln_thread_rank()) + delta);
}
template <typename T> T __shfl_up_sync(unsigned, T v, unsigned delta, int = warpSize) {
  return kiln_shfl_from(v, long(kiln_thread_rank()) - long(delta));
}
template <typename T> T __shfl_xor_sync(unsigned, T v, int mask, int = warpSize) {
  return kiln_shfl_from(v, long(kiln_thread_rank() ^ unsigned(mask)));
}

// Tensor cores: mma.sync.aligned.m16n8k16.row.col.f32 on the fragments
// of the 32 threads of a warp (every thread of the block must call it).
// Each thread publishes its fragments of A, B and C, then computes its
// four elements of D from its warp's: each element of C plus the
// products over k in order, added one at a time in float (as the reference
// interpreter's ptx_mma; the tensor cores may round the sum differently).
struct kiln_mma_lane {
  float a[8], b[4], c[4];
};
static std::vector<kiln_mma_lane> kiln_mma;  // one per thread of the block

template <typename T> void kiln_emulate_mma_m16n8k16(float* d, const T* a, const T* b) {
  const unsigned me = kiln_thread_rank();
  kiln_mma_lane& mine = kiln_mma[me];
  for (int i = 0; i < 8; i++) mine.a[i] = (float)a[i];
  for (int i = 0; i < 4; i++) mine.b[i] = (float)b[i], mine.c[i] = d[i];
  __syncthreads();
  const unsigned warp = me / warpSize * warpSize, lane = me % warpSize;
  const unsigned g = lane / 4, t = lane % 4;
  float out[4];
  for (unsigned i = 0; i < 4; i++) {
    const unsigned row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float acc = mine.c[i];
    for (unsigned k = 0; k < 16; k++) {
      // A[row][k] is element (k%2) + 2*(row/8) + 4*(k/8) of lane 4*(row%8) + (k%8)/2;
      // B[k][col] is element (k%2) + 2*(k/8) of lane 4*col + (k%8)/2.
      const float x = kiln_mma[warp + 4 * (row % 8) + (k % 8) / 2].a[k % 2 + 2 * (row / 8) + 4 * (k / 8)];
      const float y = kiln_mma[warp + 4 * col + (k % 8) / 2].b[k % 2 + 2 * (k / 8)];
      acc += x * y;
    }
    out[i] = acc;
  }
  __syncthreads();
  for (int i = 0; i < 4; i++) d[i] = out[i];
}

template <typename T> T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
template <typename T> T atomicMax(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}
[[noreturn]] inline void __trap() { std::abort(); }

template <typename F, typename... A>
void kiln_emulate(dim3 grid, dim3 block, F kernel, A... args) {
  gridDim = grid;
  blockDim = block;
  const std::ptrdiff_t n = block.x * block.y * block.z;
  for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
      for (unsigned bx = 0; bx < grid.x; bx++) {
        std::barrier<> bar(n);
        kiln_block_barrier = &bar;
        kiln_shfl.assign(n, 0);
        kiln_mma.assign(n, kiln_mma_lane{});
        std::vector<std::thread> threads;
        for (unsigned tz = 0; tz < block.z; tz++)
          for (unsigned ty = 0; ty < block.y; ty++)
            for (unsigned tx = 0; tx < block.x; tx++)
              threads.emplace_back([=] {
                blockIdx = dim3{bx, by, bz};
                threadIdx = dim3{tx, ty, tz};
                kernel(args...);
              });
        for (auto& t : threads) t.join();
      }
}
