// Runs generated CUDA C on the host, for tests: each block of the grid in
// turn, the threads of a block as real threads meeting at __syncthreads.
// __shared__ variables are static (one copy, used by one block at a time),
// locals are per thread. Test tool only.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
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
#define __shared__ static

inline void __syncthreads() { kiln_block_barrier->arrive_and_wait(); }
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
