// The auxiliary losses' gradient (docs/math.md section 1.1), added to the router backward's fp32 gradient and rounded
// once into dlogits. Per row t, with p = softmax(logits[t]), lse_t its logsumexp, f_e = counts_e / (T K):
//   dlogits[t,j] = [old +] base[t,j] + gLB (a E / T) p_j (f_j - sum_e f_e p_e) + gZ (2 b / T) lse_t p_j
// where gLB, gZ are the losses' upstream gradients (1 when absent).
//
// Two launches: the counts of the indices (integer atomics, so the same counts in any order), then one warp per row
// whose sums are xor butterflies over a fixed striding of the row: the same bits on every run.
// Bytes: T*K indices read; the logits and base read, dlogits written (and read with add_old), T*E each.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/common/status_error.h"
#include "cuda/common/storage.cuh"
#include "cuda/routing/aux_losses.h"
#include "cuda/routing/row_group.cuh"
#include "cuda/routing/warp_row_softmax.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace routing {

namespace {

constexpr int kCountThreads = 256;
constexpr int kRowsPerBlock = 8;  // warps per block of the gradient kernel

__global__ void __launch_bounds__(kCountThreads)
    count_kernel(const void* indices, int64_t stride, bool is_int64, int64_t tokens, int64_t top_k, int64_t experts,
                 int32_t* counts) {
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * kCountThreads + threadIdx.x;
  if (pair >= tokens * top_k) return;
  const int64_t id = load_index(indices, (pair / top_k) * stride + pair % top_k, is_int64);
  if (id >= 0 && id < experts) atomicAdd(counts + id, 1);
}

template <class T,
          class O>
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    gradient_kernel(AuxLossProblem problem, AuxLossGradientArgs args) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= problem.tokens) return;  // a whole warp leaves together
  const int lane = threadIdx.x % 32;
  const int64_t E = problem.experts;
  const T* x = static_cast<const T*>(args.logits) + row * args.logits_stride;  // [E]
  const float* base = args.base + row * args.base_stride;                     // [E]
  O* out = static_cast<O*>(args.dlogits) + row * args.dlogits_stride;          // [E]

  const double t = static_cast<double>(problem.tokens);
  const float g_lb = args.d_load_balance ? *args.d_load_balance : 1.0f;
  const float g_z = args.d_z ? *args.d_z : 1.0f;
  const float lb_scale = static_cast<float>(g_lb * problem.load_balance_coeff * static_cast<double>(E) / t);
  const float z_scale = static_cast<float>(g_z * 2.0 * problem.z_loss_coeff / t);
  const float per_pair = static_cast<float>(1.0 / (t * static_cast<double>(problem.top_k)));
  const bool balance = problem.load_balance_coeff != 0;  // else the counts were never formed

  const RowSoftmax softmax = warp_row_softmax(x, E, lane);
  const float lse = softmax.lse();
  float f_dot_p = 0.0f;
  if (balance) {
    for (int64_t e = lane; e < E; e += 32)
      f_dot_p += static_cast<float>(args.counts[e]) * per_pair * softmax.probability(to_float(x[e]));
    f_dot_p = warp_sum(f_dot_p);
  }
  for (int64_t e = lane; e < E; e += 32) {
    const float p = softmax.probability(to_float(x[e]));
    float aux = z_scale * lse * p;
    if (balance) aux += lb_scale * p * (static_cast<float>(args.counts[e]) * per_pair - f_dot_p);
    float value = base[e] + aux;
    if (args.add_old) value += to_float(out[e]);
    out[e] = from_float<O>(value);
  }
}

template <class T,
          class O>
void launch_gradient(const AuxLossProblem& problem, const AuxLossGradientArgs& args, cudaStream_t stream) {
  const int64_t blocks = (problem.tokens + kRowsPerBlock - 1) / kRowsPerBlock;
  gradient_kernel<T, O><<<static_cast<unsigned>(blocks), kRowsPerBlock * 32, 0, stream>>>(problem, args);
  check_launch("aux loss gradient kernel");
}

template <class T>
void launch_for_logits(const AuxLossProblem& problem, const AuxLossGradientArgs& args, cudaStream_t stream) {
  if (args.dlogits_dtype == MOEKIT_DTYPE_FP32) return launch_gradient<T, float>(problem, args, stream);
  return launch_gradient<T, T>(problem, args, stream);
}

}  // namespace

void aux_loss_gradient(const AuxLossProblem& problem, const AuxLossGradientArgs& args, cudaStream_t stream) {
  if (problem.tokens == 0) return;
  if (problem.load_balance_coeff != 0) {
    check_cuda(cudaMemsetAsync(args.counts, 0, static_cast<size_t>(problem.experts) * sizeof(int32_t), stream),
               "aux loss gradient: clearing the counts");
    const int64_t pairs = problem.tokens * problem.top_k;
    count_kernel<<<static_cast<unsigned>((pairs + kCountThreads - 1) / kCountThreads), kCountThreads, 0, stream>>>(
        args.indices, args.indices_stride, args.indices_int64, problem.tokens, problem.top_k, problem.experts,
        args.counts);
    check_launch("aux loss count kernel");
  }
  switch (args.logits_dtype) {
    case MOEKIT_DTYPE_BF16: return launch_for_logits<__nv_bfloat16>(problem, args, stream);
    case MOEKIT_DTYPE_FP16: return launch_for_logits<__half>(problem, args, stream);
    case MOEKIT_DTYPE_FP32: return launch_gradient<float, float>(problem, args, stream);
    default: throw_internal("aux loss gradient: logits dtype " + std::to_string(args.logits_dtype));
  }
}

}  // namespace routing
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
