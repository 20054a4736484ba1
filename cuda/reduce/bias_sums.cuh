// Pass 1 of the bias reductions (chunk sums and per-row dot products) and pass 2 of the sums, templated on the
// storage dtype (contract, chunking and determinism: bias_sums.h).
//
// Preconditions (checked by src/cuda/reduce_ops.cpp): W and every row stride are multiples of 8 elements and the
// data pointers are 16-byte aligned; launch_chunk_tables has run on the stream first.
//
// Pass 1 grid: (max chunks of this call, column blocks) of layout.threads threads; thread k of column block b owns
// the 16-byte column vector b * threads + k of every row of its chunk. Bytes: every row of every expert once
// (W * 2 each, gathered rows included), plus 4 * W per chunk of fp32 partial sums, written once and read once by
// pass 2, plus 4 * column_blocks per row of dot products.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/common/storage.cuh"
#include "cuda/reduce/bias_sums.h"
#include "cuda/reduce/expert_rows.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace reduce {

constexpr int bias_sums_max_threads = 256;
// Rows whose loads are issued together, before any of them is summed.
constexpr int bias_sums_rows_in_flight = 8;

// Sums each of the 8 values v[0..7] over the 32 lanes of a warp in 9 shuffles (a halving butterfly): every lane
// keeps half of its values and adds its partner's copy of that half. Returns the full sum of value
// (lane >> 2) & 7 (lanes 4k .. 4k+3 all hold value k's). The order of the additions is fixed by the lanes, so the
// result is the same bits on every run.
__device__ __forceinline__ float warp_sum_eight(float (&v)[8]) {
  const int lane = threadIdx.x & 31;
  const bool upper16 = (lane & 16) != 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float give = upper16 ? v[i] : v[i + 4];
    const float keep = upper16 ? v[i + 4] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, give, 16);
  }
  const bool upper8 = (lane & 8) != 0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float give = upper8 ? v[i] : v[i + 2];
    const float keep = upper8 ? v[i + 2] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, give, 8);
  }
  const bool upper4 = (lane & 4) != 0;
  const float give = upper4 ? v[0] : v[1];
  const float keep = upper4 ? v[1] : v[0];
  float sum = keep + __shfl_xor_sync(0xffffffffu, give, 4);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  return sum;
}

// Which of the 8 values warp_sum_eight leaves in `lane`: bit 4 of the lane picks the upper half first, then bit 3,
// then bit 2.
__device__ __forceinline__ int warp_sum_eight_index(int lane) {
  return ((lane >> 4) & 1) * 4 + ((lane >> 3) & 1) * 2 + ((lane >> 2) & 1);
}

template <class T>
__global__ void __launch_bounds__(bias_sums_max_threads)
    chunk_sums_kernel(BiasSumsProblem problem, BiasSumsLayout layout) {
  static_assert(sizeof(Vec16<T>) == 16 && Vec16<T>::size == 8, "the kernel reads rows of 2-byte values, 8 at a time");
  static_assert(bias_sums_rows_in_flight == 8, "warp_sum_eight reduces exactly the dot products of 8 rows");
  constexpr int lanes = Vec16<T>::size;
  constexpr int max_warps = bias_sums_max_threads / 32;

  // Dot products of one batch of rows, per warp; two buffers, so one barrier per batch suffices.
  __shared__ float warp_dots[2][max_warps][bias_sums_rows_in_flight];

  char* workspace = static_cast<char*>(problem.workspace);
  const int32_t* chunk_starts = reinterpret_cast<const int32_t*>(workspace + layout.chunk_starts);
  const int32_t* chunk_experts = reinterpret_cast<const int32_t*>(workspace + layout.chunk_experts);
  const int64_t chunk = blockIdx.x;
  if (chunk >= chunk_starts[problem.experts]) return;
  const int64_t expert = chunk_experts[chunk];
  const RowRange rows = expert_rows(problem.offsets, expert, problem.rows);
  const int64_t first = rows.begin + (chunk - chunk_starts[expert]) * layout.chunk_rows;
  const int64_t last = min(first + layout.chunk_rows, rows.end);

  const int64_t vector = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  const bool active = vector < problem.width / lanes;
  const int64_t column = vector * lanes;
  const bool want_sums = problem.sums != nullptr;
  const bool want_dots = problem.b2 != nullptr;
  const T* src = static_cast<const T*>(problem.src);

  float bias[lanes];
  {
    Vec16<T> b{};
    if (want_dots && active) b = load16(static_cast<const T*>(problem.b2) + expert * problem.b2_stride + column);
#pragma unroll
    for (int j = 0; j < lanes; ++j) bias[j] = to_float(b.v[j]);
  }
  float sum[lanes];
#pragma unroll
  for (int j = 0; j < lanes; ++j) sum[j] = 0.0f;

  int buffer = 0;
  for (int64_t batch = first; batch < last; batch += bias_sums_rows_in_flight) {
    int64_t src_row[bias_sums_rows_in_flight];
    float weight[bias_sums_rows_in_flight];
#pragma unroll
    for (int u = 0; u < bias_sums_rows_in_flight; ++u) {
      const int64_t i = batch + u;
      const bool valid = i < last;
      src_row[u] = !valid ? -1 : problem.gather_idx != nullptr ? __ldg(problem.gather_idx + i) : i;
      weight[u] = valid && problem.scores != nullptr ? __ldg(problem.scores + __ldg(problem.pair_idx + i)) : 1.0f;
    }
    Vec16<T> x[bias_sums_rows_in_flight];
#pragma unroll
    for (int u = 0; u < bias_sums_rows_in_flight; ++u)
      x[u] = src_row[u] >= 0 && active ? load16(src + src_row[u] * problem.src_stride + column) : Vec16<T>{};

    if (want_sums) {
      // Row order, as SPEC section 4 orders the sum.
#pragma unroll
      for (int u = 0; u < bias_sums_rows_in_flight; ++u)
#pragma unroll
        for (int j = 0; j < lanes; ++j) sum[j] = fmaf(weight[u], to_float(x[u].v[j]), sum[j]);
    }
    if (want_dots) {
      float dots[bias_sums_rows_in_flight];
#pragma unroll
      for (int u = 0; u < bias_sums_rows_in_flight; ++u) {
        dots[u] = 0.0f;
#pragma unroll
        for (int j = 0; j < lanes; ++j) dots[u] = fmaf(to_float(x[u].v[j]), bias[j], dots[u]);
      }
      const float warp_dot = warp_sum_eight(dots);
      const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
      if ((lane & 3) == 0) warp_dots[buffer][warp][warp_sum_eight_index(lane)] = warp_dot;
      __syncthreads();
      const int64_t row = batch + threadIdx.x;
      if (threadIdx.x < bias_sums_rows_in_flight && row < last) {
        float block_dot = 0.0f;
        for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) block_dot += warp_dots[buffer][w][threadIdx.x];
        float* row_dots = reinterpret_cast<float*>(workspace + layout.row_dots);
        row_dots[row * layout.column_blocks + blockIdx.y] = block_dot;
      }
      buffer ^= 1;
    }
  }

  if (want_sums && active) {
    float4* partial = reinterpret_cast<float4*>(reinterpret_cast<float*>(workspace + layout.partials) +
                                                chunk * problem.width + column);
    partial[0] = make_float4(sum[0], sum[1], sum[2], sum[3]);
    partial[1] = make_float4(sum[4], sum[5], sum[6], sum[7]);
  }
}

// Chunks whose partial sums are loaded together in pass 2.
constexpr int partials_in_flight = 4;

// Pass 2 of the sums: grid (E, column blocks); sums[e] = beta * sums[e] + its chunks' partial sums in chunk order.
// An expert without rows gets beta * sums[e] (0 with beta = 0), never garbage.
template <class T>
__global__ void __launch_bounds__(bias_sums_max_threads)
    expert_sums_kernel(BiasSumsProblem problem, BiasSumsLayout layout) {
  constexpr int lanes = Vec16<T>::size;
  const int64_t expert = blockIdx.x;
  const int64_t vector = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (vector >= problem.width / lanes) return;
  const int64_t column = vector * lanes;
  const char* workspace = static_cast<const char*>(problem.workspace);
  const int32_t* chunk_starts = reinterpret_cast<const int32_t*>(workspace + layout.chunk_starts);
  const float* partials = reinterpret_cast<const float*>(workspace + layout.partials);

  float sum[lanes];
#pragma unroll
  for (int j = 0; j < lanes; ++j) sum[j] = 0.0f;
  const int64_t end = chunk_starts[expert + 1];
  for (int64_t batch = chunk_starts[expert]; batch < end; batch += partials_in_flight) {
    float4 part[partials_in_flight][2];
#pragma unroll
    for (int u = 0; u < partials_in_flight; ++u) {
      const float4* p = reinterpret_cast<const float4*>(partials + (batch + u) * problem.width + column);
      const bool valid = batch + u < end;
      part[u][0] = valid ? p[0] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      part[u][1] = valid ? p[1] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < partials_in_flight; ++u) {
      sum[0] += part[u][0].x;
      sum[1] += part[u][0].y;
      sum[2] += part[u][0].z;
      sum[3] += part[u][0].w;
      sum[4] += part[u][1].x;
      sum[5] += part[u][1].y;
      sum[6] += part[u][1].z;
      sum[7] += part[u][1].w;
    }
  }

  if (problem.sums_fp32) {
    float4* out = reinterpret_cast<float4*>(static_cast<float*>(problem.sums) + expert * problem.sums_stride + column);
    if (problem.beta != 0.0f) {
      const float4 a = out[0], b = out[1];
      const float old[lanes] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int j = 0; j < lanes; ++j) sum[j] = fmaf(problem.beta, old[j], sum[j]);
    }
    out[0] = make_float4(sum[0], sum[1], sum[2], sum[3]);
    out[1] = make_float4(sum[4], sum[5], sum[6], sum[7]);
  } else {
    T* out = static_cast<T*>(problem.sums) + expert * problem.sums_stride + column;
    if (problem.beta != 0.0f) {
      const Vec16<T> old = load16(out);
#pragma unroll
      for (int j = 0; j < lanes; ++j) sum[j] = fmaf(problem.beta, to_float(old.v[j]), sum[j]);
    }
    Vec16<T> result;
#pragma unroll
    for (int j = 0; j < lanes; ++j) result.v[j] = from_float<T>(sum[j]);
    store16(out, result);
  }
}

template <class T>
void launch_bias_sums(const BiasSumsProblem& problem, const BiasSumsLayout& layout, cudaStream_t stream) {
  launch_chunk_tables(problem, layout, stream);
  // Chunks of this call: at most ceil(rows / chunk_rows) + E, the bound the layout reserves for max_rows.
  const int64_t chunks = (problem.rows + layout.chunk_rows - 1) / layout.chunk_rows + problem.experts;
  if (problem.rows > 0) {
    const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(layout.column_blocks));
    chunk_sums_kernel<T><<<grid, layout.threads, 0, stream>>>(problem, layout);
    check_launch("bias sums: chunk sums kernel");
  }
  if (problem.sums != nullptr) {
    const dim3 grid(static_cast<unsigned>(problem.experts), static_cast<unsigned>(layout.column_blocks));
    expert_sums_kernel<T><<<grid, layout.threads, 0, stream>>>(problem, layout);
    check_launch("bias sums: expert sums kernel");
  }
  if (problem.b2 != nullptr) launch_add_row_dots(problem, layout, stream);
}

}  // namespace reduce
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
