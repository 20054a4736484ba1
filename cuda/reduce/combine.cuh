// The combine / broadcast-backward kernel (contract and launch shape: combine.h).
//
// Preconditions (checked by src/cuda/reduce_ops.cpp): H and both row strides are multiples of 8 elements and the
// data pointers are 16-byte aligned, so every row is a whole number of 16-byte vectors. The device index tensors
// are trusted: grouped_pos entries lie in [-1, P), tok_offsets is non-decreasing.
//
// Bytes moved per token: the K rows of `grouped` it names (H * 2 each), its output row (H * 2, twice with
// beta != 0) and K indices and scores, which every thread of the token group reads from L1.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/common/storage.cuh"
#include "cuda/reduce/combine.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace reduce {

constexpr int combine_block_threads = 256;

// A thread keeps pairs_in_flight x vectors_per_thread row loads in flight (8 in both variants) before it sums any:
// the rows of 8 pairs in one 16-byte column vector (top-k above 4, or variable top-k), or of 2 pairs in 4 vectors
// (top-k 1 to 4, where one vector per thread left a token's few loads behind two dependent memory round trips:
// K = 2 at H = 768 ran at ~1.6 TB/s in the layer, against ~3.5 at K = 8).
// min_blocks: __launch_bounds__'s blocks per SM; the few-pairs thread's 32 sums and 32 row registers spilled under
// the many-pairs kernel's bound of 3.
struct CombineManyPairs {
  static constexpr int pairs_in_flight = 8, vectors_per_thread = 1, min_blocks = 3;
};
struct CombineFewPairs {
  static constexpr int pairs_in_flight = 2, vectors_per_thread = 4, min_blocks = 2;
};

// Threads per token for rows of `vectors` 16-byte vectors, `vectors_per_thread` each: at most a block; below a warp
// a power of two (tokens share warps), from a warp on whole warps.
__host__ __device__ constexpr int64_t combine_token_threads(int64_t vectors, int64_t vectors_per_thread) {
  const int64_t needed = (vectors + vectors_per_thread - 1) / vectors_per_thread;
  if (needed >= combine_block_threads) return combine_block_threads;
  if (needed >= 32) return (needed + 31) / 32 * 32;
  int64_t threads = 1;
  while (threads < needed) threads *= 2;
  return threads;
}

static_assert(combine_token_threads(1, 1) == 1 && combine_token_threads(25, 1) == 32 &&
                  combine_token_threads(96, 1) == 96 && combine_token_threads(97, 1) == 128 &&
                  combine_token_threads(192, 1) == 192 && combine_token_threads(512, 1) == 256 &&
                  combine_token_threads(96, 4) == 32 && combine_token_threads(25, 4) == 8 &&
                  combine_token_threads(192, 4) == 64,
              "token groups: powers of two below a warp, whole warps up to a block");

template <class T, class Variant>
__global__ void __launch_bounds__(combine_block_threads, Variant::min_blocks)
    combine_kernel(CombineProblem problem, int token_threads) {
  static_assert(sizeof(Vec16<T>) == 16 && Vec16<T>::size == 8, "the kernel reads rows of 2-byte values, 8 at a time");
  constexpr int lanes = Vec16<T>::size;
  constexpr int pairs_in_flight = Variant::pairs_in_flight, vectors_per_thread = Variant::vectors_per_thread;

  // NOTE: a block of one token (a group of more than 128 threads) skips the divisions: with them H = 4096 ran ~1%
  // slower.
  const bool one_token = static_cast<int>(blockDim.x) == token_threads;
  const auto thread = static_cast<int>(threadIdx.x);
  const int64_t token = static_cast<int64_t>(blockIdx.x) * (one_token ? 1 : blockDim.x / token_threads) +
                        (one_token ? 0 : thread / token_threads);
  if (token >= problem.tokens) return;
  const int lane = one_token ? thread : thread % token_threads;

  int64_t begin, end;
  if (problem.top_k > 0) {
    begin = token * problem.top_k;
    end = begin + problem.top_k;
  } else {
    begin = problem.tok_offsets[token];
    end = problem.tok_offsets[token + 1];
  }
  // The weight of pair p is weights[p - begin].
  const float* weights = nullptr;
  if (problem.scores != nullptr)
    weights = problem.top_k > 0 ? problem.scores + token * problem.score_stride : problem.scores + begin;

  const T* grouped = static_cast<const T*>(problem.grouped);
  T* out = static_cast<T*>(problem.out) + token * problem.out_stride;
  const int64_t vectors = problem.hidden / lanes;

  // The thread's vectors of one step are token_threads apart, so each load instruction of a warp reads adjacent
  // 16-byte vectors.
  for (int64_t first_vector = lane; first_vector < vectors; first_vector += vectors_per_thread * token_threads) {
    float sum[vectors_per_thread][lanes];
#pragma unroll
    for (int i = 0; i < vectors_per_thread; ++i)
#pragma unroll
      for (int j = 0; j < lanes; ++j) sum[i][j] = 0.0f;

    for (int64_t first = begin; first < end; first += pairs_in_flight) {
      int32_t pos[pairs_in_flight];
      float w[pairs_in_flight];
#pragma unroll
      for (int u = 0; u < pairs_in_flight; ++u) {
        const int64_t p = first + u;
        pos[u] = p < end ? __ldg(problem.grouped_pos + p) : -1;
        w[u] = pos[u] < 0 ? 0.0f : weights != nullptr ? __ldg(weights + (p - begin)) : 1.0f;
      }
      // NOTE: a dropped pair's row is never read (it may hold anything, NaN included); it adds 0 * 0.
      Vec16<T> rows[pairs_in_flight][vectors_per_thread];
#pragma unroll
      for (int u = 0; u < pairs_in_flight; ++u)
#pragma unroll
        for (int i = 0; i < vectors_per_thread; ++i) {
          const int64_t v = first_vector + i * token_threads;
          rows[u][i] = pos[u] >= 0 && v < vectors
                           ? load16(grouped + static_cast<int64_t>(pos[u]) * problem.grouped_stride + v * lanes)
                           : Vec16<T>{};
        }
      // Ascending p, as SPEC section 3 step 4 orders the sum.
#pragma unroll
      for (int u = 0; u < pairs_in_flight; ++u)
#pragma unroll
        for (int i = 0; i < vectors_per_thread; ++i)
#pragma unroll
          for (int j = 0; j < lanes; ++j) sum[i][j] = fmaf(w[u], to_float(rows[u][i].v[j]), sum[i][j]);
    }

#pragma unroll
    for (int i = 0; i < vectors_per_thread; ++i) {
      const int64_t column = (first_vector + i * token_threads) * lanes;
      if (column >= problem.hidden) break;
      Vec16<T> result;
      if (problem.beta != 0.0f) {
        const Vec16<T> old = load16(out + column);
#pragma unroll
        for (int j = 0; j < lanes; ++j) result.v[j] = from_float<T>(fmaf(problem.beta, to_float(old.v[j]), sum[i][j]));
      } else {
#pragma unroll
        for (int j = 0; j < lanes; ++j) result.v[j] = from_float<T>(sum[i][j]);
      }
      store16(out + column, result);
    }
  }
}

template <class T, class Variant>
void launch_combine(const CombineProblem& problem, cudaStream_t stream) {
  if (problem.tokens == 0) return;
  const int64_t token_threads = combine_token_threads(problem.hidden / Vec16<T>::size, Variant::vectors_per_thread);
  const int64_t tokens_per_block = combine_block_threads / token_threads;
  const int64_t blocks = (problem.tokens + tokens_per_block - 1) / tokens_per_block;
  combine_kernel<T, Variant><<<static_cast<unsigned>(blocks), static_cast<unsigned>(tokens_per_block * token_threads),
                               0, stream>>>(problem, static_cast<int>(token_threads));
  check_launch("combine kernel");
}

}  // namespace reduce
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
