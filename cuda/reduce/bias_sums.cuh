// Pass 1 of the bias reductions (chunk sums and per-row dot products) and pass 2 of the sums, templated on the
// storage dtype (contract, chunking and determinism: bias_sums.h).
//
// Preconditions (checked by src/cuda_backend/reduce_ops.cpp): W and every row stride are multiples of 8 elements and the
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

// kSums: column sums into the partials; kDots: per-row dot products with b2. Templated because each path alone
// fits in 64 registers (4 blocks per SM, more loads in flight) while both together need over 100 (2 blocks).
template <class T,
          bool kSums,
          bool kDots>
__global__ void __launch_bounds__(bias_sums_max_threads, kSums && kDots ? 2 : 4)
    chunk_sums_kernel(BiasSumsProblem problem, BiasSumsLayout layout) {
  static_assert(sizeof(Vec16<T>) == 16 && Vec16<T>::size == 8, "the kernel reads rows of 2-byte values, 8 at a time");
  constexpr int lanes = Vec16<T>::size;

  // Dot products of one batch of rows, per thread (read in the reduction below).
  __shared__ float thread_dots[2][bias_sums_rows_in_flight][bias_sums_max_threads];

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
  const T* src = static_cast<const T*>(problem.src);

  // The chunk's source rows and weights, staged once: a batch of rows then waits on one memory latency (its rows),
  // not on two (an index, then the row it names).
  __shared__ int32_t chunk_src_rows[max_chunk_rows];
  __shared__ float chunk_weights[max_chunk_rows];
  const int count = static_cast<int>(last - first);
  for (int r = threadIdx.x; r < count; r += blockDim.x) {
    const int64_t i = first + r;
    const auto last_src = static_cast<int32_t>(problem.src_rows - 1);
    chunk_src_rows[r] = problem.gather_idx != nullptr ? min(max(__ldg(problem.gather_idx + i), 0), last_src)
                                                      : static_cast<int32_t>(i);
    const int32_t pair = problem.pair_idx != nullptr ? __ldg(problem.pair_idx + i) : -1;
    chunk_weights[r] = problem.scores == nullptr ? 1.0f
                       : pair >= 0 && pair < problem.pairs ? __ldg(problem.scores + pair)
                                                          : 0.0f;
  }

  Vec16<T> bias{};
  if (kDots && active) bias = load16(static_cast<const T*>(problem.b2) + expert * problem.b2_stride + column);
  float sum[lanes];
#pragma unroll
  for (int j = 0; j < lanes; ++j) sum[j] = 0.0f;
  __syncthreads();

  int buffer = 0;
#pragma unroll 1
  for (int batch = 0; batch < count; batch += bias_sums_rows_in_flight) {
    Vec16<T> x[bias_sums_rows_in_flight];
#pragma unroll
    for (int u = 0; u < bias_sums_rows_in_flight; ++u)
      x[u] = batch + u < count && active
                 ? load16(src + static_cast<int64_t>(chunk_src_rows[batch + u]) * problem.src_stride + column)
                 : Vec16<T>{};

    // Each row is consumed whole before the next, so its fp32 values need not outlive it. Row order, as
    // docs/math.md section 4 orders the sums.
    float dots[bias_sums_rows_in_flight];
#pragma unroll
    for (int u = 0; u < bias_sums_rows_in_flight; ++u) {
      const float weight = kSums && batch + u < count ? chunk_weights[batch + u] : 0.0f;
      dots[u] = 0.0f;
#pragma unroll
      for (int j = 0; j < lanes; ++j) {
        const float value = to_float(x[u].v[j]);
        sum[j] = fmaf(weight, value, sum[j]);
        dots[u] = fmaf(value, to_float(bias.v[j]), dots[u]);
      }
    }
    if (kDots) {
      // Every thread's 8 dot products go to shared memory; then warp w sums row w over the block's threads in
      // thread order and a fixed butterfly. Two buffers, so one barrier per batch suffices.
#pragma unroll
      for (int u = 0; u < bias_sums_rows_in_flight; ++u) thread_dots[buffer][u][threadIdx.x] = dots[u];
      __syncthreads();
      const int lane = threadIdx.x & 31, warps = static_cast<int>(blockDim.x >> 5);
      for (int u = static_cast<int>(threadIdx.x >> 5); u < bias_sums_rows_in_flight; u += warps) {
        float dot = 0.0f;
        for (int t = lane; t < static_cast<int>(blockDim.x); t += 32) dot += thread_dots[buffer][u][t];
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        if (lane == 0 && batch + u < count) {
          float* row_dots = reinterpret_cast<float*>(workspace + layout.row_dots);
          row_dots[(first + batch + u) * layout.column_blocks + blockIdx.y] = dot;
        }
      }
      buffer ^= 1;
    }
  }

  if (kSums && active) {
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
    if (problem.sums != nullptr && problem.b2 != nullptr)
      chunk_sums_kernel<T, true, true><<<grid, layout.threads, 0, stream>>>(problem, layout);
    else if (problem.sums != nullptr)
      chunk_sums_kernel<T, true, false><<<grid, layout.threads, 0, stream>>>(problem, layout);
    else
      chunk_sums_kernel<T, false, true><<<grid, layout.threads, 0, stream>>>(problem, layout);
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
