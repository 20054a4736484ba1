// Router forward (docs/math.md section 1), the kernel and its launcher, templated on the logits dtype T. For each token
// row of logits [T, E]: the K experts with the largest fp32 selection keys (value-descending, ties to the lower
// expert, -inf never chosen, in every kind), their scores by the router kind, and per-expert counts.
//
// Preconditions (capi checked them): 1 <= K <= min(E, 32); E <= max_router_experts; the last dimension of every
// tensor is contiguous; the logits rows of a row group are read whole, so a row needs >= K finite logits
// (otherwise the lowest excluded experts fill the row, as in the reference).
//
// Launch: row groups of THREADS threads (router.h), forward_rows_per_block groups per block, router_forward_blocks
// blocks looping over the rows. Shared memory: the block's per-expert counts [E] int32 when counts are requested.
// Then router_counts (router_counts.cu) sums the blocks' counts [blocks][E] (workspace) into counts [E].
// Bytes: T*E*sizeof(T) read once (the K selected logits are read again, from L1), T*K*(4 + index size) written,
// blocks*E*4 written and read for the counts.
//
// Selection, bf16/fp16 logits in a warp (every kind but SIGMOID): packed_selection.cuh, one word per key that
// holds the 16-bit key and the expert, one warp max per round. Otherwise (fp32 logits, SIGMOID's computed fp32
// key, rows wider than a warp): each thread keeps its keys as order codes (row_group.cuh) and its own best: the
// highest code, the lowest element among equal codes (its slots ascend by element and only a strictly higher code
// replaces the best). A round takes the group's highest code, then among the threads holding it the lowest
// element, both by a warp max (redux.sync; across warps through shared memory); the holder marks the key taken
// and rescans. Either way K rounds give the winners in order; lane k of each warp keeps winner k.
//
// Determinism: selection is integer logic; score sums are fixed butterflies; counts are integer (shared-memory
// atomics within a block, then a sum over the blocks), exact in any order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/common/storage.cuh"
#include "cuda/routing/packed_selection.cuh"
#include "cuda/routing/router.h"
#include "cuda/routing/row_group.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace routing {

// The SIGMOID kind's selection key float(sigmoid(x) + bias), formed in double exactly as the reference forms it,
// so both backends round the same value to fp32 (up to one ulp of exp in double, far below fp32's resolution).
__device__ __forceinline__ float sigmoid_key(float x, float bias) {
  if (x == -INFINITY) return -INFINITY;  // a masked expert stays masked whatever its bias
  const double q = 1.0 / (1.0 + exp(-static_cast<double>(x)));
  return static_cast<float>(q + static_cast<double>(bias));
}

// TOPK_SOFTMAX's softmax over all E: the row's max and sum of exp(x - max) (slots past E hold -inf).
template <int THREADS,
          int ITEMS>
__device__ __forceinline__ void softmax_denominator(const float (&x)[ITEMS], float* scratch, float& row_max,
                                                    float& row_sum) {
  float m = -INFINITY;
#pragma unroll
  for (int s = 0; s < ITEMS; ++s) m = fmaxf(m, x[s]);
  row_max = group_max<THREADS>(m, scratch);
  float z = 0.0f;
#pragma unroll
  for (int s = 0; s < ITEMS; ++s) z += expf(x[s] - row_max);
  row_sum = group_sum<THREADS>(z, scratch);
}

// The 32-bit-key selection (fp32 logits, the SIGMOID kind, rows wider than a warp): K rounds over the threads'
// order codes; returns, in lane k of every warp, the k-th winner. Rows wider than a warp pass each round's warp
// bests through round_best[phase], and `phase` alternates over every round of every row: a buffer is rewritten
// only after the barrier of the round that follows its reads, also when a row's round count is odd.
template <int THREADS,
          int ITEMS,
          int CHUNK>
__device__ __forceinline__ int select_by_codes(unsigned (&code)[ITEMS], int top_k, int lane, bool chunked,
                                               unsigned long long (*round_best)[THREADS / 32], int& phase) {
  constexpr int WARPS = THREADS / 32;
  const int warp_lane = threadIdx.x % 32;
  unsigned best = taken_code;
  int best_slot = 0;
#pragma unroll
  for (int s = 0; s < ITEMS; ++s)
    if (code[s] > best) {
      best = code[s];
      best_slot = s;
    }

  int selected = 0;
  for (int k = 0; k < top_k; ++k) {
    const unsigned rank = ~static_cast<unsigned>(element_of<THREADS, CHUNK>(best_slot, lane, chunked));
    unsigned top = __reduce_max_sync(full_warp, best);
    unsigned top_rank = __reduce_max_sync(full_warp, best == top ? rank : 0u);
    if constexpr (THREADS > 32) {
      unsigned long long* warp_best = round_best[phase];
      phase ^= 1;
      if (warp_lane == 0) warp_best[threadIdx.x / 32] = (static_cast<unsigned long long>(top) << 32) | top_rank;
      __syncthreads();
      unsigned long long winner = 0;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) winner = winner > warp_best[w] ? winner : warp_best[w];
      top = static_cast<unsigned>(winner >> 32);
      top_rank = static_cast<unsigned>(winner);
    }
    if (best == top && rank == top_rank) {
#pragma unroll
      for (int s = 0; s < ITEMS; ++s)
        if (s == best_slot) code[s] = taken_code;
      best = taken_code;
      best_slot = 0;
#pragma unroll
      for (int s = 0; s < ITEMS; ++s)
        if (code[s] > best) {
          best = code[s];
          best_slot = s;
        }
    }
    if (warp_lane == k) selected = static_cast<int>(~top_rank);
  }
  return selected;
}

template <class T,
          int THREADS,
          int ITEMS,
          bool PACKED>
__global__ void __launch_bounds__(THREADS * (THREADS == 32 ? 32 : 1), THREADS == 32 && ITEMS <= 8 ? 2 : 1)
    router_forward_kernel(RouterProblem problem, RouterForwardArgs args, bool chunked) {
  constexpr int ROWS = THREADS == 32 ? 32 : 1;  // forward_rows_per_block (router.h)
  constexpr int CHUNK = chunk_elements<T, ITEMS>();
  constexpr int WARPS = THREADS / 32;
  static_assert(THREADS % 32 == 0, "a row group is a whole number of warps");
  static_assert(THREADS == 32 || ROWS == 1, "a row group larger than a warp owns its block (it synchronises it)");
  static_assert(!PACKED || (THREADS == 32 && sizeof(T) == 2), "packed selection: a warp per row of 16-bit logits");
  static_assert(THREADS * ITEMS < 0xFFFF, "an expert's complement fits the low half of a packed word");

  extern __shared__ int block_counts[];                // [E] when counts are requested
  __shared__ float scratch[WARPS];                     // group_sum / group_max partials
  __shared__ unsigned long long round_best[2][WARPS];  // each warp's (code, ~element) per round, double-buffered
  int phase = 0;                                       // the round_best buffer of the next round

  const int experts = static_cast<int>(problem.experts);
  const int top_k = static_cast<int>(problem.top_k);
  const int lane = threadIdx.x % THREADS;  // position in the row group
  const int warp_lane = threadIdx.x % 32;
  const bool counting = args.counts != nullptr;
  int score_lanes = 1;  // the lanes holding winners, rounded up to a power of two, for the score sums
  while (score_lanes < top_k) score_lanes *= 2;
  if (counting) {
    for (int e = threadIdx.x; e < experts; e += blockDim.x) block_counts[e] = 0;
    __syncthreads();
  }

  // The packed path loads each row one row ahead, so the next row's load is in flight while this one selects.
  RowBits<PACKED ? ITEMS : 1> next;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * ROWS + threadIdx.x / THREADS;
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * ROWS;
  if constexpr (PACKED) {
    if (first_row < problem.tokens)
      load_row_bits<THREADS, ITEMS, CHUNK>(
          reinterpret_cast<const unsigned short*>(static_cast<const T*>(args.logits) + first_row * args.logits_stride),
          experts, lane, chunked, next);
  }

  // NOTE: no thread leaves early: the block synchronises before writing its counts. The rows of a block-sized
  // group are the same for all its threads, so its __syncthreads are reached by all.
  for (int64_t row = first_row; row < problem.tokens; row += row_step) {
    const T* logits = static_cast<const T*>(args.logits) + row * args.logits_stride;  // [E]
    float row_max = 0.0f, row_sum = 1.0f;  // TOPK_SOFTMAX scores need the softmax denominator over all E
    int selected;                          // lane k < K of each warp: the k-th winner
    if constexpr (PACKED) {
      const RowBits<ITEMS> bits = next;
      if (row + row_step < problem.tokens)
        load_row_bits<THREADS, ITEMS, CHUNK>(reinterpret_cast<const unsigned short*>(logits + row_step * args.logits_stride),
                                             experts, lane, chunked, next);
      if (problem.kind == MOEKIT_ROUTER_TOPK_SOFTMAX) {
        float x[ITEMS];
#pragma unroll
        for (int s = 0; s < ITEMS; ++s)
          x[s] = element_of<THREADS, CHUNK>(s, lane, chunked) < experts ? value_of_bits<T>(bits.slot(s)) : -INFINITY;
        softmax_denominator<THREADS, ITEMS>(x, scratch, row_max, row_sum);
      }
      unsigned words[ITEMS];
#pragma unroll
      for (int s = 0; s < ITEMS; ++s)
        words[s] = packed_word<T>(bits.slot(s), 0xFFFFu - static_cast<unsigned>(element_of<THREADS, CHUNK>(s, lane, chunked)));
      sort_descending<ITEMS>(words);
      selected = expert_of_word(select_packed<ITEMS>(words, top_k, warp_lane));
    } else {
      float x[ITEMS];
      load_row<T, THREADS, ITEMS>(logits, experts, lane, chunked, x);
      if (problem.kind == MOEKIT_ROUTER_TOPK_SOFTMAX) softmax_denominator<THREADS, ITEMS>(x, scratch, row_max, row_sum);
      unsigned code[ITEMS];
#pragma unroll
      for (int s = 0; s < ITEMS; ++s) {
        const int e = element_of<THREADS, CHUNK>(s, lane, chunked);
        if (e >= experts) {
          code[s] = taken_code;
        } else if (problem.kind == MOEKIT_ROUTER_SIGMOID) {
          code[s] = order_code(sigmoid_key(x[s], args.bias ? args.bias[e] : 0.0f));
        } else {
          code[s] = order_code(x[s]);
        }
      }
      selected = select_by_codes<THREADS, ITEMS, CHUNK>(code, top_k, lane, chunked, round_best, phase);
    }

    // Every warp knows the winners; the first one writes them.
    if (THREADS > 32 && threadIdx.x >= 32) continue;
    const bool active = warp_lane < top_k;
    const float v = active ? to_float(logits[selected]) : 0.0f;
    float score;
    if (problem.kind == MOEKIT_ROUTER_SOFTMAX_TOPK) {
      // NOTE: the first winner holds the largest selected value (a NaN only when every winner is -inf or NaN,
      // and then every score is NaN either way).
      const float m = __shfl_sync(full_warp, v, 0);
      const float ex = active ? expf(v - m) : 0.0f;
      score = ex / lanes_sum(ex, score_lanes);
    } else {
      float r = v;
      if (problem.kind == MOEKIT_ROUTER_TOPK_SOFTMAX) {
        r = expf(v - row_max) / row_sum;
      } else if (problem.kind == MOEKIT_ROUTER_SIGMOID) {
        r = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(v))));
      }
      if (!active) r = 0.0f;
      if (problem.renormalize) r = r / lanes_sum(r, score_lanes);
      score = problem.kind == MOEKIT_ROUTER_SIGMOID ? problem.scale * r : r;
    }
    if (!active) continue;
    args.scores[row * args.scores_stride + warp_lane] = score;
    if (args.indices_int64) {
      static_cast<int64_t*>(args.indices)[row * args.indices_stride + warp_lane] = selected;
    } else {
      static_cast<int32_t*>(args.indices)[row * args.indices_stride + warp_lane] = selected;
    }
    if (counting) atomicAdd(&block_counts[selected], 1);
  }

  if (counting) {
    __syncthreads();
    int32_t* partial = static_cast<int32_t*>(args.workspace) + static_cast<int64_t>(blockIdx.x) * experts;  // [E]
    for (int e = threadIdx.x; e < experts; e += blockDim.x) partial[e] = block_counts[e];
  }
}

template <class T,
          int THREADS,
          int ITEMS>
void launch_router_forward_shape(const RouterProblem& problem, const RouterForwardArgs& args, int64_t blocks,
                                 cudaStream_t stream) {
  constexpr int ROWS = THREADS == 32 ? 32 : 1;
  const bool chunked = chunked_rows<T, chunk_elements<T, ITEMS>()>(args.logits, args.logits_stride, problem.experts);
  const size_t shared_bytes = args.counts ? sizeof(int) * static_cast<size_t>(problem.experts) : 0;
  // Packed selection where a warp holds the row and the key is the 16-bit logit itself.
  // NOTE: 32 words a thread (E > 512) spill at the 64 registers of a full block: those rows keep the 32-bit path.
  constexpr bool packable = THREADS == 32 && sizeof(T) == 2 && ITEMS <= 16;
  if (packable && problem.kind != MOEKIT_ROUTER_SIGMOID) {
    router_forward_kernel<T, THREADS, ITEMS, packable>
        <<<static_cast<unsigned>(blocks), THREADS * ROWS, shared_bytes, stream>>>(problem, args, chunked);
  } else {
    router_forward_kernel<T, THREADS, ITEMS, false>
        <<<static_cast<unsigned>(blocks), THREADS * ROWS, shared_bytes, stream>>>(problem, args, chunked);
  }
  check_launch("router forward kernel");
}

template <class T>
void launch_router_forward(const RouterProblem& problem, const RouterForwardArgs& args, cudaStream_t stream) {
  int64_t blocks = router_forward_blocks(problem.tokens, problem.experts, problem.sm_count);
  // NOTE: a workspace sized on another device (fewer SMs) bounds the grid; the kernels loop over rows anyway.
  const int64_t fitting = static_cast<int64_t>(args.workspace_bytes / (sizeof(int32_t) * problem.experts));
  if (args.counts && blocks > fitting) blocks = fitting;
  if (problem.tokens > 0) {
    const RowGroupShape shape = row_group_shape(problem.experts);
    if (shape.threads == 32) {
      switch (shape.items) {
        case 1: launch_router_forward_shape<T, 32, 1>(problem, args, blocks, stream); break;
        case 2: launch_router_forward_shape<T, 32, 2>(problem, args, blocks, stream); break;
        case 4: launch_router_forward_shape<T, 32, 4>(problem, args, blocks, stream); break;
        case 8: launch_router_forward_shape<T, 32, 8>(problem, args, blocks, stream); break;
        case 16: launch_router_forward_shape<T, 32, 16>(problem, args, blocks, stream); break;
        case 32: launch_router_forward_shape<T, 32, 32>(problem, args, blocks, stream); break;
      }
    } else if (shape.threads == 256 && shape.items == 8) {
      launch_router_forward_shape<T, 256, 8>(problem, args, blocks, stream);
    } else if (shape.threads == 256 && shape.items == 16) {
      launch_router_forward_shape<T, 256, 16>(problem, args, blocks, stream);
    } else {
      launch_router_forward_shape<T, 512, 16>(problem, args, blocks, stream);
    }
  }
  if (args.counts) {
    const int64_t written = problem.tokens > 0 ? blocks : 0;  // T = 0: no block counted anything
    router_counts(static_cast<const int32_t*>(args.workspace), written, problem.experts, args.counts, stream);
  }
}

}  // namespace routing
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
