// The router forward's last step: counts [E] int32 = the sum of the per-block counts [blocks][E] int32 that the
// forward kernel left in the workspace (router_forward.cuh says why there are no global atomics).
//
// Launch: ceil(E / 32) blocks of 1024 threads; a block takes 32 consecutive experts. Thread (j, i) sums blocks
// j, j + 32, ... of expert i (a warp reads 32 consecutive experts: 128 contiguous bytes), then the 32 partial sums
// of an expert are added in j order. Integer sums: exact, so any order gives the same counts.
// Bytes: blocks * E * 4 read, E * 4 written.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/routing/router.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace routing {

namespace {

__global__ void __launch_bounds__(1024)
    router_counts_kernel(const int32_t* partials, int64_t blocks, int64_t experts, int32_t* counts) {
  __shared__ int32_t sums[32][33];  // [j][i], padded against bank conflicts
  const int i = threadIdx.x % 32, j = threadIdx.x / 32;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * 32 + i;
  int32_t sum = 0;
  if (e < experts)
    for (int64_t b = j; b < blocks; b += 32) sum += partials[b * experts + e];
  sums[j][i] = sum;
  __syncthreads();
  if (j == 0 && e < experts) {
    int32_t total = 0;
    for (int k = 0; k < 32; ++k) total += sums[k][i];
    counts[e] = total;
  }
}

}  // namespace

void router_counts(const int32_t* partials, int64_t blocks, int64_t experts, int32_t* counts, cudaStream_t stream) {
  router_counts_kernel<<<static_cast<unsigned>((experts + 31) / 32), 1024, 0, stream>>>(partials, blocks, experts,
                                                                                         counts);
  check_launch("router counts kernel");
}

}  // namespace routing
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
