// Per-group selection counts of the sparse FFN (docs/math.md section 7), from the groups group selection wrote:
//   counts[g] = #{(t, k) : groups[t, k] == g}                                   (overwritten)
// Two passes, no global atomics (every token's selections would otherwise meet on the same few cache lines):
//   1. kCountSlices blocks, each over a contiguous slice of tokens: a shared-memory histogram (shared atomics
//      on NG bins), written out as partials[slice, :];
//   2. one thread per group sums its column of partials in slice order.
// Preconditions: every entry of groups lies in [0, NG) (the energy kernel guarantees it); NG * 4 bytes of shared
// memory fit one block (NG <= kMaxSelectGroups). Bytes moved: T * kg * 4 read, 2 * kCountSlices * NG * 4 through
// the workspace, NG * 4 written.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/sparse_ffn/group_select.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace sparse_ffn {

namespace {

constexpr int kCountThreads = 256;

__global__ void __launch_bounds__(kCountThreads, 1) slice_histogram_kernel(GroupCountsArgs a) {
  extern __shared__ int histogram[];
  const int num_groups = static_cast<int>(a.num_groups);
  for (int g = static_cast<int>(threadIdx.x); g < num_groups; g += kCountThreads) histogram[g] = 0;
  __syncthreads();
  const int64_t first = a.tokens * blockIdx.x / kCountSlices;
  const int64_t last = a.tokens * (blockIdx.x + 1) / kCountSlices;
  const int64_t entries = (last - first) * a.top_groups;
  for (int64_t i = threadIdx.x; i < entries; i += kCountThreads) {
    const int64_t t = first + i / a.top_groups;
    const int64_t k = i % a.top_groups;
    atomicAdd(histogram + a.groups[t * a.groups_stride + k], 1);
  }
  __syncthreads();
  int32_t* row = a.partials + static_cast<int64_t>(blockIdx.x) * num_groups;
  for (int g = static_cast<int>(threadIdx.x); g < num_groups; g += kCountThreads) row[g] = histogram[g];
}

__global__ void __launch_bounds__(kCountThreads, 1) sum_slices_kernel(GroupCountsArgs a) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kCountThreads + threadIdx.x;
  if (g >= a.num_groups) return;
  int32_t sum = 0;
#pragma unroll 8
  for (int64_t slice = 0; slice < kCountSlices; ++slice) sum += a.partials[slice * a.num_groups + g];
  a.counts[g] = sum;
}

}  // namespace

void launch_group_counts(const GroupCountsArgs& args, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(args.num_groups) * sizeof(int);
  if (smem > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(slice_histogram_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)),
               "group counts: shared memory opt-in");
  slice_histogram_kernel<<<static_cast<unsigned>(kCountSlices), kCountThreads, smem, stream>>>(args);
  check_launch("group counts: slice histograms");
  const int64_t blocks = (args.num_groups + kCountThreads - 1) / kCountThreads;
  sum_slices_kernel<<<static_cast<unsigned>(blocks), kCountThreads, 0, stream>>>(args);
  check_launch("group counts: slice sums");
}

}  // namespace sparse_ffn
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
