package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/exectest"
)

// TestEmulationHeader checks the host emulation of CUDA's built-ins with a
// hand-written kernel: a block sums its values through shared memory and
// __syncthreads, then through warp shuffles, and adds its sum to a global
// total with atomicAdd from one thread per warp; the printed totals must
// be the exact sums.
func TestEmulationHeader(t *testing.T) {
	cxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skip("g++ is not installed: the CUDA source cannot be emulated on the host")
	}
	header, err := os.ReadFile(filepath.Join("testdata", "kiln_cuda_emulate.h"))
	check.NoError(t, err)
	src := `#include "kiln_cuda_emulate.h"
#include <cstdio>
__global__ void sums(const int* in, int* shared_total, int* shuffle_total) {
  __shared__ int s[128];
  unsigned t = threadIdx.x;
  int v = in[blockIdx.x * 128 + t];
  s[t] = v;
  __syncthreads();
  for (unsigned w = 64; w > 0; w /= 2) {
    if (t < w) s[t] += s[t + w];
    __syncthreads();
  }
  if (t == 0) atomicAdd(shared_total, s[0]);
  for (int d = 16; d > 0; d /= 2) v += __shfl_down_sync(0xffffffffu, v, d);
  if (t % warpSize == 0) atomicAdd(shuffle_total, v);
}
int main() {
  std::vector<int> in(4 * 128);
  long want = 0;
  for (size_t i = 0; i < in.size(); i++) { in[i] = int(i * 7 % 13) - 6; want += in[i]; }
  int a = 0, b = 0;
  kiln_emulate(dim3{4, 1, 1}, dim3{128, 1, 1}, sums, (const int*)in.data(), &a, &b);
  std::printf("%ld %d %d\n", want, a, b);
  return 0;
}
`
	dir := t.TempDir()
	check.NoError(t, os.WriteFile(filepath.Join(dir, "kiln_cuda_emulate.h"), header, 0o644))
	check.NoError(t, os.WriteFile(filepath.Join(dir, "main.cpp"), []byte(src), 0o644))
	bin := filepath.Join(dir, "main")
	out, err := exectest.CombinedOutput(t, 3*time.Minute, exec.Command(cxx, "-std=c++20", "-O1", "-pthread", "-I", dir, "-o", bin, filepath.Join(dir, "main.cpp")))
	check.NoError(t, err, string(out))
	out, err = exectest.CombinedOutput(t, 3*time.Minute, exec.Command(bin))
	check.NoError(t, err, string(out))
	f := strings.Fields(string(out))
	check.Equal(t, len(f), 3, string(out))
	check.Equal(t, f[1], f[0], "shared-memory sum")
	check.Equal(t, f[2], f[0], "shuffle sum")
}
