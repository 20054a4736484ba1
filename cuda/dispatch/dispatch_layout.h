// How the CUDA dispatch (docs/math.md section 2) cuts the pairs into chunks, and where its workspace sections lie.
// One pure function gives both the workspace size (plan_sizes) and the layout the launcher uses, so they cannot
// disagree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/common/alignment.h"
#include "cuda/common/status_error.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

struct DispatchLayout {
  int warps;                    // warps per block of the count and scatter kernels
  int64_t chunk_pairs;          // pairs per block: warps * 32 lanes * kDispatchItemsPerLane
  int64_t max_chunks;           // blocks for max_pairs pairs (at least 1: expert_offsets is written even for P = 0)
  size_t counts_offset;         // [max_chunks, E] int32: pairs of chunk c routed to expert e, then their prefix over c
  size_t totals_offset;         // [E] int32: pairs routed to expert e
  size_t workspace_bytes;
  size_t scatter_shared_bytes;  // dynamic shared memory of the scatter kernel
  size_t count_shared_bytes;    // dynamic shared memory of the count kernel
};

// Pairs each lane of the scatter kernel ranks; a warp therefore owns 32 * 8 = 256 consecutive pairs of its chunk.
constexpr int kDispatchItemsPerLane = 8;
// The scatter kernel's per-warp counters are 16 bits: a chunk must hold at most 65535 pairs.
constexpr int kDispatchMaxWarps = 8;
// NOTE: the opt-in shared memory of one block on every sm_90 part (H100, H200, H20): 227 KiB.
constexpr size_t kDispatchSharedBudget = 227 * 1024;

// Shared memory of the scatter kernel: expert bases [E] int32, 32 warp sums int32, per-warp counters [warps, E] u16.
inline size_t dispatch_scatter_shared_bytes(int64_t experts, int warps) {
  return static_cast<size_t>(experts) * 4 + 32 * 4 + static_cast<size_t>(warps) * static_cast<size_t>(experts) * 2;
}

// Throws NOT_SUPPORTED when even one warp's counters do not fit in shared memory (E beyond ~38000).
inline DispatchLayout dispatch_layout(int64_t experts, int64_t max_pairs) {
  DispatchLayout l{};
  l.warps = kDispatchMaxWarps;
  // Fewer warps per block for very many experts: each warp keeps one 16-bit counter per expert.
  while (l.warps > 0 && dispatch_scatter_shared_bytes(experts, l.warps) > kDispatchSharedBudget) l.warps /= 2;
  if (l.warps == 0)
    throw_not_supported("experts: the CUDA dispatch keeps a counter per local expert in shared memory; " +
                        std::to_string(experts) + " experts do not fit in " +
                        std::to_string(kDispatchSharedBudget) + " bytes");
  l.chunk_pairs = static_cast<int64_t>(l.warps) * 32 * kDispatchItemsPerLane;
  l.max_chunks = max_pairs > 0 ? (max_pairs + l.chunk_pairs - 1) / l.chunk_pairs : 1;
  l.counts_offset = 0;
  l.totals_offset = align_to_sections(static_cast<size_t>(l.max_chunks) * static_cast<size_t>(experts) * 4);
  l.workspace_bytes = l.totals_offset + align_to_sections(static_cast<size_t>(experts) * 4);
  l.scatter_shared_bytes = dispatch_scatter_shared_bytes(experts, l.warps);
  l.count_shared_bytes = static_cast<size_t>(experts) * 4;
  return l;
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
