// The auxiliary losses' values (docs/math.md section 1.1): LB = a E sum_e f_e P_e and Z = b mean_t lse_t^2, with
// f_e = counts_e / (T K) and P_e = mean_t softmax(logits[t])_e.
//
// Three launches (column_sums only for the load-balancing loss), each sum in a fixed order:
//   row_lse:     one warp per row; lse_t = m + log(sum_e exp(x_e - m)) by xor butterflies.        [T] fp32 out
//   column_sums: block (j, c) sums p[t,e] = exp(x[t,e] - lse_t) over the 256 rows of chunk j, in row order, for the
//                128 experts of column block c (a warp reads 32 consecutive logits of a row).  [chunks][E] fp64 out
//   finish:      one block of 1024 threads; thread i takes experts i, i + 1024, ... (the chunks added in order) and
//                rows i, i + 1024, ...; the per-thread sums go through a warp butterfly and then the 32 warps in
//                order.
// Bytes: the logits are read twice (T*E each), the column sums written and read once.
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

constexpr int kRowsPerBlock = 8;      // row_lse: warps per block
constexpr int kColumnThreads = 128;   // column_sums: experts per block
constexpr int kFinishThreads = 1024;

__device__ __forceinline__ double warp_sum_double(double v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(full_warp, v, offset);
  return v;
}

// The sum of v over a 1024-thread block: a butterfly per warp, then the warps' sums in warp order.
__device__ double block_sum_double(double v, double* scratch) {
  v = warp_sum_double(v);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kFinishThreads / 32; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

template <class T>
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    row_lse_kernel(const T* logits, int64_t stride, int64_t tokens, int64_t experts, float* lse) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= tokens) return;  // a whole warp leaves together
  const int lane = threadIdx.x % 32;
  const RowSoftmax softmax = warp_row_softmax(logits + row * stride, experts, lane);
  if (lane == 0) lse[row] = softmax.lse();
}

template <class T>
__global__ void __launch_bounds__(kColumnThreads)
    column_sums_kernel(const T* logits, int64_t stride, int64_t tokens, int64_t experts, const float* lse,
                       double* column_sums) {
  const int64_t e = static_cast<int64_t>(blockIdx.y) * kColumnThreads + threadIdx.x;
  if (e >= experts) return;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * aux_chunk_rows;
  const int64_t last = first + aux_chunk_rows < tokens ? first + aux_chunk_rows : tokens;
  double sum = 0;
  for (int64_t t = first; t < last; ++t) sum += expf(to_float(logits[t * stride + e]) - lse[t]);
  column_sums[blockIdx.x * experts + e] = sum;
}

__global__ void __launch_bounds__(kFinishThreads)
    finish_kernel(AuxLossProblem problem, const int32_t* counts, const float* lse, const double* column_sums,
                  float* load_balance_loss, float* z_loss) {
  __shared__ double scratch[kFinishThreads / 32];
  const int64_t T = problem.tokens, E = problem.experts;
  const int64_t chunks = (T + aux_chunk_rows - 1) / aux_chunk_rows;  // aux_chunks(T), a host function
  double f_dot_p = 0;  // sum_e counts_e * sum_t p[t,e] over this thread's experts
  // NOTE: with the load-balancing loss off, neither the counts nor the column sums were written.
  for (int64_t e = threadIdx.x; problem.load_balance_coeff != 0 && e < E; e += kFinishThreads) {
    double p_sum = 0;
    for (int64_t j = 0; j < chunks; ++j) p_sum += column_sums[j * E + e];
    f_dot_p += static_cast<double>(counts[e]) * p_sum;
  }
  double lse_squares = 0;
  for (int64_t t = threadIdx.x; t < T; t += kFinishThreads) {
    const double l = lse[t];
    lse_squares += l * l;
  }
  f_dot_p = block_sum_double(f_dot_p, scratch);
  lse_squares = block_sum_double(lse_squares, scratch);
  if (threadIdx.x != 0) return;
  const double t = static_cast<double>(T);
  // f_e P_e = (counts_e / (T K)) (sum_t p / T).
  const double lb = T == 0 ? 0.0 : problem.load_balance_coeff * static_cast<double>(E) * f_dot_p /
                                       (t * t * static_cast<double>(problem.top_k));
  const double z = T == 0 ? 0.0 : problem.z_loss_coeff * lse_squares / t;
  if (load_balance_loss) *load_balance_loss = static_cast<float>(lb);
  if (z_loss) *z_loss = static_cast<float>(z);
}

template <class T>
void launch_rows(const AuxLossProblem& problem, const AuxLossForwardArgs& args, cudaStream_t stream) {
  const T* logits = static_cast<const T*>(args.logits);
  const int64_t row_blocks = (problem.tokens + kRowsPerBlock - 1) / kRowsPerBlock;
  row_lse_kernel<T><<<static_cast<unsigned>(row_blocks), kRowsPerBlock * 32, 0, stream>>>(
      logits, args.logits_stride, problem.tokens, problem.experts, args.lse);
  check_launch("aux loss row logsumexp kernel");
  if (problem.load_balance_coeff == 0) return;  // only the load-balancing loss needs P
  // x: the chunks (any number), y: the column blocks (E <= 8192, so at most 64).
  const dim3 grid(static_cast<unsigned>(aux_chunks(problem.tokens)),
                  static_cast<unsigned>((problem.experts + kColumnThreads - 1) / kColumnThreads));
  column_sums_kernel<T><<<grid, kColumnThreads, 0, stream>>>(logits, args.logits_stride, problem.tokens,
                                                             problem.experts, args.lse, args.column_sums);
  check_launch("aux loss column sums kernel");
}

}  // namespace

void aux_loss_forward(const AuxLossProblem& problem, const AuxLossForwardArgs& args, cudaStream_t stream) {
  if (problem.tokens > 0) {
    switch (args.logits_dtype) {
      case MOEKIT_DTYPE_BF16: launch_rows<__nv_bfloat16>(problem, args, stream); break;
      case MOEKIT_DTYPE_FP16: launch_rows<__half>(problem, args, stream); break;
      case MOEKIT_DTYPE_FP32: launch_rows<float>(problem, args, stream); break;
      default: throw_internal("aux loss forward: logits dtype " + std::to_string(args.logits_dtype));
    }
  }
  finish_kernel<<<1, kFinishThreads, 0, stream>>>(problem, args.counts, args.lse, args.column_sums,
                                                  args.load_balance_loss, args.z_loss);
  check_launch("aux loss finish kernel");
}

}  // namespace routing
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
