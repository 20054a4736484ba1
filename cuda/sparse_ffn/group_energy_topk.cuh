// Group energies and top-kg group selection of the sparse SwiGLU FFN (docs/math.md section 7), one warp per token.
//
// Computes, for each token t of a chunk:
//   en[g]  = estimate_scale * sum over the rows_per_group consecutive columns c of group g of |silu(pre[t, c])|
//   key[g] = fp32(en[g] * exp(lb_bias[g]))      (the bias factor only when lb_bias is given)
//   groups_out[t, 0..kg) = the kg largest keys, value-descending, ties to the lower group
// pre is the gate pre-activation already rounded to the storage dtype (the cuBLASLt GEMM's output), so the
// energy reads the same values as the reference's round_to(x . Wg_n).
//
// Preconditions: pre is [tokens, groups * rows_per_group], contiguous, 16-byte aligned; 1 <= kg <= groups <=
// kMaxSelectGroups; the launcher's dynamic shared memory holds `warps` per-warp slices.
//
// Launch shape: blocks of up to 8 warps; each warp walks tokens with a grid-wide stride. Per token it reads the
// row once (16-byte loads when a group's columns are a whole number of 8-wide vectors, one group per lane
// otherwise), writes the keys to its shared-memory slice, then runs kg rounds of a warp arg-max.
//
// Deterministic: every energy is summed in a fixed order (a fixed butterfly across the lanes of a group), and
// the selection is a total order on (key, group). Counts are a separate pass (group_counts.cu), so no global
// atomics from every token meet on the few cache lines of counts; that pass measured 3-15 us at T = 16384.
//
// Measured on an H200 (T = 16384, G = 32, kg = NG/16): this kernel plus the chunking adds ~100 us (spg = 8) to
// ~450 us (F = 8192, all rows) to the cuBLASLt GEMM's time, independent of D: far above what its bytes and
// transcendental count predict, so it is latency-bound (one token per warp, kg dependent arg-max rounds).
// Next step: the energies fused into the GEMM epilogue, or an energy pass over many tokens per warp feeding a
// separate top-k over [T, NG].
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/common/storage.cuh"
#include "cuda/sparse_ffn/group_select.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace sparse_ffn {

constexpr int kEnergyWarpsPerBlock = 8;
// Vectors each lane loads before it reduces them: independent loads in flight hide the memory latency.
constexpr int kEnergyVectorsInFlight = 4;

// Shared memory, per warp: keys[groups] fp32 (a taken group is overwritten with NaN), then picked[kg] int32
// (the groups chosen so far, written out together once the token is done).
inline int64_t group_energy_smem_per_warp(int64_t groups, int64_t top_groups) {
  return (groups + top_groups) * static_cast<int64_t>(sizeof(float));
}

// |silu(z)| = |z| * sigmoid(z). The fast exp (ex2.approx, ~2 ulp) and the rounded reciprocal keep the energy
// within ~1e-6 relative of the exact one, far inside the 1e-3 near-tie band of docs/math.md section 9, at a third
// of the instructions of expf and an IEEE division (this loop evaluates T * NG * pg of them). z = -inf gives NaN,
// as z / (1 + e^-z).
__device__ __forceinline__ float abs_silu(float z) { return fabsf(z) * __frcp_rn(1.0f + __expf(-z)); }

// The key the selection orders by. NaN and -inf energies are invalid input; they become -inf so they rank after
// every valid key, the lower group first — the order the reference's top-k gives them.
__device__ __forceinline__ float selection_key(float energy_sum, int64_t g, const GroupEnergyArgs& a) {
  float e = energy_sum * a.estimate_scale;
  if (a.lb_bias) e *= expf(a.lb_bias[g]);
  return (isnan(e) || e == -INFINITY) ? -INFINITY : e;
}

// (key_a, group_a) ranks before (key_b, group_b); group INT_MAX means "nothing".
__device__ __forceinline__ bool ranks_before(float key_a, int group_a, float key_b, int group_b) {
  if (group_a == INT_MAX) return false;
  if (group_b == INT_MAX) return true;
  return key_a > key_b || (key_a == key_b && group_a < group_b);
}

// The best untaken group among those this lane owns (g = lane, lane + 32, ...); taken groups hold NaN.
__device__ __forceinline__ void best_of_lane(const float* keys, int groups, int lane, float& key, int& group) {
  key = -INFINITY;
  group = INT_MAX;
#pragma unroll 4
  for (int g = lane; g < groups; g += 32) {
    float k = keys[g];
    // Ascending g and a strict comparison keep the lower group on ties.
    if (!isnan(k) && (group == INT_MAX || k > key)) {
      key = k;
      group = g;
    }
  }
}

template <class T>
__device__ __forceinline__ void energies_vectorized(const T* row, const GroupEnergyArgs& a, int lane, float* keys) {
  // A group's columns span 2^lanes_shift consecutive 8-wide vectors, a power of two dividing 32: a warp step of
  // 32 vectors never splits a group, and the butterfly below stays inside it. (int: groups * 16 < 2^31.)
  const int lanes_per_group = static_cast<int>(a.rows_per_group / 8);
  const int lanes_shift = __ffs(lanes_per_group) - 1;
  const int vectors = static_cast<int>(a.groups) * lanes_per_group;
  for (int base = 0; base < vectors; base += 32 * kEnergyVectorsInFlight) {
    Vec16<T> loaded[kEnergyVectorsInFlight];
#pragma unroll
    for (int u = 0; u < kEnergyVectorsInFlight; ++u) {
      int v = base + u * 32 + lane;
      if (v < vectors) loaded[u] = load16(row + static_cast<int64_t>(v) * 8);
    }
#pragma unroll
    for (int u = 0; u < kEnergyVectorsInFlight; ++u) {
      // Uniform across the warp: vectors is a multiple of lanes_per_group, so whole groups are in or out.
      if (base + u * 32 >= vectors) break;
      int v = base + u * 32 + lane;
      float sum = 0.0f;
      if (v < vectors) {
#pragma unroll
        for (int i = 0; i < Vec16<T>::size; ++i) sum += abs_silu(to_float(loaded[u].v[i]));
      }
      for (int offset = lanes_per_group / 2; offset >= 1; offset /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      if (v < vectors && (lane & (lanes_per_group - 1)) == 0) {
        int g = v >> lanes_shift;
        keys[g] = selection_key(sum, g, a);
      }
    }
  }
}

template <class T>
__device__ __forceinline__ void energies_per_lane(const T* row, const GroupEnergyArgs& a, int lane, float* keys) {
  for (int64_t g = lane; g < a.groups; g += 32) {
    const T* cols = row + g * a.rows_per_group;
    float sum = 0.0f;
    for (int64_t j = 0; j < a.rows_per_group; ++j) sum += abs_silu(to_float(cols[j]));
    keys[g] = selection_key(sum, g, a);
  }
}

template <class T>
__global__ void __launch_bounds__(kEnergyWarpsPerBlock * 32, 3) group_energy_topk_kernel(GroupEnergyArgs a) {
  extern __shared__ float smem[];
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int groups = static_cast<int>(a.groups);
  const int top_groups = static_cast<int>(a.top_groups);
  float* keys = smem + static_cast<int64_t>(warp) * (groups + top_groups);
  int* picked = reinterpret_cast<int*>(keys + groups);
  const bool vectorized = a.rows_per_group % 8 == 0 && ((a.rows_per_group / 8) & (a.rows_per_group / 8 - 1)) == 0;
  const T* pre = static_cast<const T*>(a.pre);
  const int64_t row_width = a.groups * a.rows_per_group;
  const int64_t warps_in_grid = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);

  for (int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp; t < a.tokens; t += warps_in_grid) {
    const T* row = pre + t * row_width;
    if (vectorized) energies_vectorized(row, a, lane, keys);
    else energies_per_lane(row, a, lane, keys);
    // The energies were written by the lanes owning each group's vectors; the selection reads them by g % 32.
    __syncwarp();

    float key;
    int group;
    best_of_lane(keys, groups, lane, key, group);
    for (int k = 0; k < top_groups; ++k) {
      float best_key = key;
      int best_group = group;
      for (int offset = 16; offset >= 1; offset /= 2) {
        float other_key = __shfl_xor_sync(0xffffffffu, best_key, offset);
        int other_group = __shfl_xor_sync(0xffffffffu, best_group, offset);
        if (ranks_before(other_key, other_group, best_key, best_group)) {
          best_key = other_key;
          best_group = other_group;
        }
      }
      // (key, group) is a total order, so every lane holds the same winner; only its owner looks again.
      if (best_group % 32 == lane) {
        keys[best_group] = NAN;
        best_of_lane(keys, groups, lane, key, group);
      }
      if (lane == 0) picked[k] = best_group;
    }
    __syncwarp();
    int32_t* out = a.groups_out + t * a.groups_stride;
    for (int k = lane; k < top_groups; k += 32) out[k] = picked[k];
    // The next token's energies overwrite keys that other lanes have just read.
    __syncwarp();
  }
}

template <class T>
void launch_group_energy_topk_typed(const GroupEnergyArgs& args, cudaStream_t stream) {
  if (args.tokens == 0) return;
  const int64_t sm_count = args.sm_count, smem_optin = args.shared_bytes_optin;
  const int64_t per_warp = group_energy_smem_per_warp(args.groups, args.top_groups);
  int64_t warps = smem_optin / per_warp;
  if (warps > kEnergyWarpsPerBlock) warps = kEnergyWarpsPerBlock;
  if (warps < 1) throw_not_supported("d_ff: too many groups for one warp's shared memory in group selection");
  const size_t smem = static_cast<size_t>(warps * per_warp);
  if (smem > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(group_energy_topk_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)),
               "group select: shared memory opt-in");
  // Enough blocks to fill every SM a few times over; the token loop covers the rest.
  int64_t blocks = (args.tokens + warps - 1) / warps;
  if (blocks > 8 * sm_count) blocks = 8 * sm_count;
  group_energy_topk_kernel<T><<<static_cast<unsigned>(blocks), static_cast<unsigned>(warps * 32), smem, stream>>>(args);
  check_launch("group select: energy and top-k kernel");
}

}  // namespace sparse_ffn
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
