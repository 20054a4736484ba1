// The wgmma grouped GEMM's DGATED epilogue (grouped_gemm_wgmma_kernel.cuh, the DGATED instantiation), by the
// consumer threads: per 64-column chunk, a consumer's product dA through its staging rows (epilogue_staged.cuh) and
// h's values from the ring entry the producer loaded for the chunk (load_dgated_h) into gemm_tile_parts.cuh's
// epilogue_dgated_from_h (dh and a' stored), and each row's dA . a summed into the score gradient's partials.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/activation.cuh"
#include "cuda/gemm/gemm_tile_parts.cuh"
#include "cuda/gemm/grouped_gemm.h"
#include "cuda/gemm/wgmma/epilogue_staged.cuh"
#include "cuda/gemm/wgmma/pipeline.cuh"
#include "cuda/gemm/wgmma/tile_config.cuh"
#include "cuda/gemm/wgmma/tile_scheduler.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

// Value i of a register array for an index known at run time only (a dynamic index would put the array in local
// memory).
template <int N>
__device__ __forceinline__ float pick(const float (&values)[N], int i) {
  float value = values[0];
#pragma unroll
  for (int j = 1; j < N; ++j) value = i == j ? values[j] : value;
  return value;
}

// h's values of activation columns 8 item..+7 of tile row `row` from the two boxes of a DGATED epilogue entry (their
// generic addresses), as load_glu8 / load8 read them from global memory.
template <class T>
__device__ __forceinline__ void load_h_from_boxes(const unsigned char* box0, const unsigned char* box1, int row,
                                                  int item, bool gated, bool interleaved, float (&g)[8],
                                                  float (&u)[8]) {
  const auto at = [&](const unsigned char* box, int chunk) {
    return reinterpret_cast<const T*>(box + kmajor_offset(row, chunk));
  };
  if (!gated) {
    load8(at(box0, item), g);
  } else if (!interleaved) {
    load8(at(box0, item), g);
    load8(at(box1, item), u);
  } else {
    // Activation columns 8 item.. are h columns 16 item.. of the chunk's 128: box item / 4, chunks 2 (item % 4)..
    const unsigned char* box = item < 4 ? box0 : box1;
    float lo[8], hi[8];
    load8(at(box, 2 * (item % 4)), lo);
    load8(at(box, 2 * (item % 4) + 1), hi);
    split_interleaved(lo, hi, g, u);
  }
}

// DGATED: the score scales of this thread's rows of a consumer's row blocks (rows wg_tid / 8 + 16 pass of block b
// at row_scales[4 b + pass]; cooperative: the block from `first_row`, ping-pong: the tile's two), once per tile; rows
// past the group keep 0.
template <class Cfg>
__device__ __forceinline__ void load_dgated_row_scales(const GroupedGemmProblem& p, const WgmmaTile& t,
                                                       int64_t first_row, int wg_tid,
                                                       float (&row_scales)[Cfg::row_blocks * 64 / 16]) {
#pragma unroll
  for (int block = 0; block < Cfg::row_blocks; ++block)
#pragma unroll
    for (int pass = 0; pass < 64 / 16; ++pass) {
      const int64_t r = first_row + 64 * block + wg_tid / 8 + 16 * pass;
      if (r < t.m_end) row_scales[4 * block + pass] = pair_scale(p, r);
    }
}

// DGATED's chunk loop, a consumer's rows of tile t after its main loop (cooperative: 64 rows from `first_row`;
// ping-pong: both 64-row blocks from it), thread `item` (of 8) of each of its rows: `it` is the consumer's place in
// the ring, at the tile's first h entry, and each chunk's entry is released once every row block has read it. Per
// chunk and row block the 8 lanes of a row sum their dA . a by a fixed butterfly and the first stores it as the row's
// partial of that 64-column chunk (sum_row_dots_kernel adds the chunks in order, so the score gradient does not
// depend on the tile or the schedule); row_scales holds the rows' score scales (load_dgated_row_scales).
// SwigluConcat: the MoE layer's DGATED (SwiGLU, CONCAT, alpha = 1).
// NOTE: neither the chunks, the row blocks nor the row passes are unrolled: unrolled, the copies of DGATED's
// activation code overflowed the instruction cache (ncu: 70% of the epilogue's stalls were no_inst; x1.22-1.38
// rolled). The MoE layer's DGATED has its own copy of the loop that branches on none of them: this epilogue is
// issue-bound (~10 us per cooperative 128x256 tile, the SMs' warps idle under it but two per scheduler).
template <class T, class Cfg, bool SwigluConcat>
__device__ __forceinline__ void dgated_chunks(const GroupedGemmProblem& p, const DeviceActivation& act,
                                              const float (&acc)[Cfg::accumulators], float* staging,
                                              const unsigned char* shared, uint32_t smem, uint32_t smem_a,
                                              uint32_t smem_b, const PipelineBarriers<Cfg::stages>& ring,
                                              PipelineState<Cfg::stages>& it, bool paired, const WgmmaTile& t,
                                              int64_t first_row, bool interleaved, int item, int consumer,
                                              int wg_tid, const float (&row_scales)[Cfg::row_blocks * 64 / 16]) {
  const int64_t n0 = t.n_tile * Cfg::bn;
  // The rows of the first block within the h boxes (which hold the tile's 128).
  const int box_row0 = static_cast<int>(first_row - t.m0);
#pragma unroll 1
  for (int chunk = 0; chunk < Cfg::bn / Cfg::chunk_columns; ++chunk) {
    const uint32_t slot = it.index();
#pragma unroll 1
    for (int block = 0; block < Cfg::row_blocks; ++block) {
      stage_chunk_synced<Cfg>(acc, block, chunk, false, interleaved, staging, consumer, wg_tid);
      // The chunk's h values: the ring entry the producer loaded after the tile's slices (load_dgated_h).
      // NOTE: the wait spelt out, the barrier's address formed before the parity: through
      // PipelineBarriers::wait_full, which forms them the other way round, this loop compiled to other machine code.
      if (block == 0) mbarrier_wait(ring.full(slot), it.phase());
      const unsigned char* box0 = shared + (dgated_h_box<Cfg>(smem_a, smem_b, slot, 0) - smem);
      const unsigned char* box1 = shared + (dgated_h_box<Cfg>(smem_a, smem_b, slot, 1) - smem);
      // Every lane takes part in the shuffles, rows past the group included.
#pragma unroll 1
      for (int pass = 0; pass < 64 / 16; ++pass) {
        const int row = 64 * block + wg_tid / 8 + 16 * pass;
        const int64_t r = first_row + row, j = n0 + Cfg::chunk_columns * chunk + 8 * item;
        float dot = 0.0f;
        if (r < t.m_end && j < p.n) {
          float g[8], u[8];
          load_h_from_boxes<T>(box0, box1, box_row0 + row, item, SwigluConcat || is_gated_activation(act.kind),
                               !SwigluConcat && interleaved, g, u);
          dot = epilogue_dgated_from_h<T, SwigluConcat>(p, act, staging + (row % 64) * Cfg::staging_pitch + 8 * item,
                                                        g, u, r, j, pick(row_scales, 4 * block + pass));
        }
#pragma unroll
        for (int offset = 4; offset >= 1; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        if (item == 0 && r < t.m_end && j < p.n) p.ds_partials[r * p.ds_chunks + j / Cfg::chunk_columns] = dot;
      }
    }
    ring.release(slot, paired, wg_tid);
    it.advance();
  }
}

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
