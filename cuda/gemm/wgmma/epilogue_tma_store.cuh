// The wgmma grouped GEMM's epilogues by TMA store (grouped_gemm_wgmma_kernel.cuh; WgmmaOperandMaps::c_by_tma): a
// consumer puts its accumulators, scaled and rounded, into 64-row x 128-byte boxes in the 128-byte swizzle inside
// its staging rows (two buffers taking turns), and its first thread issues the TMA store, which completes in the
// background while the consumers go on. STORE of the operand dtype (store_tile_by_tma<T>), fp32 reduce-add into C
// with beta = 1 (store_tile_by_tma<float>), and varlen K's transposed C (store_tile_transposed_by_tma); the pieces
// here are also those of the deferred (epilogue_deferred_store.cuh) and gated (epilogue_gated.cuh) TMA epilogues.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/common/cp_async.cuh"
#include "cuda/common/mbarrier.cuh"
#include "cuda/common/st_shared.cuh"
#include "cuda/common/stmatrix.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/gemm/gemm_tile_parts.cuh"
#include "cuda/gemm/wgmma/pipeline.cuh"
#include "cuda/gemm/wgmma/tile_scheduler.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

// The byte offset, inside a 64-row x 128-byte box in the 128-byte swizzle, of the first of this consumer thread's
// accumulator values of an 8-column block, `value_bytes` each (a box holds 128 / value_bytes columns). The thread's
// accumulator rows are 16 warp + lane / 4 (+ 8: 1024 bytes on). Its 2 values of 8-column block i of a box sit at
// byte value_bytes (8 i + 2 (lane % 4)) of the row: 16-byte chunk (value_bytes / 2) i plus the lane's part, whose
// bits the block's part leaves alone, so block i's address is this offset XOR the block's chunk << 4 (kmajor_offset's
// swizzle only flips bits 4..6).
template <int value_bytes>
__device__ __forceinline__ uint32_t accumulator_box_offset(int wg_tid) {
  const int warp = wg_tid / 32, lane = wg_tid % 32;
  const int lane_byte = 2 * value_bytes * (lane % 4);
  return kmajor_offset(16 * warp + lane / 4, lane_byte / 16) + lane_byte % 16;
}

// Puts a consumer thread's 16 words of one box of 16-bit values into the box at shared address `buffer_address`
// (`lane_offset`: accumulator_box_offset<2>): word(i, half) is value pair `half` of the box's 8-column block i.
template <class Word>
__device__ __forceinline__ void put_box_words(uint32_t buffer_address, uint32_t lane_offset, Word&& word) {
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      store_shared_flipped(buffer_address + lane_offset + 8 * 128 * half, static_cast<uint32_t>(i) << 4, word(i, half));
}

// Value pair `half` (rows lane / 4 + 8 half) of 8-column block `block` of a consumer's accumulators, times alpha,
// rounded to the 16-bit Out: the 32-bit word a TMA-store epilogue puts in its box.
template <class Out, int N>
__device__ __forceinline__ uint32_t scaled_word(const float (&acc)[N], int block, int half, float alpha) {
  return round_pair<Out>(acc[4 * block + 2 * half] * alpha, acc[4 * block + 2 * half + 1] * alpha);
}

// Box `box` of a consumer's epilogue by TMA: one of the consumer's two 8 KiB buffers (`buffers`, box % 2) is
// rewritten once the store of two boxes before has read it; every thread puts its values in (fill(buffer's shared
// address)), and the first thread issues the store (store(address)), which completes in the background while the
// consumer goes on.
template <class Fill, class Store>
__device__ __forceinline__ void epilogue_box_by_tma(unsigned char* buffers, int box, int consumer, int wg_tid,
                                                    Fill&& fill, Store&& store) {
  const uint32_t buffer_address = shared_address(buffers + (box % 2) * (64 * 128));
  if (wg_tid == 0) bulk_wait_group_read<1>();
  consumer_barrier_sync(consumer);
  fill(buffer_address);
  // The box was written through the generic proxy; the TMA store reads it through the async proxy.
  fence_proxy_async_shared();
  consumer_barrier_sync(consumer);
  if (wg_tid == 0) {
    store(buffer_address);
    bulk_commit_group();
  }
}

// STORE with C written by TMA (maps.c_by_tma), rows 64 row_block..+63 of tile t, a consumer's (acc their
// accumulators; varlen M: rows wholly inside the tile's group, C [rows, n] as (n, rows, 1); varlen K: C[e] [m, n] as
// (n, m, E)). Out = T (beta = 0, C in the operand dtype): the values alpha product, rounded to T as epilogue_store
// rounds them, are stored. Out = float (beta = 1, fp32 C): the fp32 values alpha product are added to C by TMA reduce-adds, which add
// each element once in L2 (C + alpha product, the sum epilogue_store forms) with no read of C through the SM. One
// box (epilogue_box_by_tma) per 64 rows x 128 bytes (64 T or 32 fp32 columns); TMA writes nothing outside C.
template <class Out, class Cfg>
__device__ __forceinline__ void store_tile_by_tma(const GroupedGemmProblem& p, const CUtensorMap* map,
                                                  const float (&acc)[Cfg::bn / 2], unsigned char* buffers,
                                                  const WgmmaTile& t, int row_block, int consumer, int wg_tid) {
  constexpr bool add = sizeof(Out) == 4;
  constexpr int BN = Cfg::bn, box_columns = 128 / sizeof(Out), box_blocks = box_columns / 8;
  const int64_t n0 = t.n_tile * BN;
  const auto y = static_cast<int32_t>(t.m0 + 64 * row_block);
  const auto z = static_cast<int32_t>(p.mode == MOEKIT_GEMM_VARLEN_K ? t.group : 0);
  const uint32_t lane_offset = accumulator_box_offset<sizeof(Out)>(wg_tid);
#pragma unroll
  for (int box = 0; box < BN / box_columns; ++box) {
    const int64_t box_column = n0 + box_columns * box;
    if (box_column >= p.n) break;
    const auto fill = [&](uint32_t buffer_address) {
      if constexpr (add) {
#pragma unroll
        for (int i = 0; i < box_blocks; ++i) {
          const int block = box_blocks * box + i;
          const uint32_t flip = static_cast<uint32_t>(2 * i) << 4;
#pragma unroll
          for (int half = 0; half < 2; ++half)
            store_shared_flipped_pair(buffer_address + lane_offset + 8 * 128 * half, flip,
                                      __float_as_uint(acc[4 * block + 2 * half] * p.alpha),
                                      __float_as_uint(acc[4 * block + 2 * half + 1] * p.alpha));
        }
      } else {
        put_box_words(buffer_address, lane_offset,
                      [&](int i, int half) { return scaled_word<Out>(acc, box_blocks * box + i, half, p.alpha); });
      }
    };
    const auto store = [&](uint32_t buffer_address) {
      if constexpr (add)
        tma_reduce_add_3d(map, buffer_address, static_cast<int32_t>(box_column), y, z);
      else
        tma_store_3d(map, buffer_address, static_cast<int32_t>(box_column), y, z);
    };
    epilogue_box_by_tma(buffers, box, consumer, wg_tid, fill, store);
  }
}

// varlen K run as its transpose (p.c_transposed: the tile's rows are C's columns, its columns C's rows), one
// consumer's 64 rows alpha product, rounded to T as store_tile_by_tma rounds them: per 64 tile columns one box
// (epilogue_box_by_tma) of 64 C rows x the consumer's 64 C columns, each warp's 16 rows x 64 columns put in by four
// transposing stmatrix: x4 store q takes column blocks 2q and 2q + 1 of the box, upper and lower 8 rows of each, and
// lane l addresses row l % 8 (a tile column) of its matrix l / 8, whose 8 values (tile rows) are the 16-byte chunk
// 2 warp + (row half) of that box row. TMA writes nothing outside C.
template <class T, class Cfg>
__device__ __forceinline__ void store_tile_transposed_by_tma(const GroupedGemmProblem& p, const CUtensorMap* map,
                                                             const float (&acc)[Cfg::bn / 2], unsigned char* buffers,
                                                             const WgmmaTile& t, int consumer, int wg_tid) {
  const int64_t n0 = t.n_tile * Cfg::bn;
  const auto x = static_cast<int32_t>(t.m0 + 64 * consumer);
  const auto z = static_cast<int32_t>(t.group);
  const int warp = wg_tid / 32, lane = wg_tid % 32;
  const int matrix = lane / 8, half = matrix % 2;
  const auto word = [&](int block, int h) { return scaled_word<T>(acc, block, h, p.alpha); };
#pragma unroll
  for (int box = 0; box < Cfg::bn / 64; ++box) {
    const int64_t c_row = n0 + 64 * box;
    if (c_row >= p.n) break;
    const auto fill = [&](uint32_t buffer_address) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int block = 8 * box + 2 * q;
        const int row = 8 * (2 * q + matrix / 2) + lane % 8;
        stmatrix_x4_trans(buffer_address + kmajor_offset(row, 2 * warp + half), word(block, 0), word(block, 1),
                          word(block + 1, 0), word(block + 1, 1));
      }
    };
    const auto store = [&](uint32_t buffer_address) {
      tma_store_3d(map, buffer_address, x, static_cast<int32_t>(c_row), z);
    };
    epilogue_box_by_tma(buffers, box, consumer, wg_tid, fill, store);
  }
}

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
