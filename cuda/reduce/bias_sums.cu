// The dtype-independent steps of the bias reductions (contract: bias_sums.h): the chunk tables that map pass 1's
// blocks to (expert, chunk), and pass 2 of the dot products, ds[pair_idx[i]] += the row's per-column-block dots.
#include <cub/block/block_scan.cuh>

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/reduce/bias_sums.h"
#include "cuda/reduce/expert_rows.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace reduce {

namespace {

constexpr int chunk_table_threads = 256;

// One block: thread k takes a contiguous range of experts, counts their chunks, and a block scan turns the
// counts into each expert's first chunk. Counts past max_chunks (possible only for offsets that break their
// contract) are cut off, so nothing outside the workspace is written.
__global__ void __launch_bounds__(chunk_table_threads)
    chunk_tables_kernel(BiasSumsProblem problem, BiasSumsLayout layout) {
  using Scan = cub::BlockScan<int64_t, chunk_table_threads>;
  __shared__ typename Scan::TempStorage scan_storage;
  char* workspace = static_cast<char*>(problem.workspace);
  int32_t* chunk_starts = reinterpret_cast<int32_t*>(workspace + layout.chunk_starts);
  int32_t* chunk_experts = reinterpret_cast<int32_t*>(workspace + layout.chunk_experts);

  const int64_t per_thread = (problem.experts + chunk_table_threads - 1) / chunk_table_threads;
  const int64_t e_begin = min(problem.experts, per_thread * threadIdx.x);
  const int64_t e_end = min(problem.experts, e_begin + per_thread);
  int64_t count = 0;
  for (int64_t e = e_begin; e < e_end; ++e)
    count += chunk_count(expert_rows(problem.offsets, e, problem.rows), layout.chunk_rows);
  int64_t start = 0, total = 0;
  Scan(scan_storage).ExclusiveSum(count, start, total);

  for (int64_t e = e_begin; e < e_end; ++e) {
    chunk_starts[e] = static_cast<int32_t>(min(start, layout.max_chunks));
    const int64_t end = start + chunk_count(expert_rows(problem.offsets, e, problem.rows), layout.chunk_rows);
    for (int64_t c = start; c < min(end, layout.max_chunks); ++c) chunk_experts[c] = static_cast<int32_t>(e);
    start = end;
  }
  if (threadIdx.x == 0) chunk_starts[problem.experts] = static_cast<int32_t>(min(total, layout.max_chunks));
}

constexpr int row_dot_threads = 256;

// One thread per grouped row: the sum of its per-column-block dot products in block order, added to its pair's
// score gradient. Each pair has one grouped row, so each ds entry has one writer.
__global__ void __launch_bounds__(row_dot_threads) add_row_dots_kernel(BiasSumsProblem problem, BiasSumsLayout layout) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * row_dot_threads + threadIdx.x;
  const int64_t valid = expert_rows(problem.offsets, problem.experts - 1, problem.rows).end;
  if (row >= valid) return;
  const float* row_dots = reinterpret_cast<const float*>(static_cast<const char*>(problem.workspace) + layout.row_dots) +
                          row * layout.column_blocks;
  float dot = 0.0f;
  for (int64_t block = 0; block < layout.column_blocks; ++block) dot += row_dots[block];
  const int32_t pair = problem.pair_idx[row];
  if (pair >= 0 && pair < problem.pairs) problem.dscores[pair] += dot;
}

}  // namespace

void launch_chunk_tables(const BiasSumsProblem& problem, const BiasSumsLayout& layout, cudaStream_t stream) {
  chunk_tables_kernel<<<1, chunk_table_threads, 0, stream>>>(problem, layout);
  check_launch("bias sums: chunk tables kernel");
}

void launch_add_row_dots(const BiasSumsProblem& problem, const BiasSumsLayout& layout, cudaStream_t stream) {
  if (problem.rows == 0) return;
  const int64_t blocks = (problem.rows + row_dot_threads - 1) / row_dot_threads;
  add_row_dots_kernel<<<static_cast<unsigned>(blocks), row_dot_threads, 0, stream>>>(problem, layout);
  check_launch("bias sums: row dot kernel");
}

}  // namespace reduce
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
