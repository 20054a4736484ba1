// The wgmma grouped GEMM's persistent tile walk (grouped_gemm_wgmma_kernel.cuh): which tiles there are (varlen M:
// row tile of the device-built tile list x column tile, row-tile major so a wave shares the weight tiles of few
// experts in L2; varlen K: group x m tile x n tile, group major), which of them a CTA takes (one unit per step of the
// grid; paired CTAs one row tile each of a pair), and the reduction slices of a tile. The producer and the consumers
// walk the same tiles in the same order.
#pragma once

#include <cstdint>

#include "cuda/gemm/gemm_tile_parts.cuh"
#include "cuda/gemm/grouped_gemm.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

// The producer's and consumers' shared view of tile `tile` of the persistent walk.
struct WgmmaTile {
  int64_t group;
  int64_t row_begin, row_end;  // the group's grouped rows: varlen M the tile's output rows, varlen K its reduction
  int64_t m0, m_end;           // output rows: varlen M row_begin and row_end; varlen K the m tile's first, and m
  int64_t n_tile;
};

template <bool varlen_k, int BM>
__device__ __forceinline__ WgmmaTile wgmma_tile_at(const GroupedGemmProblem& p, int64_t tile) {
  if constexpr (varlen_k) {
    // NOTE: 32-bit division: tile counts are far below 2^31, and a 64-bit one costs registers next to the
    // accumulators.
    const auto m_tiles = static_cast<int32_t>((p.m + BM - 1) / BM), n_tiles = static_cast<int32_t>(p.n_tiles);
    const int32_t per_group = m_tiles * n_tiles, index = static_cast<int32_t>(tile);
    const int32_t group = index / per_group, in_group = index % per_group;
    const int64_t end = min(max(static_cast<int64_t>(p.offsets[group + 1]), int64_t{0}), p.rows);
    const int64_t begin = min(max(static_cast<int64_t>(p.offsets[group]), int64_t{0}), end);
    return WgmmaTile{group, begin, end, static_cast<int64_t>(in_group / n_tiles) * BM, p.m, in_group % n_tiles};
  } else {
    const int4 info = reinterpret_cast<const int4*>(p.tile_list)[tile / p.n_tiles];
    return WgmmaTile{info.x, info.y, info.z, info.y, info.z, tile % p.n_tiles};
  }
}

// The number of tiles the persistent walk covers.
template <bool varlen_k, int BM>
__device__ __forceinline__ int64_t wgmma_tile_count(const GroupedGemmProblem& p) {
  if constexpr (varlen_k) return varlen_k_tile_count(p, BM);
  return static_cast<int64_t>(*p.tile_count) * p.n_tiles;
}

// A CTA's walk: unit u is tile u, or (paired) the row tile pair u / n_tiles at column tile u % n_tiles, of which this
// CTA takes row tile 2 (u / n_tiles) + rank (varlen K: row tile g m_tiles + i is m tile i of group g). Both CTAs
// of a cluster walk the same units: first_unit, first_unit + unit_step, ... below units.
template <bool varlen_k, int BM, int BK>
struct WgmmaTileWalk {
  const GroupedGemmProblem& p;
  bool paired;
  uint32_t rank;
  int64_t units, first_unit, unit_step;

  __device__ __forceinline__ WgmmaTileWalk(const GroupedGemmProblem& problem, bool paired_ctas, uint32_t cta_rank)
      : p(problem), paired(paired_ctas), rank(cta_rank) {
    const int64_t tiles = wgmma_tile_count<varlen_k, BM>(p);
    units = paired ? tiles / 2 : tiles;
    first_unit = paired ? blockIdx.x / 2 : blockIdx.x;
    unit_step = paired ? gridDim.x / 2 : gridDim.x;
  }

  // Paired: the row tile of unit u that the CTA of rank r takes.
  __device__ __forceinline__ int64_t pair_row_tile(int64_t u, uint32_t r) const { return 2 * (u / p.n_tiles) + r; }

  __device__ __forceinline__ int64_t tile_of_unit(int64_t u) const {
    return paired ? pair_row_tile(u, rank) * p.n_tiles + u % p.n_tiles : u;
  }

  // This CTA's tile of unit u.
  __device__ __forceinline__ WgmmaTile tile(int64_t u) const { return wgmma_tile_at<varlen_k, BM>(p, tile_of_unit(u)); }

  // Paired (varlen M): the group of the peer CTA's row tile of unit u.
  __device__ __forceinline__ int64_t peer_group(int64_t u) const {
    return reinterpret_cast<const int4*>(p.tile_list)[pair_row_tile(u, rank ^ 1)].x;
  }

  // Reduction slices of a tile: varlen M the whole k; varlen K the group's rows (none for an empty group).
  __device__ __forceinline__ int64_t slices(const WgmmaTile& t) const {
    return varlen_k ? (t.row_end - t.row_begin + BK - 1) / BK : (p.k + BK - 1) / BK;
  }
};

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
