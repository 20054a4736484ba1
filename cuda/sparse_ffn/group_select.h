// Host-callable launchers of the sparse-FFN kernels (docs/math.md section 7): the subsample-row gather, the per-token
// group energy + top-kg selection, and the load-balance update. Plain C++ (raw pointers, sizes, streams); the
// CUDA backend's sparse_ffn_ops.cpp reads the tensor views and calls these. Each launcher only enqueues work.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace sparse_ffn {

enum class Storage { bf16, fp16 };
enum class CountsType { int32, int64, fp32 };

// w_sel[g * spg + j, :] = w_gate[row, :] with row = subsample_rows[g * spg + j]. A row outside group g's neurons
// [g*G, (g+1)*G) is invalid input; it is read as the group's first neuron so nothing is read out of bounds.
struct GatherRowsArgs {
  const void* w_gate;             // [F, D] 2-byte storage, rows w_gate_stride elements apart
  int64_t w_gate_stride;
  const int32_t* subsample_rows;  // [NG, spg] global neuron ids
  int64_t groups;                 // NG
  int64_t group_size;             // G
  int64_t rows_per_group;         // spg
  int64_t d_model;                // D
  void* w_sel;                    // out [NG * spg, D], contiguous
};
void launch_gather_subsample_rows(const GatherRowsArgs& args, cudaStream_t stream);

// For each token t of the chunk: en[g] = estimate_scale * sum over the rows_per_group consecutive columns of
// group g of |silu(pre[t, :])| (fp32), times exp(lb_bias[g]) when given; groups_out[t, :] = top-kg groups by
// that fp32 key (descending, ties to the lower group; NaN keys rank last, lowest group first, as the reference
// orders them).
struct GroupEnergyArgs {
  const void* pre;          // [tokens, groups * rows_per_group] storage dtype, contiguous: the gate pre-activation
  int64_t tokens;
  int64_t groups;           // NG
  int64_t rows_per_group;   // G, or spg with a subsample
  float estimate_scale;     // G / spg with a subsample, else 1
  const float* lb_bias;     // [NG] or nullptr
  int64_t top_groups;       // kg
  int32_t* groups_out;      // [tokens, kg], rows groups_stride elements apart
  int64_t groups_stride;
  int sm_count;             // the device's multiprocessors
  int shared_bytes_optin;   // the most dynamic shared memory one block may opt in to
};
void launch_group_energy_topk(Storage storage, const GroupEnergyArgs& args, cudaStream_t stream);

// counts[g] = how many entries of groups [tokens, kg] equal g (overwritten), without global atomics: each of
// kCountSlices blocks histograms a slice of tokens in shared memory into partials[slice, :], then one thread per
// group sums its column in slice order. Integer sums: the result is exact and order-independent anyway.
constexpr int64_t kCountSlices = 128;
struct GroupCountsArgs {
  const int32_t* groups;  // [tokens, kg], rows groups_stride elements apart; every entry in [0, NG)
  int64_t groups_stride;
  int64_t tokens;
  int64_t top_groups;     // kg
  int64_t num_groups;     // NG
  int32_t* partials;      // workspace [kCountSlices, NG]
  int32_t* counts;        // out [NG]
};
void launch_group_counts(const GroupCountsArgs& args, cudaStream_t stream);

// The most groups the energy kernel serves (a plan-time check): one warp's keys and picks fit in shared memory.
constexpr int64_t kMaxSelectGroups = 16384;

// docs/math.md section 7's load-balance update, in float64 exactly as the reference computes it, one thread per group.
struct LoadBalanceArgs {
  const void* counts;  // [NG] int32, int64 or fp32
  CountsType counts_type;
  float* ema;          // in/out [NG]
  float* bias;         // in/out [NG]
  int64_t groups;      // NG
  double tokens;
  int64_t top_groups;
  double momentum;
  double gamma;
  double bias_max;
};
void launch_load_balance_update(const LoadBalanceArgs& args, cudaStream_t stream);

}  // namespace sparse_ffn
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
