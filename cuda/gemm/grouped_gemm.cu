// The grouped GEMM's launches around the tile kernel: the varlen-M row-tile list built on the device from the
// offsets (no host sync), the tile kernel instantiation of the plan's GemmKernel, and DGATED's fixed-order sum of
// each row's per-column-tile dots into dscores.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/common/grid_dependency.cuh"
#include "cuda/gemm/grouped_gemm.h"
#include "cuda/gemm/grouped_gemm_wgmma.h"
#include "cuda/common/status_error.h"
#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

namespace {

constexpr int kListThreads = 1024;
constexpr int kLanes = 32;

// Group e's rows [lo, hi), the offsets clamped to the call's rows (so a bad offsets tensor cannot send a tile
// outside the operands).
__device__ __forceinline__ void group_rows(const int32_t* offsets, int64_t e, int64_t rows, int64_t& lo, int64_t& hi) {
  hi = min(max(static_cast<int64_t>(offsets[e + 1]), int64_t{0}), rows);
  lo = min(max(static_cast<int64_t>(offsets[e]), int64_t{0}), hi);
}

// One block: tile_starts[e] = sum over groups before e of ceil(rows_e / bm), a block scan over chunks of 1024
// groups; then one (group, first row, end row) entry per row tile, in group order. `pad_pairs`: an odd total gets one
// more, empty entry (the last group's, first row = end row), so that clusters of 2 take whole pairs of row tiles.
__global__ void __launch_bounds__(kListThreads) build_row_tiles_kernel(const int32_t* offsets, int64_t groups,
                                                                       int64_t rows, int64_t bm, bool pad_pairs,
                                                                       int64_t max_tiles,
                                                                       int32_t* tile_count, int32_t* tile_starts,
                                                                       int4* tile_list) {
  __shared__ int32_t warp_totals[kListThreads / kLanes];
  __shared__ int32_t carry;
  // The tile kernel after it is a programmatic dependent that waits for this kernel's end: its CTAs may start now.
  allow_next_grid();
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kLanes, warp = tid / kLanes;
  if (tid == 0) carry = 0;
  __syncthreads();
  for (int64_t chunk = 0; chunk < groups; chunk += kListThreads) {
    const int64_t e = chunk + tid;
    int32_t tiles = 0;
    if (e < groups) {
      int64_t lo, hi;
      group_rows(offsets, e, rows, lo, hi);
      tiles = static_cast<int32_t>((hi - lo + bm - 1) / bm);
    }
    int32_t inclusive = tiles;
#pragma unroll
    for (int d = 1; d < kLanes; d *= 2) {
      const int32_t other = __shfl_up_sync(0xffffffffu, inclusive, d);
      if (lane >= d) inclusive += other;
    }
    if (lane == kLanes - 1) warp_totals[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
      int32_t total = warp_totals[lane];
#pragma unroll
      for (int d = 1; d < kLanes; d *= 2) {
        const int32_t other = __shfl_up_sync(0xffffffffu, total, d);
        if (lane >= d) total += other;
      }
      warp_totals[lane] = total;
    }
    __syncthreads();
    const int32_t before = (warp > 0 ? warp_totals[warp - 1] : 0) + inclusive - tiles;
    if (e < groups) tile_starts[e] = carry + before;
    __syncthreads();
    if (tid == 0) carry += warp_totals[kListThreads / kLanes - 1];
    __syncthreads();
  }
  const int64_t total = min(static_cast<int64_t>(carry) + (pad_pairs ? carry % 2 : 0), max_tiles);
  if (tid == 0) {
    tile_starts[groups] = carry;
    *tile_count = static_cast<int32_t>(total);
  }
  __syncthreads();  // tile_starts is complete and visible to the whole block
  for (int64_t t = tid; t < total; t += kListThreads) {
    // The last group whose first tile is <= t (empty groups share their successor's start and are skipped).
    int64_t lo_e = 0, hi_e = groups - 1;
    while (lo_e < hi_e) {
      const int64_t mid = (lo_e + hi_e + 1) / 2;
      if (tile_starts[mid] <= t)
        lo_e = mid;
      else
        hi_e = mid - 1;
    }
    int64_t lo, hi;
    group_rows(offsets, lo_e, rows, lo, hi);
    const int64_t first = min(lo + (t - tile_starts[lo_e]) * bm, hi);  // the pad entry: empty, first = end
    tile_list[t] = make_int4(static_cast<int>(lo_e), static_cast<int>(first), static_cast<int>(hi), 0);
  }
}

// dscores[pair_idx[r]] = sum over 64-column chunks (ascending) of ds_partials[r, chunk], for every grouped row.
// A pair_idx entry outside [0, pairs) writes nothing.
__global__ void sum_row_dots_kernel(const int32_t* offsets, int64_t groups, int64_t rows, const float* partials,
                                    int64_t chunks, const int32_t* pair_idx, int64_t pairs, float* dscores) {
  const int64_t end = min(max(static_cast<int64_t>(offsets[groups]), int64_t{0}), rows);
  const int64_t begin = min(max(static_cast<int64_t>(offsets[0]), int64_t{0}), end);
  const int64_t r = begin + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= end) return;
  float sum = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) sum += partials[r * chunks + c];
  const int32_t pair = pair_idx[r];
  if (pair >= 0 && pair < pairs) dscores[pair] = sum;
}

using TileLauncher = void (*)(const GroupedGemmProblem&, cudaStream_t);

template <int32_t Dtype, GemmTile Tile>
TileLauncher launcher_for_operands(Operands op) {
  switch (op) {
    case Operands::varlen_m_nk: return launch_gemm_tiles<Dtype, Tile, Operands::varlen_m_nk>;
    case Operands::varlen_m_kn: return launch_gemm_tiles<Dtype, Tile, Operands::varlen_m_kn>;
    default: return launch_gemm_tiles<Dtype, Tile, Operands::varlen_k>;
  }
}

template <int32_t Dtype>
TileLauncher launcher_for_tile(GemmTile tile, Operands op) {
  return tile == GemmTile::m128_n256 ? launcher_for_operands<Dtype, GemmTile::m128_n256>(op)
                                     : launcher_for_operands<Dtype, GemmTile::m128_n128>(op);
}

// The sm_90a path: the TMA maps (built here on the host, per call: operands move between calls) of the weight
// operand, of an A that is not gathered and of DGATED's h for varlen M, of the operand that is not gathered for
// varlen K, of C where the epilogue writes it by TMA, and the persistent kernel, one CTA per SM at most.
template <int32_t Dtype, GemmTile Tile, GemmSchedule Schedule>
void launch_wgmma_operands(const GroupedGemmProblem& p, const WgmmaOperandMaps& maps, int sm_count, bool paired,
                           cudaStream_t stream) {
  if constexpr (Schedule == GemmSchedule::cooperative) {
    if (p.mode == MOEKIT_GEMM_VARLEN_K) {
      launch_wgmma_tiles<Dtype, Tile, Operands::varlen_k>(p, maps, sm_count, paired, stream);
      return;
    }
  }
  if (p.b_layout == MOEKIT_GEMM_B_KN && p.epilogue == MOEKIT_EPILOGUE_DGATED)
    launch_wgmma_tiles<Dtype, Tile, Operands::varlen_m_kn, true, Schedule>(p, maps, sm_count, paired, stream);
  else if (p.b_layout == MOEKIT_GEMM_B_KN)
    launch_wgmma_tiles<Dtype, Tile, Operands::varlen_m_kn, false, Schedule>(p, maps, sm_count, paired, stream);
  else if (p.epilogue == MOEKIT_EPILOGUE_GATED)
    launch_wgmma_tiles<Dtype, Tile, Operands::varlen_m_nk, true, Schedule>(p, maps, sm_count, paired, stream);
  else
    launch_wgmma_tiles<Dtype, Tile, Operands::varlen_m_nk, false, Schedule>(p, maps, sm_count, paired, stream);
}

template <GemmTile Tile, GemmSchedule Schedule>
void launch_wgmma_dtype(const GroupedGemmProblem& p, const WgmmaOperandMaps& maps, int sm_count, bool paired,
                        cudaStream_t stream) {
  if (p.dtype == MOEKIT_DTYPE_BF16)
    launch_wgmma_operands<MOEKIT_DTYPE_BF16, Tile, Schedule>(p, maps, sm_count, paired, stream);
  else
    launch_wgmma_operands<MOEKIT_DTYPE_FP16, Tile, Schedule>(p, maps, sm_count, paired, stream);
}

void launch_wgmma(const GroupedGemmProblem& caller, const GemmKernel& kernel, cudaStream_t stream) {
  const GemmTileShape shape = gemm_tile_shape(kernel.tile);
  // A transposed varlen K runs C^T = B^T A; C's map stays the caller's.
  const GroupedGemmProblem p = kernel.transposed ? transpose_weight_gradient(caller, shape.bn) : caller;
  WgmmaOperandMaps maps{};
  if (p.mode == MOEKIT_GEMM_VARLEN_M) {
    // NK: boxes of half a tile's columns; KN: boxes of one 64-deep slice's rows.
    const int box_rows = p.b_layout == MOEKIT_GEMM_B_KN ? 64 : static_cast<int>(shape.bn / 2);
    maps.b = make_weight_tensor_map(p, box_rows);
    // A and h: boxes of a whole row tile.
    const int row_tile = static_cast<int>(shape.bm);
    if (kernel.a == OperandMove::tma) maps.a = make_activation_tensor_map(p, row_tile);
    if (kernel.epilogue == OperandMove::tma) maps.h = make_dgated_h_tensor_map(p, row_tile);
  } else if (p.rows > 0) {
    maps.b = make_reduction_rows_tensor_map(p);
  }
  maps.c_by_tma = kernel.c != OutputMove::threads;
  if (maps.c_by_tma) maps.c = make_output_tensor_map(caller);
  if (maps.c_by_tma && p.epilogue == MOEKIT_EPILOGUE_GATED) maps.act = make_gated_act_tensor_map(p);
  const bool paired = kernel.cluster == 2;
  // Ping-pong: varlen M at 128x128 (choose_gemm_config).
  if (kernel.schedule == GemmSchedule::pingpong)
    launch_wgmma_dtype<GemmTile::m128_n128, GemmSchedule::pingpong>(p, maps, kernel.ctas, paired, stream);
  else if (kernel.tile == GemmTile::m128_n256)
    launch_wgmma_dtype<GemmTile::m128_n256, GemmSchedule::cooperative>(p, maps, kernel.ctas, paired, stream);
  else
    launch_wgmma_dtype<GemmTile::m128_n128, GemmSchedule::cooperative>(p, maps, kernel.ctas, paired, stream);
}

}  // namespace

void run_grouped_gemm(GroupedGemmProblem p, const GemmKernel& kernel, const GemmWorkspaceLayout& layout,
                      void* workspace, cudaStream_t stream) {
  const bool varlen_m = p.mode == MOEKIT_GEMM_VARLEN_M;
  // No grouped rows: varlen M has nothing to read or write (varlen K still writes C = beta C).
  if (varlen_m && p.rows == 0) return;
  auto* base = static_cast<unsigned char*>(workspace);
  p.m_tiles = layout.m_tiles;
  p.n_tiles = layout.n_tiles;
  p.ds_chunks = layout.ds_chunks;
  if (varlen_m) {
    p.tile_count = reinterpret_cast<int32_t*>(base + layout.tile_count);
    p.tile_starts = reinterpret_cast<int32_t*>(base + layout.tile_starts);
    p.tile_list = reinterpret_cast<int32_t*>(base + layout.tile_list);
    if (p.epilogue == MOEKIT_EPILOGUE_DGATED) p.ds_partials = reinterpret_cast<float*>(base + layout.ds_partials);
    build_row_tiles_kernel<<<1, kListThreads, 0, stream>>>(p.offsets, p.groups, p.rows, gemm_tile_shape(kernel.tile).bm,
                                                           kernel.pad_tile_pairs, p.m_tiles, p.tile_count,
                                                           p.tile_starts, reinterpret_cast<int4*>(p.tile_list));
    check_launch("grouped GEMM: row tile list");
  }
  if (kernel.path == GemmPath::wgmma) {
    launch_wgmma(p, kernel, stream);
  } else {
    const Operands op = !varlen_m                        ? Operands::varlen_k
                        : p.b_layout == MOEKIT_GEMM_B_NK ? Operands::varlen_m_nk
                                                         : Operands::varlen_m_kn;
    const TileLauncher launch = p.dtype == MOEKIT_DTYPE_BF16 ? launcher_for_tile<MOEKIT_DTYPE_BF16>(kernel.tile, op)
                                                             : launcher_for_tile<MOEKIT_DTYPE_FP16>(kernel.tile, op);
    launch(p, stream);
  }
  if (varlen_m && p.epilogue == MOEKIT_EPILOGUE_DGATED && p.rows > 0) {
    constexpr int threads = 256;
    const auto blocks = static_cast<unsigned>((p.rows + threads - 1) / threads);
    sum_row_dots_kernel<<<blocks, threads, 0, stream>>>(p.offsets, p.groups, p.rows, p.ds_partials, p.ds_chunks,
                                                        p.pair_idx, p.pairs, p.dscores);
    check_launch("grouped GEMM: row dots");
  }
}

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
