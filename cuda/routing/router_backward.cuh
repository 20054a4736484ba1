// Router backward (docs/math.md section 1), the kernel and its launcher, templated on the logits dtype T. For each
// token row: dlogits [E] (fp32 or T) from the score gradient g [K], the forward's indices and the logits, recomputing
// the softmax / sigmoid in fp32 (the sigmoid in double, as the forward's key). TOPK_SOFTMAX writes every entry
// (-p_e * c outside the selected experts); the other kinds write 0 outside them, or leave the old value when
// accumulating.
//
// Preconditions (capi checked them): as the forward's. Indices outside [0, E) (never produced by the forward)
// contribute nothing and are not read through; a repeated index (never produced either) sums its pairs' terms,
// which for TOPK_SOFTMAX is not the reference's value.
//
// Launch: row groups of THREADS threads (router.h), rows_per_block per block, grid = ceil(T / rows). Shared
// memory: per row group, the selected pairs' gradients summed per expert, one fp32 word per slot of each thread,
// slot-major (row_group.cuh), so the threads read their own slots without bank conflicts.
// Bytes: T*E*size(dlogits) written (and read when accumulating); the logits are read whole only by
// TOPK_SOFTMAX, the other kinds read the K selected ones; T*K*(4 + index size) read.
//
// Accuracy: the terms g_k - sum_j g_j s_j (and their renormalised and TOPK_SOFTMAX forms) are formed as
// sum_j s_j (g_k - g_j), which keeps fp32's relative precision when one weight is near 1 (centred() below).
// Determinism: per-pair terms come from fixed butterflies and loops over the K lanes of the first warp; one lane
// adds them into the shared row in ascending k.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/common/storage.cuh"
#include "cuda/routing/router.h"
#include "cuda/routing/row_group.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace routing {

// Row groups per block of the backward: a warp-sized row group shares its block with three others (128 threads);
// a block-sized one is alone. (The forward's are larger: forward_rows_per_block, router.h.)
template <int THREADS>
__host__ __device__ constexpr int rows_per_block() {
  return THREADS == 32 ? 4 : 1;
}

// Writes one chunk of a dlogits row: the new gradient, plus the old values when accumulating.
template <class O,
          int CHUNK>
__device__ __forceinline__ void write_gradient_chunk(O* out, float* values, bool accumulate) {
  if (accumulate) {
    float old[CHUNK];
    load_chunk<O, CHUNK>(out, old);
#pragma unroll
    for (int j = 0; j < CHUNK; ++j) values[j] += old[j];
  }
  store_chunk<O, CHUNK>(out, values);
}

template <class T,
          int THREADS,
          int ITEMS,
          class O>
__device__ __forceinline__ void write_gradient_row(const RouterProblem& problem, const RouterBackwardArgs& args,
                                                   int64_t row, int lane, bool chunked, const float* contribution,
                                                   const float (&x)[ITEMS], unsigned selected_slots, float row_max,
                                                   float row_sum, float c) {
  // contribution: the row group's slot-major shared row; slot s of this thread is contribution[s * THREADS + lane].
  constexpr int CHUNK = chunk_elements<T, ITEMS>();
  const int experts = static_cast<int>(problem.experts);
  const bool over_all_experts = problem.kind == MOEKIT_ROUTER_TOPK_SOFTMAX;
  O* out = static_cast<O*>(args.dlogits) + row * args.dlogits_stride;  // [E]
  // The gradient of slot s: the selected pairs' sum; for TOPK_SOFTMAX p_e * (dr_e - c) over every expert, where
  // the shared row holds dr_e - c for the selected ones.
  auto gradient = [&](int s) {
    const float sum = contribution[s * THREADS + lane];
    if (!over_all_experts) return sum;
    const float p = expf(x[s] - row_max) / row_sum;
    return p * (((selected_slots >> s) & 1u) ? sum : -c);
  };
  if (chunked) {
#pragma unroll
    for (int first = 0; first < ITEMS; first += CHUNK) {
      const int e = element_of<THREADS, CHUNK>(first, lane, true);
      if (e >= experts) continue;
      float values[CHUNK];
#pragma unroll
      for (int j = 0; j < CHUNK; ++j) values[j] = gradient(first + j);
      write_gradient_chunk<O, CHUNK>(out + e, values, args.accumulate);
    }
  } else {
#pragma unroll
    for (int s = 0; s < ITEMS; ++s) {
      const int e = element_of<THREADS, CHUNK>(s, lane, false);
      if (e >= experts) continue;
      float value = gradient(s);
      write_gradient_chunk<O, 1>(out + e, &value, args.accumulate);
    }
  }
}

// sum_j w_j (a - a_j) over the K lanes of a warp (lane j holds w_j, a_j; lanes past K hold w = 0), in ascending j.
// With sum_j w_j = 1 this is a - sum_j w_j a_j without its cancellation: the j = own lane term is exactly 0, so a
// lane whose weight is near 1 gets a small result with a small relative error.
__device__ __forceinline__ float centred(float a, float w, int top_k) {
  float total = 0.0f;
  for (int j = 0; j < top_k; ++j) total += __shfl_sync(full_warp, w, j) * (a - __shfl_sync(full_warp, a, j));
  return total;
}

template <class T,
          int THREADS,
          int ITEMS>
__global__ void __launch_bounds__(THREADS * rows_per_block<THREADS>())
    router_backward_kernel(RouterProblem problem, RouterBackwardArgs args, bool chunked) {
  constexpr int ROWS = rows_per_block<THREADS>();
  constexpr int WARPS = THREADS / 32;
  static_assert(THREADS % 32 == 0, "a row group is a whole number of warps");
  static_assert(THREADS == 32 || ROWS == 1, "a row group larger than a warp owns its block (it synchronises it)");
  static_assert(ITEMS <= 32, "a thread's selected slots fit in one 32-bit mask");

  constexpr int CHUNK = chunk_elements<T, ITEMS>();
  static_assert(ROWS * ITEMS * THREADS * sizeof(float) <= 32 * 1024, "the shared rows fit in static shared memory");

  __shared__ float contributions[ROWS][ITEMS * THREADS];  // slot-major, per row group
  __shared__ float scratch[WARPS];                        // group_sum / group_max partials
  __shared__ float shared_c;                              // TOPK_SOFTMAX's c, for the warps past the first

  const int experts = static_cast<int>(problem.experts);
  const int top_k = static_cast<int>(problem.top_k);
  const int lane = threadIdx.x % THREADS;
  const int warp_lane = threadIdx.x % 32;
  const bool first_warp = THREADS == 32 || threadIdx.x < 32;
  const bool over_all_experts = problem.kind == MOEKIT_ROUTER_TOPK_SOFTMAX;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * ROWS + threadIdx.x / THREADS;
  if (row >= problem.tokens) return;  // a whole row group leaves together
  const T* logits = static_cast<const T*>(args.logits) + row * args.logits_stride;  // [E]
  float* contribution = contributions[threadIdx.x / THREADS];

#pragma unroll
  for (int s = 0; s < ITEMS; ++s) contribution[s * THREADS + lane] = 0.0f;

  // Lane k of the first warp: pair k's expert, logit and score gradient.
  int expert = -1;
  float v = 0.0f, g = 0.0f;
  if (first_warp && warp_lane < top_k) {
    const int64_t id = load_index(args.indices, row * args.indices_stride + warp_lane, args.indices_int64);
    if (id >= 0 && id < experts) {
      expert = static_cast<int>(id);
      v = to_float(logits[id]);
      g = args.dscores[row * args.dscores_stride + warp_lane];
    }
  }
  const bool valid = expert >= 0;

  // TOPK_SOFTMAX: the softmax over the whole row, and the probability mass U outside the selected experts summed
  // from those experts' own terms (1 - sum of the selected p would lose U's digits when the selection holds
  // nearly all the mass).
  float x[ITEMS];
  unsigned selected_slots = 0;
  float row_max = 0.0f, row_sum = 1.0f, unselected = 0.0f;
  if (over_all_experts) {
    load_row<T, THREADS, ITEMS>(logits, experts, lane, chunked, x);
    group_sync<THREADS>();  // the shared row is zeroed
    if (first_warp)
      for (int k = 0; k < top_k; ++k) {
        const int e = __shfl_sync(full_warp, expert, k);
        if (warp_lane == 0 && e >= 0) contribution[slot_major_position<THREADS, CHUNK>(e, chunked)] = 1.0f;
      }
    group_sync<THREADS>();  // the selected experts are marked
    float m = -INFINITY;
#pragma unroll
    for (int s = 0; s < ITEMS; ++s) {
      m = fmaxf(m, x[s]);
      if (contribution[s * THREADS + lane] != 0.0f) {
        selected_slots |= 1u << s;
        contribution[s * THREADS + lane] = 0.0f;
      }
    }
    row_max = group_max<THREADS>(m, scratch);
    float z = 0.0f, z_unselected = 0.0f;
#pragma unroll
    for (int s = 0; s < ITEMS; ++s) {
      const float term = expf(x[s] - row_max);
      z += term;
      if (!((selected_slots >> s) & 1u)) z_unselected += term;
    }
    row_sum = group_sum<THREADS>(z, scratch);
    unselected = group_sum<THREADS>(z_unselected, scratch) / row_sum;
  }

  // Lane k of the first warp: what pair k adds at its expert (TOPK_SOFTMAX: dr_k - c, the p_e factor comes last).
  float d = 0.0f, c = 0.0f;
  if (first_warp) {
    if (problem.kind == MOEKIT_ROUTER_SOFTMAX_TOPK) {
      const float m = warp_max(valid ? v : -INFINITY);
      const float ex = valid ? expf(v - m) : 0.0f;
      const float s = ex / warp_sum(ex);
      d = s * centred(g, s, top_k);  // s_k (g_k - sum_j g_j s_j)
    } else {
      double q = 0.0;  // SIGMOID: sigmoid(v) in double, so q (1 - q) keeps the reference's precision
      float r = 0.0f;
      if (valid) {
        if (over_all_experts) {
          r = expf(v - row_max) / row_sum;
        } else if (problem.kind == MOEKIT_ROUTER_SIGMOID) {
          q = 1.0 / (1.0 + exp(-static_cast<double>(v)));
          r = static_cast<float>(q);
        } else {
          r = v;
        }
      }
      const float scale = problem.kind == MOEKIT_ROUTER_SIGMOID ? problem.scale : 1.0f;
      float dr = scale * g;
      if (problem.renormalize) {
        const float sum_r = warp_sum(r);
        dr = scale * centred(g, r / sum_r, top_k) / sum_r;  // scale (g_k - sum_j g_j r_j / sum_r) / sum_r
      }
      if (!valid) dr = 0.0f;
      if (over_all_experts) {
        c = warp_sum(dr * r);
        d = dr * unselected + centred(dr, r, top_k);  // dr_k - c = dr_k U + sum_j p_j (dr_k - dr_j)
      } else if (problem.kind == MOEKIT_ROUTER_SIGMOID) {
        d = dr * static_cast<float>(q * (1.0 - q));
      } else {
        d = dr;
      }
    }
  }
  group_sync<THREADS>();  // the shared row is zeroed (TOPK_SOFTMAX: its marks are read and cleared)

  if (first_warp) {
    for (int k = 0; k < top_k; ++k) {
      const int e = __shfl_sync(full_warp, expert, k);
      const float dk = __shfl_sync(full_warp, d, k);
      if (warp_lane == 0 && e >= 0) contribution[slot_major_position<THREADS, CHUNK>(e, chunked)] += dk;
    }
    if (THREADS > 32 && threadIdx.x == 0) shared_c = c;
  }
  group_sync<THREADS>();  // the shared row is complete
  if (THREADS > 32) c = shared_c;

  if (args.dlogits_fp32) {
    write_gradient_row<T, THREADS, ITEMS, float>(problem, args, row, lane, chunked, contribution, x, selected_slots,
                                                 row_max, row_sum, c);
  } else {
    write_gradient_row<T, THREADS, ITEMS, T>(problem, args, row, lane, chunked, contribution, x, selected_slots,
                                             row_max, row_sum, c);
  }
}

template <class T,
          int THREADS,
          int ITEMS>
void launch_router_backward_shape(const RouterProblem& problem, const RouterBackwardArgs& args, cudaStream_t stream) {
  constexpr int ROWS = rows_per_block<THREADS>();
  constexpr int CHUNK = chunk_elements<T, ITEMS>();
  // One layout for reading logits and writing dlogits (their rows may have different strides and dtypes).
  const bool chunked =
      chunked_rows<T, CHUNK>(args.logits, args.logits_stride, problem.experts) &&
      (args.dlogits_fp32 ? chunked_rows<float, CHUNK>(args.dlogits, args.dlogits_stride, problem.experts)
                         : chunked_rows<T, CHUNK>(args.dlogits, args.dlogits_stride, problem.experts));
  const int64_t blocks = (problem.tokens + ROWS - 1) / ROWS;
  router_backward_kernel<T, THREADS, ITEMS>
      <<<static_cast<unsigned>(blocks), THREADS * ROWS, 0, stream>>>(problem, args, chunked);
  check_launch("router backward kernel");
}

template <class T>
void launch_router_backward(const RouterProblem& problem, const RouterBackwardArgs& args, cudaStream_t stream) {
  if (problem.tokens == 0) return;
  const RowGroupShape shape = row_group_shape(problem.experts);
  if (shape.threads == 32) {
    switch (shape.items) {
      case 1: return launch_router_backward_shape<T, 32, 1>(problem, args, stream);
      case 2: return launch_router_backward_shape<T, 32, 2>(problem, args, stream);
      case 4: return launch_router_backward_shape<T, 32, 4>(problem, args, stream);
      case 8: return launch_router_backward_shape<T, 32, 8>(problem, args, stream);
      case 16: return launch_router_backward_shape<T, 32, 16>(problem, args, stream);
      case 32: return launch_router_backward_shape<T, 32, 32>(problem, args, stream);
    }
  } else if (shape.threads == 256) {
    switch (shape.items) {
      case 8: return launch_router_backward_shape<T, 256, 8>(problem, args, stream);
      case 16: return launch_router_backward_shape<T, 256, 16>(problem, args, stream);
    }
  } else if (shape.threads == 512 && shape.items == 16) {
    return launch_router_backward_shape<T, 512, 16>(problem, args, stream);
  }
  throw_not_supported("experts: the CUDA router holds at most " + std::to_string(max_router_experts) +
                      " experts per row, got " + std::to_string(problem.experts));
}

}  // namespace routing
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
