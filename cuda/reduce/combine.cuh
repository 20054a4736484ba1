// The combine / broadcast-backward kernel (contract and launch shape: combine.h).
//
// Preconditions (checked by src/cuda_backend/reduce_ops.cpp): H and both row strides are multiples of 8 elements and the
// data pointers are 16-byte aligned, so every row is a whole number of 16-byte vectors. The device index tensors
// are not trusted: a grouped_pos entry outside [0, rows) drops its pair, and tok_offsets are clamped to the pairs.
//
// Bytes moved per token: the K rows of `grouped` it names (H * 2 each), its output row (H * 2, twice with
// beta != 0) and K indices and scores, which every thread of the token group reads from L1.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>

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

// Where a thread is in its walk over tokens. One step is one batch of row loads: pairs first .. first +
// pairs_in_flight - 1 of `token`, in the thread's vectors first_vector, first_vector + token_threads, ... A token
// without pairs still takes one step, which writes its output (beta * out, or 0).
// NOTE: token and pair indices are 32-bit (capi keeps T and P in the int32 range of the index tensors; a token past
// the end stays below 2^32): with 64-bit ones the many-pairs thread no longer fit its 80 registers with all loads
// of a step in flight. Element offsets stay 64-bit.
struct CombineStep {
  uint32_t token;  // >= problem.tokens: the walk is over
  int64_t first_vector;
  int32_t first, begin, end;  // the step's first pair; the token's pairs are [begin, end)
};

// Moves `step` to `token`'s first pair in the thread's first vectors.
__device__ __forceinline__ void combine_enter_token(CombineStep& step, const CombineProblem& problem, uint32_t token,
                                                    int lane) {
  step.token = token;
  step.first_vector = lane;
  if (problem.top_k > 0) {
    step.begin = static_cast<int32_t>(token * static_cast<uint32_t>(problem.top_k));
    step.end = static_cast<int32_t>(step.begin + problem.top_k);
  } else {
    const auto pairs = static_cast<int32_t>(problem.pairs);
    step.begin = token < problem.tokens ? min(max(__ldg(problem.tok_offsets + token), 0), pairs) : 0;
    step.end = token < problem.tokens ? min(max(__ldg(problem.tok_offsets + token + 1), step.begin), pairs) : 0;
  }
  step.first = step.begin;
}

// The step's grouped rows, -1 past the token's pairs and past the end of the walk.
template <int pairs_in_flight>
__device__ __forceinline__ void combine_load_positions(const CombineStep& step, const CombineProblem& problem,
                                                       int32_t (&pos)[pairs_in_flight]) {
#pragma unroll
  for (int u = 0; u < pairs_in_flight; ++u) {
    const int32_t p =
        step.token < problem.tokens && u < step.end - step.first ? __ldg(problem.grouped_pos + step.first + u) : -1;
    pos[u] = p < problem.rows ? p : -1;
  }
}

template <class T, class Variant>
__global__ void __launch_bounds__(combine_block_threads, Variant::min_blocks)
    combine_kernel(CombineProblem problem, int token_threads) {
  static_assert(sizeof(Vec16<T>) == 16 && Vec16<T>::size == 8, "the kernel reads rows of 2-byte values, 8 at a time");
  constexpr int lanes = Vec16<T>::size;
  constexpr int pairs_in_flight = Variant::pairs_in_flight, vectors_per_thread = Variant::vectors_per_thread;

  const auto thread = static_cast<int>(threadIdx.x);
  const int groups_per_block = static_cast<int>(blockDim.x) / token_threads;
  const int lane = thread % token_threads;
  const uint32_t first_token = blockIdx.x * groups_per_block + thread / token_threads;
  if (first_token >= problem.tokens) return;
  // All groups step by the grid's group count, so at any moment neighbouring groups hold neighbouring tokens.
  const uint32_t token_stride = gridDim.x * groups_per_block;
  const int64_t vectors = problem.hidden / lanes;
  // The thread's vectors of one step are token_threads apart, so each load instruction of a warp reads adjacent
  // 16-byte vectors.
  const int64_t vector_stride = static_cast<int64_t>(vectors_per_thread) * token_threads;
  const T* grouped = static_cast<const T*>(problem.grouped);

  CombineStep step;
  combine_enter_token(step, problem, first_token, lane);
  int32_t pos[pairs_in_flight];
  combine_load_positions(step, problem, pos);
  float sum[vectors_per_thread][lanes];
#pragma unroll
  for (int i = 0; i < vectors_per_thread; ++i)
#pragma unroll
    for (int j = 0; j < lanes; ++j) sum[i][j] = 0.0f;

  // NOTE: the order below is what keeps the many-pairs thread within 80 registers with its 8 row loads and the
  // next step's 8 position loads all issued before it waits on any (checked in the SASS, cuobjdump -sass): the
  // weights go out first, with this step's rows rather than a step ahead (they are not on the critical path, and
  // 8 more registers made ptxas hold back row loads until the first rows had arrived), and the step is advanced
  // before the rows are loaded, so only its token and first vector are kept for the store.
  do {
    float w[pairs_in_flight];
    {
      // The weight of pair first + u is weights[u]: scores[token, first + u - begin], or scores[first + u].
      const float* weights = nullptr;
      if (problem.scores != nullptr)
        weights = problem.scores + step.first +
                  (problem.top_k > 0 ? static_cast<int64_t>(step.token) * problem.score_stride - step.begin : 0);
#pragma unroll
      for (int u = 0; u < pairs_in_flight; ++u)
        w[u] = pos[u] < 0 ? 0.0f : weights != nullptr ? __ldg(weights + u) : 1.0f;
    }
    const uint32_t token = step.token;
    const int64_t first_vector = step.first_vector;
    const bool sums_done = step.end - step.first <= pairs_in_flight;

    // The next step: the token's next pairs, else its next vectors, else the thread's next token. Its positions
    // go out together with this step's rows, so a step costs one memory round trip (its rows), not two (its
    // positions, then its rows). Variable top-k's next token first reads its tok_offsets, which the positions wait
    // for.
    if (!sums_done) {
      step.first += pairs_in_flight;
    } else if (step.first_vector + vector_stride < vectors) {
      step.first_vector += vector_stride;
      step.first = step.begin;
    } else {
      combine_enter_token(step, problem, step.token + token_stride, lane);
    }
    int32_t next_pos[pairs_in_flight];
    combine_load_positions(step, problem, next_pos);

    // NOTE: raw words, not Vec16<T>: a Vec16 of 16-bit values chosen against zero took a byte permute per value
    // and more registers (the bf16 many-pairs kernel spilled). A dropped pair's row is never read (it may hold
    // anything, NaN included); it adds 0 * 0.
    uint4 rows[pairs_in_flight][vectors_per_thread];
#pragma unroll
    for (int u = 0; u < pairs_in_flight; ++u)
#pragma unroll
      for (int i = 0; i < vectors_per_thread; ++i) {
        const int64_t v = first_vector + i * token_threads;
        rows[u][i] = pos[u] >= 0 && v < vectors
                         ? *reinterpret_cast<const uint4*>(grouped + static_cast<int64_t>(pos[u]) *
                                                                         problem.grouped_stride + v * lanes)
                         : make_uint4(0, 0, 0, 0);
      }
    // Ascending p, as docs/math.md section 3, step 4 orders the sum; values 2k and 2k + 1 of a row vector are word k.
#pragma unroll
    for (int u = 0; u < pairs_in_flight; ++u)
#pragma unroll
      for (int i = 0; i < vectors_per_thread; ++i) {
        const uint32_t words[lanes / 2] = {rows[u][i].x, rows[u][i].y, rows[u][i].z, rows[u][i].w};
#pragma unroll
        for (int k = 0; k < lanes / 2; ++k) {
          const float2 values = unpack_pair<T>(words[k]);
          sum[i][2 * k] = fmaf(w[u], values.x, sum[i][2 * k]);
          sum[i][2 * k + 1] = fmaf(w[u], values.y, sum[i][2 * k + 1]);
        }
      }

    if (sums_done) {
#pragma unroll
      for (int i = 0; i < vectors_per_thread; ++i) {
        const int64_t v = first_vector + i * token_threads;
        if (v < vectors) {
          T* const at = static_cast<T*>(problem.out) + static_cast<int64_t>(token) * problem.out_stride + v * lanes;
          Vec16<T> result;
          if (problem.beta != 0.0f) {
            const Vec16<T> old = load16(at);
#pragma unroll
            for (int j = 0; j < lanes; ++j)
              result.v[j] = from_float<T>(fmaf(problem.beta, to_float(old.v[j]), sum[i][j]));
          } else {
#pragma unroll
            for (int j = 0; j < lanes; ++j) result.v[j] = from_float<T>(sum[i][j]);
          }
          store16(at, result);
        }
#pragma unroll
        for (int j = 0; j < lanes; ++j) sum[i][j] = 0.0f;
      }
    }

#pragma unroll
    for (int u = 0; u < pairs_in_flight; ++u) pos[u] = next_pos[u];
  } while (step.token < problem.tokens);
}

// Blocks of `block_threads` threads one SM holds at once (the occupancy calculator). The answer depends only on the
// kernel and the block size (every device the backend takes is sm_90), so each is asked once per process.
template <class T, class Variant>
int resident_combine_blocks(int block_threads) {
  static std::mutex mutex;
  static std::map<int, int> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = known.find(block_threads);
  if (found != known.end()) return found->second;
  int resident = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, combine_kernel<T, Variant>, block_threads, 0),
             "combine: occupancy");
  known.emplace(block_threads, resident);
  return resident;
}

// At most as many blocks as the device holds at once: the token groups walk the rest.
template <class T, class Variant>
void launch_combine(const CombineProblem& problem, cudaStream_t stream) {
  if (problem.tokens == 0) return;
  const int64_t token_threads = combine_token_threads(problem.hidden / Vec16<T>::size, Variant::vectors_per_thread);
  const int64_t groups_per_block = combine_block_threads / token_threads;
  const int block_threads = static_cast<int>(groups_per_block * token_threads);
  const int64_t blocks = std::min((problem.tokens + groups_per_block - 1) / groups_per_block,
                                  static_cast<int64_t>(problem.sm_count) * resident_combine_blocks<T, Variant>(block_threads));
  combine_kernel<T, Variant><<<static_cast<unsigned>(blocks), static_cast<unsigned>(block_threads), 0, stream>>>(
      problem, static_cast<int>(token_threads));
  check_launch("combine kernel");
}

}  // namespace reduce
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
