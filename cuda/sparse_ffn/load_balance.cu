// The aux-loss-free load-balance update of docs/math.md section 7, one thread per group:
//   freq = counts[g] / tokens;  ema[g] = fp32(m * ema[g] + (1 - m) * freq);  target = kg / NG
//   bias[g] += gamma where ema[g] < target / 2, -= gamma where ema[g] > 2 * target (strict, on the stored ema)
//   bias[g] = fp32(clamp(bias[g], -bias_max, bias_max))
// Float64 with every operation rounded separately (no contraction into fma), as the reference computes it, so
// the results are bit for bit the reference's. Bytes moved: 4 + 8 + 8 per group (or 8 + 8 + 8 for int64 counts).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/sparse_ffn/group_select.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace sparse_ffn {

namespace {

constexpr int kLoadBalanceThreads = 256;

__device__ __forceinline__ double count_of(const LoadBalanceArgs& a, int64_t g) {
  switch (a.counts_type) {
    case CountsType::int32: return static_cast<double>(static_cast<const int32_t*>(a.counts)[g]);
    case CountsType::int64: return __ll2double_rn(static_cast<const int64_t*>(a.counts)[g]);
    default: return static_cast<double>(static_cast<const float*>(a.counts)[g]);
  }
}

__global__ void __launch_bounds__(kLoadBalanceThreads, 1) load_balance_kernel(LoadBalanceArgs a) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kLoadBalanceThreads + threadIdx.x;
  if (g >= a.groups) return;
  const double freq = __ddiv_rn(count_of(a, g), a.tokens);
  const double target = __ddiv_rn(static_cast<double>(a.top_groups), static_cast<double>(a.groups));
  const double ema_sum = __dadd_rn(__dmul_rn(a.momentum, static_cast<double>(a.ema[g])),
                                   __dmul_rn(__dsub_rn(1.0, a.momentum), freq));
  const float ema = __double2float_rn(ema_sum);
  double bias = static_cast<double>(a.bias[g]);
  if (static_cast<double>(ema) < __dmul_rn(0.5, target)) bias = __dadd_rn(bias, a.gamma);
  else if (static_cast<double>(ema) > __dmul_rn(2.0, target)) bias = __dsub_rn(bias, a.gamma);
  // std::clamp's comparisons, so even a NaN bias comes out as the reference's.
  if (bias < -a.bias_max) bias = -a.bias_max;
  else if (a.bias_max < bias) bias = a.bias_max;
  a.ema[g] = ema;
  a.bias[g] = __double2float_rn(bias);
}

}  // namespace

void launch_load_balance_update(const LoadBalanceArgs& args, cudaStream_t stream) {
  if (args.groups == 0) return;
  const int64_t blocks = (args.groups + kLoadBalanceThreads - 1) / kLoadBalanceThreads;
  load_balance_kernel<<<static_cast<unsigned>(blocks), kLoadBalanceThreads, 0, stream>>>(args);
  check_launch("load balance update kernel");
}

}  // namespace sparse_ffn
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
