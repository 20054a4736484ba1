// Router backward (SPEC section 1), the kernel and its launcher, templated on the logits dtype T. For each token
// row: dlogits [E] (fp32 or T) from the score gradient g [K], the forward's indices and the logits, recomputing
// the softmax / sigmoid in fp32 (the sigmoid in double, as the forward's key). TOPK_SOFTMAX writes every entry
// (-p_e * c outside the selected experts); the other kinds write 0 outside them, or leave the old value when
// accumulating.
//
// Preconditions (capi checked them): as the forward's. Indices outside [0, E) (never produced by the forward)
// contribute nothing and are not read through.
//
// Launch: as the forward (router_forward.cuh): row groups of THREADS threads, rows_per_block per block. Shared
// memory: per row group, the selected pairs' gradients summed per expert, one fp32 word per slot of each thread,
// slot-major (row_group.cuh), so the threads read their own slots without bank conflicts.
// Bytes: T*E*size(dlogits) written (and read when accumulating); the logits are read whole only by
// TOPK_SOFTMAX, the other kinds read the K selected ones; T*K*(4 + index size) read.
//
// Determinism: per-pair terms come from fixed butterflies over the K lanes of the first warp; one lane adds them
// into the shared row in ascending k (so a repeated index sums in a fixed order, as the reference does).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/common/storage.cuh"
#include "cuda/routing/router.h"
#include "cuda/routing/router_forward.cuh"
#include "cuda/routing/row_group.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace routing {

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
                                                   const float (&x)[ITEMS], float row_max, float row_sum, float c) {
  // contribution: the row group's slot-major shared row; slot s of this thread is contribution[s * THREADS + lane].
  constexpr int CHUNK = chunk_elements<T, ITEMS>();
  const int experts = static_cast<int>(problem.experts);
  const bool over_all_experts = problem.kind == MOEKIT_ROUTER_TOPK_SOFTMAX;
  O* out = static_cast<O*>(args.dlogits) + row * args.dlogits_stride;  // [E]
  // The gradient of slot s: the selected pairs' sum, and for TOPK_SOFTMAX p_e * (sum - c) over every expert.
  auto gradient = [&](int s) {
    const float sum = contribution[s * THREADS + lane];
    return over_all_experts ? expf(x[s] - row_max) / row_sum * (sum - c) : sum;
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

template <class T,
          int THREADS,
          int ITEMS>
__global__ void __launch_bounds__(THREADS * rows_per_block<THREADS>())
    router_backward_kernel(RouterProblem problem, RouterBackwardArgs args, bool chunked) {
  constexpr int ROWS = rows_per_block<THREADS>();
  constexpr int WARPS = THREADS / 32;
  static_assert(THREADS % 32 == 0, "a row group is a whole number of warps");
  static_assert(THREADS == 32 || ROWS == 1, "a row group larger than a warp owns its block (it synchronises it)");

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
  const int64_t row = static_cast<int64_t>(blockIdx.x) * ROWS + threadIdx.x / THREADS;
  if (row >= problem.tokens) return;  // a whole row group leaves together
  const T* logits = static_cast<const T*>(args.logits) + row * args.logits_stride;  // [E]
  float* contribution = contributions[threadIdx.x / THREADS];

#pragma unroll
  for (int s = 0; s < ITEMS; ++s) contribution[s * THREADS + lane] = 0.0f;

  float x[ITEMS];
  float row_max = 0.0f, row_sum = 1.0f;
  if (problem.kind == MOEKIT_ROUTER_TOPK_SOFTMAX) {
    load_row<T, THREADS, ITEMS>(logits, experts, lane, chunked, x);
    float m = -INFINITY;
#pragma unroll
    for (int s = 0; s < ITEMS; ++s) m = fmaxf(m, x[s]);
    row_max = group_max<THREADS>(m, scratch);
    float z = 0.0f;
#pragma unroll
    for (int s = 0; s < ITEMS; ++s) z += expf(x[s] - row_max);
    row_sum = group_sum<THREADS>(z, scratch);
  }

  // Lane k of the first warp: pair k's gradient d with respect to its logit (before TOPK_SOFTMAX's p_e factor).
  float d = 0.0f, c = 0.0f;
  int expert = -1;
  if (first_warp) {
    const bool active = warp_lane < top_k;
    const int64_t id =
        active ? load_index(args.indices, row * args.indices_stride + warp_lane, args.indices_int64) : -1;
    const bool valid = id >= 0 && id < experts;
    const float v = valid ? to_float(logits[id]) : 0.0f;
    const float g = valid ? args.dscores[row * args.dscores_stride + warp_lane] : 0.0f;
    if (problem.kind == MOEKIT_ROUTER_SOFTMAX_TOPK) {
      const float m = warp_max(valid ? v : -INFINITY);
      const float ex = valid ? expf(v - m) : 0.0f;
      const float s = ex / warp_sum(ex);
      d = s * (g - warp_sum(g * s));
    } else {
      double q = 0.0;  // SIGMOID: sigmoid(v) in double, so q (1 - q) keeps the reference's precision
      float r = 0.0f;
      if (valid) {
        if (problem.kind == MOEKIT_ROUTER_TOPK_SOFTMAX) {
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
        const float g_dot_normalised = warp_sum(valid ? g * (r / sum_r) : 0.0f);
        dr = scale * (g - g_dot_normalised) / sum_r;
      }
      if (!valid) dr = 0.0f;
      if (problem.kind == MOEKIT_ROUTER_TOPK_SOFTMAX) {
        c = warp_sum(dr * r);
        d = dr;
      } else if (problem.kind == MOEKIT_ROUTER_SIGMOID) {
        d = dr * static_cast<float>(q * (1.0 - q));
      } else {
        d = dr;
      }
    }
    expert = valid ? static_cast<int>(id) : -1;
  }
  group_sync<THREADS>();  // the shared row is zeroed

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
    write_gradient_row<T, THREADS, ITEMS, float>(problem, args, row, lane, chunked, contribution, x, row_max, row_sum,
                                                 c);
  } else {
    write_gradient_row<T, THREADS, ITEMS, T>(problem, args, row, lane, chunked, contribution, x, row_max, row_sum, c);
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
