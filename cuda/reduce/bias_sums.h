// Host-callable launchers of the per-expert bias reductions (docs/math.md section 4, steps 3 and 5, and section 6), and
// the one function that sizes and lays out their workspace. Plain C++: src/cuda_backend/reduce_ops.cpp and
// src/cuda_backend/cuda_backend.cpp (plan sizes) include it from g++.
//
//   sums[e] = beta * sums[e] + sum over rows i of expert e, ascending, of w_i * src[row_i]      (db1, db2)
//   ds[pair_idx[i]] += src[row_i] . b2[e]                   for every row i of expert e        (ds, optional)
//
// db1: src = dh [P, 2I], row_i = i, w_i = 1. db2 + ds: src = dout [T, H], row_i = gather_idx[i],
// w_i = scores[pair_idx[i]]. Expert e owns rows offsets[e] .. offsets[e+1] (read on the device).
//
// Deterministic by construction: each expert's rows are cut into chunks of `chunk_rows` rows counted from the
// expert's first row (a function of the row index only, never of scheduling). Pass 1 gives each (chunk, column
// block) to one block, which sums its rows in row order into fp32 partial sums in the workspace and, for ds, reduces
// each row's dot product over its columns in a fixed tree. Pass 2 sums each expert's partials in chunk order and
// each row's per-column-block dot products in block order. Every value has one writer; no float atomics.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace reduce {

// The most rows in one chunk (blocks of 32 threads); pass 1 stages a chunk's row indices in shared memory.
constexpr int max_chunk_rows = 1024;

// Where pass 1 leaves its results, and the shape both passes use. Sizes and offsets come from bias_sums_layout
// alone, so the plan's workspace size and the kernels' layout cannot disagree.
struct BiasSumsLayout {
  int threads;            // per block: 16-byte column vectors per column block (a power of two, 32..256)
  int64_t chunk_rows;     // rows per chunk
  int64_t column_blocks;  // ceil(width / (8 * threads))
  int64_t max_chunks;     // ceil(max_rows / chunk_rows) + experts: chunks of all experts together, at most
  size_t chunk_starts;    // int32 [E+1]: first chunk of each expert (prefix sum of its chunk count)
  size_t chunk_experts;   // int32 [max_chunks]: the expert of each chunk
  size_t partials;        // fp32 [max_chunks, width]: each chunk's column sums
  size_t row_dots;        // fp32 [max_rows, column_blocks]: each row's dot product with b2, per column block
  size_t bytes;           // the whole workspace
};

inline BiasSumsLayout bias_sums_layout(int64_t experts, int64_t max_rows, int64_t width) {
  const auto align = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  BiasSumsLayout layout{};
  const int64_t vectors = (width + 7) / 8;
  layout.threads = 32;
  while (layout.threads < 256 && layout.threads < vectors) layout.threads *= 2;
  // NOTE: about 512 KiB of 2-byte input per (chunk, column block): enough rows that the partial sums cost a few
  // percent of the traffic, few enough that the last wave of blocks is short.
  layout.chunk_rows = max_chunk_rows * 32 / layout.threads;
  layout.column_blocks = (vectors + layout.threads - 1) / layout.threads;
  layout.max_chunks = (max_rows + layout.chunk_rows - 1) / layout.chunk_rows + experts;
  size_t offset = 0;
  layout.chunk_starts = offset;
  offset += align(sizeof(int32_t) * static_cast<size_t>(experts + 1));
  layout.chunk_experts = offset;
  offset += align(sizeof(int32_t) * static_cast<size_t>(layout.max_chunks));
  layout.partials = offset;
  offset += align(sizeof(float) * static_cast<size_t>(layout.max_chunks) * static_cast<size_t>(width));
  layout.row_dots = offset;
  offset += align(sizeof(float) * static_cast<size_t>(max_rows) * static_cast<size_t>(layout.column_blocks));
  layout.bytes = offset;
  return layout;
}

struct BiasSumsProblem {
  int64_t experts;  // E >= 1
  int64_t width;    // W (2I for db1, H for db2), a multiple of 8
  int64_t rows;     // P: rows of the grouped tensors of this call (<= the layout's max_rows)
  const int32_t* offsets;  // [E+1], device
  const void* src;         // [P, W] (db1) or [T, W] (db2) storage dtype, rows src_stride elements apart (multiple of 8)
  int64_t src_stride;
  const int32_t* gather_idx;  // [P] or nullptr: row i of the sum is src row gather_idx[i], else row i
  const float* scores;        // [P] flat or nullptr: row i is weighted by scores[pair_idx[i]], else by 1
  const int32_t* pair_idx;    // [P], needed with scores or dscores
  // No index value reads out of bounds: a gather_idx entry is clamped to [0, src_rows) (db2: src_rows = T >= 1),
  // and a row whose pair_idx entry lies outside [0, pairs) (the entries of scores and dscores) is skipped: weight
  // 0, no ds update.
  int64_t src_rows;
  int64_t pairs;
  void* sums;                 // [E, W] or nullptr (no sums), rows sums_stride elements apart (multiple of 8)
  int64_t sums_stride;
  bool sums_fp32;  // sums in fp32, else in the storage dtype
  float beta;      // 0: sums is never read
  const void* b2;  // [E, W] storage dtype or nullptr (no dot products), rows b2_stride elements apart
  int64_t b2_stride;
  float* dscores;   // [P] flat: += the dot products; used iff b2
  void* workspace;  // bias_sums_layout(E, max_rows, W).bytes, 256-byte aligned
};

// One per storage dtype (bias_sums_bf16.cu, bias_sums_fp16.cu). Only enqueue on `stream`.
void bias_sums_bf16(const BiasSumsProblem& problem, const BiasSumsLayout& layout, cudaStream_t stream);
void bias_sums_fp16(const BiasSumsProblem& problem, const BiasSumsLayout& layout, cudaStream_t stream);

// The dtype-independent steps (bias_sums.cu): chunk tables before pass 1, the dot products' pass 2 after it.
void launch_chunk_tables(const BiasSumsProblem& problem, const BiasSumsLayout& layout, cudaStream_t stream);
void launch_add_row_dots(const BiasSumsProblem& problem, const BiasSumsLayout& layout, cudaStream_t stream);

}  // namespace reduce
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
