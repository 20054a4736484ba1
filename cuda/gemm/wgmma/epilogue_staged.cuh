// The wgmma grouped GEMM's epilogue by the consumer threads (grouped_gemm_wgmma_kernel.cuh): every product the TMA
// stores do not take goes through a per-warpgroup fp32 staging chunk of 64 x 64 in shared memory, one 64-column
// chunk at a time, to the shared epilogues of gemm_tile_parts.cuh, 8 values of one row per thread (STORE, BIAS,
// GATED: store_tile_by_threads; DGATED, epilogue_dgated.cuh, stages the same way).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/activation.cuh"
#include "cuda/gemm/gemm_tile_parts.cuh"
#include "cuda/gemm/grouped_gemm.h"
#include "cuda/gemm/wgmma/pipeline.cuh"
#include "cuda/gemm/wgmma/tile_config.cuh"
#include "cuda/gemm/wgmma/tile_scheduler.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

// Copies a consumer's accumulators of epilogue chunk `chunk` into its staging rows [64][pitch]. Plain products
// stage product columns 64 chunk..+63 as they are; a gated activation stages gate values in columns [0, 32) and
// up values in [32, 64) for activation columns 32 chunk..+31 of the tile (CONCAT: product columns 32 chunk.. and
// BN/2 + 32 chunk..; INTERLEAVED: product columns 64 chunk.. alternate gate, up).
template <class Cfg>
__device__ __forceinline__ void stage_chunk(const float (&acc)[Cfg::bn / 2], int chunk, bool split_glu,
                                            bool interleaved, float* staging, int wg_tid) {
  constexpr int pitch = Cfg::staging_pitch;
  const int warp = wg_tid / 32, lane = wg_tid % 32;
  const int quad_col = 2 * (lane % 4);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float* line = staging + (16 * warp + lane / 4 + 8 * half) * pitch;
    if (split_glu && !interleaved) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int gate_block = 4 * chunk + i, up_block = Cfg::bn / 16 + 4 * chunk + i;
        *reinterpret_cast<float2*>(line + 8 * i + quad_col) =
            make_float2(acc[4 * gate_block + 2 * half], acc[4 * gate_block + 2 * half + 1]);
        *reinterpret_cast<float2*>(line + 32 + 8 * i + quad_col) =
            make_float2(acc[4 * up_block + 2 * half], acc[4 * up_block + 2 * half + 1]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int block = 8 * chunk + i;
        const float v0 = acc[4 * block + 2 * half], v1 = acc[4 * block + 2 * half + 1];
        if (split_glu) {
          line[(8 * i + quad_col) / 2] = v0;
          line[32 + (8 * i + quad_col) / 2] = v1;
        } else {
          *reinterpret_cast<float2*>(line + 8 * i + quad_col) = make_float2(v0, v1);
        }
      }
    }
  }
}

// stage_chunk of row block `block` of the accumulators (N: one block's, or every block's) for a block and chunk that
// may be known at run time only (DGATED's chunk loop is not unrolled, for the instruction cache): the accumulators
// need compile-time indices, so each chunk's staging code is selected here.
template <class Cfg, int N>
__device__ __forceinline__ void stage_chunk_at(const float (&acc)[N], int block, int chunk, bool split_glu,
                                               bool interleaved, float* staging, int wg_tid) {
#pragma unroll
  for (int b = 0; b < N / (Cfg::bn / 2); ++b)
#pragma unroll
    for (int c = 0; c < Cfg::bn / Cfg::chunk_columns; ++c)
      if (b == block && c == chunk)
        stage_chunk<Cfg>(row_block_accumulators<Cfg>(acc, b), c, split_glu, interleaved, staging, wg_tid);
}

// One chunk's products into consumer `consumer`'s staging rows, read once every thread of the consumer has written
// its part.
template <class Cfg, int N>
__device__ __forceinline__ void stage_chunk_synced(const float (&acc)[N], int block, int chunk, bool split_glu,
                                                   bool interleaved, float* staging, int consumer, int wg_tid) {
  consumer_barrier_sync(consumer);  // the previous chunk's staging reads are done
  stage_chunk_at<Cfg>(acc, block, chunk, split_glu, interleaved, staging, wg_tid);
  consumer_barrier_sync(consumer);
}

// STORE, BIAS and GATED (gated: the GATED instantiation; split_glu: its activation is gated) by the threads, 64 rows
// of tile t from `first_row`, a consumer's (acc their accumulators): 64-column chunks through the staging rows, each thread 8 values of
// one row (a gated activation: 8 gate and 8 up values, 4 threads to a row).
template <class T, class Cfg, bool varlen_k, bool gated>
__device__ __forceinline__ void store_tile_by_threads(const GroupedGemmProblem& p, const DeviceActivation& act,
                                                      const float (&acc)[Cfg::bn / 2], float* staging,
                                                      const WgmmaTile& t, int64_t first_row, bool split_glu,
                                                      bool interleaved, int consumer, int wg_tid) {
  constexpr int BN = Cfg::bn;
  const int64_t n0 = t.n_tile * BN;
  const int items_per_row = split_glu ? 4 : 8;
  const int rows_per_pass = 128 / items_per_row;
  const int item = wg_tid % items_per_row;
  // Unrolled over the chunks (rolled, these lighter epilogues ran 0.8-0.99x). GATED with alpha = 1 and no bias
  // (the layer's up-projection) has its own copy without the scaling and the bias.
  const auto chunks = [&](auto scaled) {
    constexpr bool Scaled = decltype(scaled)::value;
#pragma unroll
    for (int chunk = 0; chunk < BN / Cfg::chunk_columns; ++chunk) {
      stage_chunk_synced<Cfg>(acc, 0, chunk, split_glu, interleaved, staging, consumer, wg_tid);
#pragma unroll 1
      for (int row = wg_tid / items_per_row; row < 64; row += rows_per_pass) {
        const int64_t r = first_row + row;
        if (r >= t.m_end) break;
        const float* line = staging + row * Cfg::staging_pitch;
        if (split_glu) {
          const int64_t j = n0 / 2 + 32 * chunk + 8 * item;
          if (j < p.act_width)
            epilogue_gated_glu<T, Scaled>(p, act, line + 8 * item, line + 32 + 8 * item, t.group, r, j);
        } else {
          const int64_t col = n0 + Cfg::chunk_columns * chunk + 8 * item;
          if (col >= p.n) continue;
          // varlen K: r is C's row m of group t.group.
          const int64_t c_offset = varlen_k ? t.group * p.c_group_stride + r * p.ldc + col : r * p.ldc + col;
          if (gated)
            epilogue_gated_plain<T, Scaled>(p, act, line + 8 * item, t.group, r, col);
          else
            epilogue_store<T>(p, line + 8 * item, t.group, c_offset, col);
        }
      }
    }
  };
  if constexpr (gated) {
    if (p.alpha == 1.0f && p.bias == nullptr) {
      chunks(std::false_type{});
      return;
    }
  }
  chunks(std::true_type{});
}

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
