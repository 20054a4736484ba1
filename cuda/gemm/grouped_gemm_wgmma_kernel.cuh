// The grouped GEMM tile kernel of sm_90a, bf16 / fp16 in, fp32 accumulators (grouped_gemm.h's semantics, the same
// epilogue code and rounding points as the mma.sync kernel: gemm_tile_parts.cuh), for the operand layouts Op:
//   varlen_m_nk: B [E, n, k] (K-major) with the epilogues STORE and BIAS, or (its own instantiation) GATED;
//   varlen_m_kn: B [E, k, n] (MN-major) with STORE and BIAS, or (its own instantiation) DGATED;
//   varlen_k:    C[e] [m, n] = A_e^T B_e over the group's rows, A [rows, m] and B [rows, n] both MN-major in shared
//                memory, either gathered by row, epilogue STORE (alpha, beta, bf16/fp16/fp32 C); with c_transposed
//                the problem is the caller's transpose and its tiles go to C transposed
//                (store_tile_transposed_by_tma).
//
// One persistent CTA per SM walks the tiles (varlen M: row tile of the device-built tile list x column tile,
// row-tile major so a wave shares the weight tiles of few experts in L2; varlen K: group x m tile x n tile, group
// major) with three warpgroups:
//   producer (warpgroup 0, registers given away): per 64-deep reduction slice, B's BN x 64 tile by TMA (NK: two
//     boxes of BN/2 rows, for GATED CONCAT the gate rows j0.. and the up rows act_width + j0..; KN: BN/64 boxes
//     of 64 reduction rows x 64 columns, each one 8 KiB block of the MN-major layout) and A's 128 x 64
//     tile: gathered, by 16-byte cp.async from the tile's rows, whose indices it first loads into registers, rows
//     past the tile's group zero-filled and never read; not gathered, by one TMA box of the tile's 128 rows (rows
//     past the group are the next group's, read but never stored: an output row depends on its A row only). Both
//     land in the 128-byte swizzle and complete on the slot's `full` mbarrier (TMA bytes + one cp.async arrival
//     per producer thread; all TMA: thread 0's arrival only). varlen K: per
//     64-row reduction slice, the operand that is not gathered by TMA (8 KiB MN-major boxes of 64 rows x 64
//     columns) when the slice lies wholly inside the group, and the gathered one (or, in the group's last partial
//     slice, both) by cp.async: each octet of producer threads copies whole 128-byte lines of 4 reduction rows into
//     the same MN-major blocks, from the row's source; rows past the group's end are zero-filled. DGATED: after a
//     tile's slices, one more ring entry per 64-column epilogue chunk carrying h's values for it (load_dgated_h).
//   consumers (warpgroups 1, 2: rows 0..63 and 64..127 of the tile): wgmma m64nBNk16 from the slot's
//     descriptors, then release the slot on its `empty` mbarrier; after the last slice, varlen K with beta = 0
//     into C of the operand dtype, or beta = 1 into an fp32 C, and varlen M's STORE where the consumer's 64 rows
//     lie inside the group (WgmmaOperandMaps::c_by_tma), puts its values into boxes in shared memory that TMA
//     stores (or reduce-adds) write while the consumers go on (store_tile_by_tma; varlen M's STORE half then and
//     half under the next tile's main loop: DeferredStore; GATED's h and a, formed in the registers, the same way:
//     store_gated_tile_by_tma); every other product goes
//     through a per-warpgroup fp32 staging chunk of 64 x 64 in shared memory to the shared epilogues, DGATED's
//     reading h from its ring entries.
//
// Preconditions (choose_gemm_path checks them): k a positive multiple of 64; n a multiple of 64; B's row and
// group strides multiples of 8 elements; the grid at most the device's SM count (one CTA per SM: ~226 KiB).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/cp_async.cuh"
#include "cuda/common/cuda_check.h"
#include "cuda/common/grid_dependency.cuh"
#include "cuda/common/mbarrier.cuh"
#include "cuda/common/stmatrix.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/gemm/gemm_tile_parts.cuh"
#include "cuda/gemm/grouped_gemm_wgmma.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

template <int BN>
struct WgmmaTileConfig {
  static constexpr int bm = 128;
  static constexpr int bn = BN;
  static constexpr int bk = 64;  // one 128-byte swizzle row of 16-bit values
  static constexpr int stages = 4;
  static constexpr int consumer_warpgroups = 2;
  static constexpr int threads = 128 * (1 + consumer_warpgroups);
  // What each thread holds at launch (one CTA per SM): the register file over the threads, in steps of 8.
  static constexpr int launch_registers = 65536 / threads / 8 * 8;
  // Registers per thread after setmaxnreg, by operand layout (the sums stay within the launch's):
  // varlen M's producer walks two ways (all-TMA or cp.async), which spill in 40; varlen K's consumers use 232.
  __host__ __device__ static constexpr int producer_registers(bool varlen_k) { return varlen_k ? 40 : 56; }
  __host__ __device__ static constexpr int consumer_registers(bool varlen_k) { return varlen_k ? 232 : 224; }
  static constexpr int a_stage_bytes = bm * bk * 2;
  static constexpr int b_stage_bytes = bn * bk * 2;
  static constexpr int b_box_rows = bn / 2;                 // NK boxes
  static constexpr int mn_block_bytes = bk * 128;           // MN-major: 64 reduction rows of 64 columns
  static constexpr int chunk_columns = 64;  // staged product columns per epilogue round
  // NOTE: 4 floats of padding keep rows 16-byte aligned for the epilogue's float4 reads while shifting banks.
  static constexpr int staging_pitch = chunk_columns + 4;
  static constexpr int staging_bytes = 64 * staging_pitch * 4;  // one consumer warpgroup's 64 rows
  static constexpr int a_offset = 0;
  static constexpr int b_offset = a_offset + stages * a_stage_bytes;
  static constexpr int staging_offset = b_offset + stages * b_stage_bytes;
  static constexpr int barrier_offset = staging_offset + consumer_warpgroups * staging_bytes;
  static constexpr int shared_bytes = barrier_offset + 2 * stages * 8;

  static_assert(BN == 128 || BN == 256, "wgmma_m64k16 exists for N = 128 and 256");
  static_assert(a_stage_bytes % 1024 == 0 && b_stage_bytes % 1024 == 0 && (b_box_rows * 128) % 1024 == 0,
                "every swizzled tile and TMA box starts 1024-byte aligned");
  static_assert(bm == 64 * consumer_warpgroups, "each consumer warpgroup owns 64 rows of the tile");
  static_assert(bm == 128, "an octet of producer threads copies 16-row strides of the tile");
  static_assert(BN % chunk_columns == 0, "the epilogue stages whole 64-column chunks");
  static_assert(barrier_offset % 8 == 0, "mbarriers are 8-byte aligned");
  static_assert(2 * 64 * 64 * 2 <= staging_bytes && staging_offset % 1024 == 0 && staging_bytes % 1024 == 0,
                "a consumer's staging rows hold its two 1024-byte aligned TMA store boxes");
  static_assert(shared_bytes <= 227 * 1024, "one CTA fits the opt-in shared memory of an sm_90 SM");
  static_assert(producer_registers(true) + consumer_registers(true) * consumer_warpgroups <=
                        launch_registers * (1 + consumer_warpgroups) &&
                    producer_registers(false) + consumer_registers(false) * consumer_warpgroups <=
                        launch_registers * (1 + consumer_warpgroups),
                "setmaxnreg moves registers between the warpgroups, never more than the launch gave them");
};

template <GemmTile Tile>
struct WgmmaTileFor;
template <>
struct WgmmaTileFor<GemmTile::m128_n256> {
  using type = WgmmaTileConfig<256>;
};
template <>
struct WgmmaTileFor<GemmTile::m128_n128> {
  using type = WgmmaTileConfig<128>;
};

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

// stage_chunk for a chunk index that may be known at run time only (DGATED's chunk loop is not unrolled, for the
// instruction cache): the accumulators need compile-time indices, so each chunk's staging code is selected here.
template <class Cfg>
__device__ __forceinline__ void stage_chunk_at(const float (&acc)[Cfg::bn / 2], int chunk, bool split_glu,
                                               bool interleaved, float* staging, int wg_tid) {
#pragma unroll
  for (int c = 0; c < Cfg::bn / Cfg::chunk_columns; ++c)
    if (c == chunk) stage_chunk<Cfg>(acc, c, split_glu, interleaved, staging, wg_tid);
}

// Value i of a 4-value register array for an index known at run time only (a dynamic index would put the array in
// local memory).
__device__ __forceinline__ float pick(const float (&values)[4], int i) {
  return i == 0 ? values[0] : i == 1 ? values[1] : i == 2 ? values[2] : values[3];
}

// varlen K, the producer warpgroup's part of tile t: per 64-row reduction slice, the 8 threads of an octet copy one
// reduction row's 128-byte lines — A's BM columns from m0 (BM / 64 MN-major 8 KiB blocks) and B's BN columns (BN / 64
// blocks) — thread i taking 16-byte chunk i % 8 of each, so a warp's copy reads 4 whole lines; an octet does rows
// i / 8, +16, +32, +48, from the row's source (gathered or not), into the ring slot in the 128-byte swizzle. Rows
// past the group's end and columns past m / n are zero-filled, nothing read. The gathered operand's source rows
// are loaded one slice ahead (waited for inside the slice, their latency was the kernel's top stall), and each
// row's copies are unrolled from one source pointer per operand (the producer's issue rate bounds this kernel).
// The operand that is not gathered (B, or A when B is) comes by TMA instead (`map`, one box per 8 KiB block) for
// every slice wholly inside the group: a TMA box cannot stop at the group's end, so the group's last, partial
// slice is copied by cp.async with the rows past the end zero-filled. A masked copy keeps its unmasked address
// (cp_async_16 reads nothing then): choosing a safe address per copy cost the producer, whose own instruction
// latency bounds the weight gradients (ncu: consumers waiting on `full`), two instructions per copy; for the same
// reason a whole slice copies its one cp.async operand through a shorter path than the partial slice's.
// `multicast` (paired CTAs, B by TMA: both CTAs take the same group's rows and B columns): in a whole slice this CTA
// loads its half of B's blocks into both CTAs. `it` counts ring uses across tiles. TmaB: B is the TMA operand (B not
// gathered), known at compile time so that a whole slice issues only its copied operand's copies.
template <class T, class Cfg, bool TmaB>
__device__ __forceinline__ void load_varlen_k_slices(const GroupedGemmProblem& p, const CUtensorMap* map,
                                                     const WgmmaTile& t, int64_t slices, bool multicast, uint32_t rank,
                                                     uint32_t smem_a, uint32_t smem_b, uint32_t full_bars,
                                                     uint32_t empty_bars, int wg_tid, uint32_t& it) {
  constexpr int BK = Cfg::bk, S = Cfg::stages, BN = Cfg::bn;
  constexpr int rows_per_pass = 128 / 8, passes = BK / rows_per_pass;
  const T* a_base = static_cast<const T*>(p.a);
  const T* b_base = static_cast<const T*>(p.b);
  const bool gather_a = p.gather == MOEKIT_GEMM_GATHER_A, gather_b = !TmaB;
  const bool gathered = gather_a || gather_b;
  const int chunk = wg_tid % 8, first_row = wg_tid / 8;
  const int64_t n0 = t.n_tile * BN;
  // The tile's columns inside m and n (both multiples of 8, so a 16-byte chunk is wholly in or out).
  const auto a_columns = static_cast<int32_t>(min(p.m - t.m0, static_cast<int64_t>(Cfg::bm)));
  const auto b_columns = static_cast<int32_t>(min(p.n - n0, static_cast<int64_t>(BN)));
  constexpr bool tma_b = TmaB;
  constexpr int tma_blocks = tma_b ? BN / 64 : Cfg::bm / 64;
  const auto tma_column = static_cast<int32_t>(tma_b ? n0 : t.m0);
  // The gathered source rows of this thread's rows of slice s. Rows past the group's end (only in its last slice,
  // whose copies mask them) take the last row's index: no branch per row.
  // NOTE: only the gathered case defines them here: with the rows themselves as a second definition, the compiler
  // merged the two with a register move right after the loads, which waited for them there, a whole load latency
  // per slice (ncu: the producer's top stall) instead of under the next slice's wait.
  int32_t sources[passes] = {};
  const auto last_row = static_cast<int32_t>(t.row_end - 1);
  const auto load_sources = [&](int64_t s) {
    if (!gathered) return;
    const auto first = static_cast<int32_t>(t.row_begin + s * BK + first_row);
#pragma unroll
    for (int i = 0; i < passes; ++i)
      sources[i] =
          static_cast<int32_t>(load_index(p.gather_idx, min(first + rows_per_pass * i, last_row), p.gather_int64));
  };
  if (slices > 0) load_sources(0);
  // Whole slices copy only the operand that is not TMA's (the gathered one, or A when neither is): its rows'
  // pointers, and which of its BN / 64 (or BM / 64) blocks this thread's chunk lies inside, per tile.
  // NOTE: a row's address is one wide multiply-add in bytes, from a 32-bit row (rows are below 2^31, as the int32
  // offsets and gather indices are) and a 32-bit row stride in bytes (varlen_k_strides_fit; wider rows go to
  // mma.sync): with the 64-bit element math of T pointers it took ~8 instructions per row.
  const T* copied_base = tma_b ? a_base : b_base;
  const int64_t copied_column = (tma_b ? t.m0 : n0) + 8 * chunk;
  const auto copied_start = reinterpret_cast<uint64_t>(copied_base + copied_column);
  const auto copied_ld_bytes = static_cast<uint32_t>((tma_b ? p.lda : p.ldb) * static_cast<int64_t>(sizeof(T)));
  constexpr int copied_blocks = tma_b ? Cfg::bm / 64 : BN / 64;
  const int32_t copied_columns = tma_b ? a_columns : b_columns;
  uint32_t block_inside = 0;
#pragma unroll
  for (int block = 0; block < copied_blocks; ++block)
    if (64 * block + 8 * chunk < copied_columns) block_inside |= 1u << block;
  for (int64_t s = 0; s < slices; ++s, ++it) {
    const uint32_t slot = it % S, parity = (it / S) & 1;
    mbarrier_wait(empty_bars + 8 * slot, parity ^ 1);
    const uint32_t full = full_bars + 8 * slot;
    const int64_t slice_row = t.row_begin + s * BK;
    const bool whole = slice_row + BK <= t.row_end;
    if (wg_tid == 0) {
      // The arrival the varlen-M producer makes, with the bytes of the TMA boxes when there are any.
      if (whole) {
        // Multicast: every block lands here, half of them from the peer.
        mbarrier_arrive_expect_tx(full, tma_blocks * Cfg::mn_block_bytes);
        const uint32_t slot_base = tma_b ? smem_b + slot * Cfg::b_stage_bytes : smem_a + slot * Cfg::a_stage_bytes;
        if (multicast) {
#pragma unroll 1
          for (int i = 0; i < tma_blocks / 2; ++i) {
            const int block = static_cast<int>(rank) * (tma_blocks / 2) + i;
            tma_load_3d_multicast(slot_base + block * Cfg::mn_block_bytes, map, full, tma_column + 64 * block,
                                  static_cast<int32_t>(slice_row), 0, 0x3);
          }
        } else {
#pragma unroll 1
          for (int block = 0; block < tma_blocks; ++block)
            tma_load_3d(slot_base + block * Cfg::mn_block_bytes, map, full, tma_column + 64 * block,
                        static_cast<int32_t>(slice_row), 0);
        }
      } else {
        mbarrier_arrive(full);
      }
    }
    if (whole) {
      const uint32_t copied_slot = tma_b ? smem_a + slot * Cfg::a_stage_bytes : smem_b + slot * Cfg::b_stage_bytes;
#pragma unroll
      for (int i = 0; i < passes; ++i) {
        const int row = first_row + rows_per_pass * i;
        const auto source_row = static_cast<uint32_t>(gathered ? sources[i] : slice_row + row);
        const T* from = reinterpret_cast<const T*>(copied_start + static_cast<uint64_t>(source_row) * copied_ld_bytes);
        const uint32_t line = copied_slot + mnmajor_offset<64>(row, chunk);
#pragma unroll
        for (int block = 0; block < copied_blocks; ++block)
          cp_async_16(line + block * Cfg::mn_block_bytes, from + 64 * block, (block_inside >> block) & 1u);
      }
      mbarrier_arrive_on_cp_async(full);
      if (s + 1 < slices) load_sources(s + 1);
      continue;
    }
    // The group's last, partial slice: both operands by cp.async, rows past the group zero-filled.
#pragma unroll
    for (int i = 0; i < passes; ++i) {
      const int row = first_row + rows_per_pass * i;
      const int64_t r = slice_row + row;
      const bool row_ok = r < t.row_end;
      const T* a_row = a_base + (gather_a ? sources[i] : r) * p.lda + t.m0 + 8 * chunk;
      const T* b_row = b_base + (gather_b ? sources[i] : r) * p.ldb + n0 + 8 * chunk;
      const uint32_t line = mnmajor_offset<64>(row, chunk);
      const uint32_t a_line = smem_a + slot * Cfg::a_stage_bytes + line;
      const uint32_t b_line = smem_b + slot * Cfg::b_stage_bytes + line;
#pragma unroll
      for (int block = 0; block < Cfg::bm / 64; ++block) {
        const bool ok = row_ok && 64 * block + 8 * chunk < a_columns;
        cp_async_16(a_line + block * Cfg::mn_block_bytes, a_row + 64 * block, ok);
      }
#pragma unroll
      for (int block = 0; block < BN / 64; ++block) {
        const bool ok = row_ok && 64 * block + 8 * chunk < b_columns;
        cp_async_16(b_line + block * Cfg::mn_block_bytes, b_row + 64 * block, ok);
      }
    }
    mbarrier_arrive_on_cp_async(full);
    if (s + 1 < slices) load_sources(s + 1);
  }
}

// varlen M, the producer warpgroup's part of tile t: per 64-deep slice, B's tile by TMA (thread 0; `multicast`, this
// CTA's half to both CTAs of the cluster) and A's 128 x 64 tile — by one TMA box from thread 0 when A is not gathered
// (the only thread that walks then), else by 16-byte cp.async of every thread from the rows' sources, loaded once
// per tile. `it` counts ring uses across tiles.
template <class T, class Cfg, bool b_mn_major>
__device__ __forceinline__ void load_varlen_m_slices(const GroupedGemmProblem& p, const WgmmaOperandMaps& maps,
                                                     const WgmmaTile& t, int64_t slices, bool a_by_tma,
                                                     bool concat_pairs, bool multicast, uint32_t rank, uint32_t smem_a,
                                                     uint32_t smem_b, uint32_t full_bars, uint32_t empty_bars,
                                                     int wg_tid, uint32_t& it) {
  constexpr int BM = Cfg::bm, BN = Cfg::bn, BK = Cfg::bk, S = Cfg::stages;
  const auto b_first = static_cast<int32_t>(concat_pairs ? t.n_tile * (BN / 2) : t.n_tile * BN);
  const auto b_second = static_cast<int32_t>(concat_pairs ? p.act_width + t.n_tile * (BN / 2) : b_first + BN / 2);
  const auto group = static_cast<int32_t>(t.group);
  // B's slice k0 into ring slot `slot`, completing on `full` (thread 0).
  const auto load_b = [&](uint32_t slot, uint32_t full, int32_t k0) {
    const uint32_t b_slot = smem_b + slot * Cfg::b_stage_bytes;
    if (multicast) {
      // This CTA's half of the B tile, to the same offsets of both CTAs.
      if constexpr (b_mn_major) {
#pragma unroll
        for (int i = 0; i < BN / 128; ++i) {
          const int block = static_cast<int>(rank) * (BN / 128) + i;
          tma_load_3d_multicast(b_slot + block * Cfg::mn_block_bytes, &maps.b, full, b_first + 64 * block, k0, group,
                                0x3);
        }
      } else {
        tma_load_3d_multicast(b_slot + rank * (Cfg::b_stage_bytes / 2), &maps.b, full, k0,
                              rank == 0 ? b_first : b_second, group, 0x3);
      }
    } else if constexpr (b_mn_major) {
#pragma unroll
      for (int block = 0; block < BN / 64; ++block)
        tma_load_3d(b_slot + block * Cfg::mn_block_bytes, &maps.b, full, b_first + 64 * block, k0, group);
    } else {
      tma_load_3d(b_slot, &maps.b, full, k0, b_first, group);
      tma_load_3d(b_slot + Cfg::b_stage_bytes / 2, &maps.b, full, k0, b_second, group);
    }
  };
  if (a_by_tma) {
    const auto row0 = static_cast<int32_t>(t.row_begin);
    for (int64_t s = 0; s < slices; ++s, ++it) {
      const uint32_t slot = it % S, parity = (it / S) & 1;
      mbarrier_wait(empty_bars + 8 * slot, parity ^ 1);
      const uint32_t full = full_bars + 8 * slot;
      const auto k0 = static_cast<int32_t>(s * BK);
      // Multicast: half of B from this CTA, half from the peer.
      mbarrier_arrive_expect_tx(full, Cfg::a_stage_bytes + Cfg::b_stage_bytes);
      tma_load_3d(smem_a + slot * Cfg::a_stage_bytes, &maps.a, full, k0, row0, 0);
      load_b(slot, full, k0);
    }
    return;
  }
  const T* a_base = static_cast<const T*>(p.a);
  const bool gather_a = p.gather == MOEKIT_GEMM_GATHER_A;
  const int chunk = wg_tid % 8;  // this thread's 16-byte chunk of every A row it copies
  // Where this thread's 8 rows of the tile start (their chunk of k = 0), the same for every slice, and which of them
  // lie inside the group (bit i: row i): per copy one add, no 64-bit row math (the producer's own instruction
  // latency paced the gathered kernel). A row past the group keeps a_base, read by nothing (cp_async_16 zero-fills).
  const T* rows[BM / 16];
  uint32_t inside = 0;
#pragma unroll
  for (int i = 0; i < BM / 16; ++i) {
    const int64_t r = t.row_begin + wg_tid / 8 + 16 * i;
    const bool ok = r < t.row_end;
    const int64_t src = ok ? (gather_a ? load_index(p.gather_idx, r, p.gather_int64) : r) : 0;
    rows[i] = a_base + (ok ? src * p.lda + 8 * chunk : 0);
    inside |= static_cast<uint32_t>(ok) << i;
  }
  for (int64_t s = 0; s < slices; ++s, ++it) {
    const uint32_t slot = it % S, parity = (it / S) & 1;
    mbarrier_wait(empty_bars + 8 * slot, parity ^ 1);
    const uint32_t full = full_bars + 8 * slot;
    const auto k0 = static_cast<int32_t>(s * BK);
    if (wg_tid == 0) {
      // Multicast: half from this CTA, half from the peer.
      mbarrier_arrive_expect_tx(full, Cfg::b_stage_bytes);
      load_b(slot, full, k0);
    }
    const uint32_t a_slot = smem_a + slot * Cfg::a_stage_bytes;
#pragma unroll
    for (int i = 0; i < BM / 16; ++i) {
      const int row = wg_tid / 8 + 16 * i;
      cp_async_16(a_slot + kmajor_offset(row, chunk), rows[i] + k0, (inside >> i) & 1u);
    }
    mbarrier_arrive_on_cp_async(full);
  }
}

// The shared addresses of the two h boxes a DGATED epilogue entry of ring slot `slot` holds: the slot's A tile
// (16 KiB, one 64 x 128 box) and the first 16 KiB of its B tile.
template <class Cfg>
__device__ __forceinline__ uint32_t dgated_h_box(uint32_t smem_a, uint32_t smem_b, uint32_t slot, int box) {
  return box == 0 ? smem_a + slot * Cfg::a_stage_bytes : smem_b + slot * Cfg::b_stage_bytes;
}

// DGATED, the producer warpgroup's part of tile t after its slices: one more ring entry per 64-column epilogue chunk,
// carrying h's values of the chunk's activation columns for the tile's 128 rows (TMA boxes of 64 h columns: CONCAT
// the gate columns j0.. and the up columns act_width + j0..; INTERLEAVED h columns 2 j0.. and 2 j0 + 64..; a plain
// activation z's columns j0.. alone), so that the epilogue reads h from shared memory instead of waiting on global
// loads row after row. Rows past the group are the next group's, read and never used. `every_thread_arrives`: the
// slot's `full` barrier also counts one arrival per producer thread (the cp.async walk's count).
template <class Cfg>
__device__ __forceinline__ void load_dgated_h(const GroupedGemmProblem& p, const CUtensorMap* map, const WgmmaTile& t,
                                              bool every_thread_arrives, uint32_t smem_a, uint32_t smem_b,
                                              uint32_t full_bars, uint32_t empty_bars, int wg_tid, uint32_t& it) {
  constexpr int S = Cfg::stages, box_bytes = Cfg::bm * 64 * 2;
  static_assert(box_bytes == Cfg::a_stage_bytes && box_bytes <= Cfg::b_stage_bytes, "a slot holds two h boxes");
  const bool gated = is_gated_activation(p.activation);
  const bool interleaved = p.glu_layout == MOEKIT_GLU_INTERLEAVED;
  const auto row0 = static_cast<int32_t>(t.row_begin);
#pragma unroll 1
  for (int chunk = 0; chunk < Cfg::bn / 64; ++chunk, ++it) {
    const uint32_t slot = it % S, parity = (it / S) & 1;
    mbarrier_wait(empty_bars + 8 * slot, parity ^ 1);
    const uint32_t full = full_bars + 8 * slot;
    if (wg_tid == 0) {
      const auto j0 = static_cast<int32_t>(t.n_tile * Cfg::bn + 64 * chunk);
      const auto width = static_cast<int32_t>(p.act_width);
      mbarrier_arrive_expect_tx(full, (gated ? 2 : 1) * box_bytes);
      tma_load_3d(dgated_h_box<Cfg>(smem_a, smem_b, slot, 0), map, full, interleaved && gated ? 2 * j0 : j0, row0,
                  0);
      if (gated)
        tma_load_3d(dgated_h_box<Cfg>(smem_a, smem_b, slot, 1), map, full, interleaved ? 2 * j0 + 64 : width + j0,
                    row0, 0);
    }
    if (every_thread_arrives) mbarrier_arrive(full);
  }
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

// Stores 4 bytes at shared address `address ^ flip`. NOTE: the XOR sits inside the asm: written in C++, the
// compiler kept one precomputed address per flip across the whole tile walk, and those spilled.
__device__ __forceinline__ void store_shared_flipped(uint32_t address, uint32_t flip, uint32_t value) {
  asm volatile(
      "{\n .reg .b32 flipped;\n xor.b32 flipped, %0, %2;\n st.shared.b32 [flipped], %1;\n}\n" ::"r"(address),
      "r"(value), "r"(flip)
      : "memory");
}

// Stores 8 bytes (lo, hi) at shared address `address ^ flip`, as store_shared_flipped.
__device__ __forceinline__ void store_shared_flipped_pair(uint32_t address, uint32_t flip, uint32_t lo, uint32_t hi) {
  asm volatile(
      "{\n .reg .b32 flipped;\n xor.b32 flipped, %0, %3;\n st.shared.v2.b32 [flipped], {%1, %2};\n}\n" ::"r"(address),
      "r"(lo), "r"(hi), "r"(flip)
      : "memory");
}

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
  named_barrier_sync(2 + consumer, 128);
  fill(buffer_address);
  // The box was written through the generic proxy; the TMA store reads it through the async proxy.
  fence_proxy_async_shared();
  named_barrier_sync(2 + consumer, 128);
  if (wg_tid == 0) {
    store(buffer_address);
    bulk_commit_group();
  }
}

// STORE with C written by TMA (maps.c_by_tma), one consumer's 64 rows of tile t (varlen M: rows wholly inside the
// tile's group, C [rows, n] as (n, rows, 1); varlen K: C[e] [m, n] as (n, m, E)). Out = T
// (beta = 0, C in the operand dtype): the values alpha product, rounded to T as epilogue_store rounds them, are
// stored. Out = float (beta = 1, fp32 C): the fp32 values alpha product are added to C by TMA reduce-adds, which add
// each element once in L2 (C + alpha product, the sum epilogue_store forms) with no read of C through the SM. One
// box (epilogue_box_by_tma) per 64 rows x 128 bytes (64 T or 32 fp32 columns); TMA writes nothing outside C.
template <class Out, class Cfg>
__device__ __forceinline__ void store_tile_by_tma(const GroupedGemmProblem& p, const CUtensorMap* map,
                                                  const float (&acc)[Cfg::bn / 2], unsigned char* buffers,
                                                  const WgmmaTile& t, int consumer, int wg_tid) {
  constexpr bool add = sizeof(Out) == 4;
  constexpr int BN = Cfg::bn, box_columns = 128 / sizeof(Out), box_blocks = box_columns / 8;
  const int64_t n0 = t.n_tile * BN;
  const auto y = static_cast<int32_t>(t.m0 + 64 * consumer);
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

// Varlen M's STORE by TMA, half deferred (the kernel's STORE and BIAS instantiation): after a tile's main loop each
// consumer stores the first half of its boxes at once and keeps the second half's values alpha product, rounded to
// T, in `words` (a quarter of the accumulators' registers), to put in and store one box per reduction slice of the
// next tile's main loop (from its second slice on), between issuing the slice's wgmma and waiting on it. So no box
// of an epilogue waits for another of the same epilogue to be read out of its buffer (ncu at k = 256: the epilogue
// was 39% of the consumers' samples, its named-barrier waits behind those reads 11%); the waits that remain fall
// under the tensor cores' work. The bits are store_tile_by_tma's. Kept boxes the main loop leaves (fewer slices
// than boxes), and the last tile's, are stored after it (flush).
template <class T, class Cfg>
struct DeferredStore {
  static constexpr int box_count = Cfg::bn / 64, first_kept = box_count / 2;
  // NOTE: keeping every box's words (half the accumulators) spilled 22 registers, whose reloads per box added 12% to
  // the L2 traffic (ncu: the main loop's waits on `full` rose from 14% to 24% of its samples; 0.91-0.996x).
  uint32_t words[16 * (box_count - first_kept)];  // kept box b: word 16 (b - first_kept) + 2 i + half
  int boxes = 0;                                  // the tile's boxes inside C
  int next = 0;                                   // the next kept box to store (boxes: none left)
  int32_t x0 = 0, y = 0;                          // C's column of the tile's first box and row of its first row
  uint32_t sequence = 0;                          // boxes stored so far: buffer sequence % 2 (epilogue_box_by_tma)

  // Puts box `box` in (its 32-bit words word(i, half) of 8-column block i of the box) and stores it.
  template <class Word>
  __device__ __forceinline__ void put(const CUtensorMap* map, unsigned char* buffers, int box, int consumer,
                                      int wg_tid, Word&& word) {
    const uint32_t lane_offset = accumulator_box_offset<sizeof(T)>(wg_tid);
    const auto fill = [&](uint32_t buffer_address) { put_box_words(buffer_address, lane_offset, word); };
    const auto store = [&](uint32_t buffer_address) { tma_store_3d(map, buffer_address, x0 + 64 * box, y, 0); };
    epilogue_box_by_tma(buffers, static_cast<int>(sequence % 2), consumer, wg_tid, fill, store);
    ++sequence;
  }

  // The tile's epilogue: its first boxes stored, the rest kept.
  __device__ __forceinline__ void take(const GroupedGemmProblem& p, const CUtensorMap* map,
                                       const float (&acc)[Cfg::bn / 2], const WgmmaTile& t, unsigned char* buffers,
                                       int consumer, int wg_tid) {
    const int64_t n0 = t.n_tile * Cfg::bn;
    boxes = static_cast<int>(min(p.n - n0, static_cast<int64_t>(Cfg::bn)) / 64);
    x0 = static_cast<int32_t>(n0);
    y = static_cast<int32_t>(t.m0 + 64 * consumer);
#pragma unroll
    for (int box = 0; box < first_kept; ++box) {
      if (box >= boxes) break;
      put(map, buffers, box, consumer, wg_tid,
          [&](int i, int half) { return scaled_word<T>(acc, 8 * box + i, half, p.alpha); });
    }
#pragma unroll
    for (int box = first_kept; box < box_count; ++box)
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          words[16 * (box - first_kept) + 2 * i + half] = scaled_word<T>(acc, 8 * box + i, half, p.alpha);
    next = first_kept;
  }

  // Stores the next kept box, if any.
  __device__ __forceinline__ void store_next(const CUtensorMap* map, unsigned char* buffers, int consumer,
                                             int wg_tid) {
    if (next >= boxes) return;
    // The kept box's words by compile-time indices (a run-time index puts `words` in local memory).
#pragma unroll
    for (int box = first_kept; box < box_count; ++box) {
      if (box != next) continue;
      put(map, buffers, box, consumer, wg_tid,
          [&](int i, int half) { return words[16 * (box - first_kept) + 2 * i + half]; });
    }
    ++next;
  }

  __device__ __forceinline__ void flush(const CUtensorMap* map, unsigned char* buffers, int consumer, int wg_tid) {
#pragma unroll 1
    while (next < boxes) store_next(map, buffers, consumer, wg_tid);
  }
};

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

// GATED with h and a written by TMA (maps.c_by_tma: a gated activation, CONCAT, alpha = 1, no bias, I a multiple
// of 64), one consumer's 64 rows wholly inside the tile's group. Gate column c and up column c of the tile's
// activation columns are product blocks i and BN / 16 + i, held by the same thread, so a = act(h) is formed in
// registers: no fp32 staging, no row loop. Per 64 activation columns j0.. three boxes (epilogue_box_by_tma): h's
// gate columns (C at j0), h's up columns (C at I + j0) and a's (maps.act at j0), rounded where epilogue_gated_glu
// rounds them (a from the rounded h), so the bits are those of the threads' epilogue. The activation kind is
// switched once per up box, where a is formed (each kind's copy of that code is the only one a run executes).
template <class T, class Cfg>
__device__ __forceinline__ void store_gated_tile_by_tma(const GroupedGemmProblem& p, const WgmmaOperandMaps& maps,
                                                        const float (&acc)[Cfg::bn / 2], unsigned char* buffers,
                                                        const WgmmaTile& t, int consumer, int wg_tid) {
  constexpr int BN = Cfg::bn;
  const auto y = static_cast<int32_t>(t.m0 + 64 * consumer);
  const uint32_t lane_offset = accumulator_box_offset<sizeof(T)>(wg_tid);
  // The rounded h of value pair `half` of gate block 8 chunk + i (up: false) or of its up block (up: true).
  const auto h_pair = [&](int chunk, int i, int half, bool up) {
    const int block = (up ? BN / 16 : 0) + 8 * chunk + i;
    return round_pair<T>(acc[4 * block + 2 * half], acc[4 * block + 2 * half + 1]);
  };
#pragma unroll
  for (int chunk = 0; chunk < BN / 128; ++chunk) {
    const auto j0 = static_cast<int32_t>(t.n_tile * (BN / 2) + 64 * chunk);
    if (j0 >= p.act_width) break;
    // part 0: h's gate columns, 1: h's up columns (and a, from the gate's rounded pairs kept from part 0), 2: a.
    // NOTE: each pair is rounded once (a conversion runs at a quarter of the FMA rate, as the sigmoid's MUFU ops do:
    // together they bound this epilogue).
    uint32_t gate_words[16], a_words[16];
#pragma unroll
    for (int part = 0; part < 3; ++part) {
      const auto fill = [&](uint32_t buffer_address) {
        const auto put = [&](int i, int half, uint32_t value) {
          store_shared_flipped(buffer_address + lane_offset + 8 * 128 * half, static_cast<uint32_t>(i) << 4, value);
        };
        if (part == 0) {
#pragma unroll
          for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              gate_words[2 * i + half] = h_pair(chunk, i, half, false);
              put(i, half, gate_words[2 * i + half]);
            }
          return;
        }
        if (part == 2) {
#pragma unroll
          for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int half = 0; half < 2; ++half) put(i, half, a_words[2 * i + half]);
          return;
        }
        with_gated_kind(p.activation, [&](auto kind) {
          constexpr int32_t K = decltype(kind)::value;
#pragma unroll
          for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const uint32_t up_word = h_pair(chunk, i, half, true);
              put(i, half, up_word);
              const float2 g = unpack_pair<T>(gate_words[2 * i + half]), u = unpack_pair<T>(up_word);
              a_words[2 * i + half] =
                  round_pair<T>(gated_forward<K>(p.glu_limit, g.x, u.x), gated_forward<K>(p.glu_limit, g.y, u.y));
            }
        });
      };
      const auto store = [&](uint32_t buffer_address) {
        if (part == 2)
          tma_store_3d(&maps.act, buffer_address, j0, y, 0);
        else
          tma_store_3d(&maps.c, buffer_address, part == 0 ? j0 : static_cast<int32_t>(p.act_width) + j0, y, 0);
      };
      epilogue_box_by_tma(buffers, 3 * chunk + part, consumer, wg_tid, fill, store);
    }
  }
}

// Activated: the instantiation for the layout's activation epilogue (B [E, n, k]: GATED; B [E, k, n]: DGATED), with
// no other epilogue's code; otherwise STORE and BIAS (varlen K: STORE). NOTE: one kernel with both carried the
// STORE epilogue's TMA stores into GATED's register allocation, and the up-projection ran 4-8% slower.
template <class T, class Cfg, Operands Op, bool Activated>
__global__ void __launch_bounds__(Cfg::threads, 1)
    grouped_gemm_wgmma_kernel(const GroupedGemmProblem p, const __grid_constant__ WgmmaOperandMaps maps) {
#if MOEKIT_SM90A_ENABLED
  constexpr int BM = Cfg::bm, BN = Cfg::bn, BK = Cfg::bk, S = Cfg::stages;
  constexpr bool varlen_k = Op == Operands::varlen_k;
  constexpr bool a_mn_major = varlen_k;
  constexpr bool b_mn_major = Op != Operands::varlen_m_nk;
  // Varlen M with A not gathered: A by TMA too (the producer's issue rate and the cp.async latency bound the
  // gathered kernel; TMA boxes take neither).
  const bool a_by_tma = !varlen_k && p.gather != MOEKIT_GEMM_GATHER_A;
  static_assert(!(Activated && varlen_k), "varlen K is STORE only");
  // GATED pairs the columns of B [E, n, k]; DGATED reads B [E, k, n] (wgmma_capable).
  constexpr bool gated = Activated && Op == Operands::varlen_m_nk;
  constexpr bool dgated = Activated && Op == Operands::varlen_m_kn;
  extern __shared__ __align__(1024) unsigned char shared[];
  const uint32_t smem = shared_address(shared);
  const uint32_t smem_a = smem + Cfg::a_offset;
  const uint32_t smem_b = smem + Cfg::b_offset;
  const uint32_t full_bars = smem + Cfg::barrier_offset;                       // [S] operands of a slot landed
  const uint32_t empty_bars = full_bars + 8 * S;                               // [S] a slot read by the consumers
  const int tid = static_cast<int>(threadIdx.x);
  const int warpgroup = tid / 128, wg_tid = tid % 128;
  // Paired CTAs (launched in clusters of 2, GemmKernel::cluster): the two CTAs of a cluster take a pair of
  // consecutive row tiles at the same column tile — varlen M: of the tile list, padded to an even count; varlen K: m
  // tiles 2i and 2i + 1 of one group (B by TMA, an even m tile count: cuda/gemm/gemm_config.cpp). When both are of one
  // group each loads half of the B tile and multicasts it to both (varlen K: in the slices wholly inside the group),
  // else (a varlen-M pair across a group boundary) each loads its own. Either way a ring slot is reused only when
  // the consumers of both CTAs have released it.
  const uint32_t cluster_size = cluster_num_ctas();
  const bool paired = cluster_size == 2;
  const uint32_t rank = paired ? cluster_cta_rank() : 0;

  if (tid == 0) {
    // NOTE: the swizzle is a function of the address bits, so the tiles must sit 1024-byte aligned.
    if ((smem & 1023) != 0) __trap();
#pragma unroll
    for (int s = 0; s < S; ++s) {
      mbarrier_init(full_bars + 8 * s, a_by_tma ? 1 : 128 + 1);
      // Unpaired: every consumer thread arrives; paired: one arrival per consumer warp of either CTA.
      mbarrier_init(empty_bars + 8 * s, paired ? 2 * 4 * Cfg::consumer_warpgroups : 128 * Cfg::consumer_warpgroups);
    }
    mbarrier_init_fence();
    // NOTE: varlen K with no rows at all gets no map (nothing to load), only beta C.
    if (!varlen_k || p.rows > 0) tma_prefetch_descriptor(&maps.b);
    if (a_by_tma) tma_prefetch_descriptor(&maps.a);
    if (dgated) tma_prefetch_descriptor(&maps.h);
  }
  // Launched as a programmatic dependent (launch_wgmma_tiles): everything above overlapped the previous kernel (on
  // the varlen-M path the row-tile list's build); every read of the operands, offsets and tile list comes after.
  wait_for_previous_grid();
  // Paired: the peer's barriers must be initialised before anything multicasts or arrives there.
  if (paired)
    cluster_sync();
  else
    __syncthreads();

  // The walk: unit u is tile u, or (paired) the row tile pair u / n_tiles at column tile u % n_tiles, of which this
  // CTA takes row tile 2 (u / n_tiles) + rank (varlen K: row tile g m_tiles + i is m tile i of group g). Both CTAs
  // of a cluster walk the same units.
  const int64_t tiles = wgmma_tile_count<varlen_k, BM>(p);
  const int64_t units = paired ? tiles / 2 : tiles;
  const int64_t first_unit = paired ? blockIdx.x / 2 : blockIdx.x;
  const int64_t unit_step = paired ? gridDim.x / 2 : gridDim.x;
  // Paired: the row tile of unit u that the CTA of rank r takes.
  auto pair_row_tile = [&](int64_t u, uint32_t r) -> int64_t { return 2 * (u / p.n_tiles) + r; };
  auto tile_of_unit = [&](int64_t u) -> int64_t {
    return paired ? pair_row_tile(u, rank) * p.n_tiles + u % p.n_tiles : u;
  };
  // Paired: the group of the peer CTA's row tile of unit u.
  auto peer_group = [&](int64_t u) -> int64_t {
    return reinterpret_cast<const int4*>(p.tile_list)[pair_row_tile(u, rank ^ 1)].x;
  };
  // Reduction slices of a tile: varlen M the whole k; varlen K the group's rows (none for an empty group).
  auto slices_of = [&](const WgmmaTile& t) -> int64_t {
    return varlen_k ? (t.row_end - t.row_begin + BK - 1) / BK : p.k / BK;
  };
  const bool split_glu = gated && is_gated_activation(p.activation);
  // The epilogue stores C by TMA (WgmmaOperandMaps::c_by_tma: STORE, or GATED's h and a; never DGATED's).
  const bool tma_stores = !dgated && maps.c_by_tma;
  const bool interleaved = p.glu_layout == MOEKIT_GLU_INTERLEAVED;
  const bool concat_pairs = split_glu && !interleaved;

  if (warpgroup == 0) {
    // ---- Producer ----
    setmaxnreg_dec<Cfg::producer_registers(varlen_k)>();
    uint32_t it = 0;
    // All TMA: thread 0 loads every slot; the rest of the warpgroup has nothing to do.
    const int64_t walk_end = a_by_tma && wg_tid != 0 ? 0 : units;
    for (int64_t unit = first_unit; unit < walk_end; unit += unit_step) {
      const WgmmaTile t = wgmma_tile_at<varlen_k, BM>(p, tile_of_unit(unit));
      const int64_t slices = slices_of(t);
      if constexpr (varlen_k) {
        if (p.gather == MOEKIT_GEMM_GATHER_B)
          load_varlen_k_slices<T, Cfg, false>(p, &maps.b, t, slices, paired, rank, smem_a, smem_b, full_bars,
                                              empty_bars, wg_tid, it);
        else
          load_varlen_k_slices<T, Cfg, true>(p, &maps.b, t, slices, paired, rank, smem_a, smem_b, full_bars,
                                             empty_bars, wg_tid, it);
      } else {
        load_varlen_m_slices<T, Cfg, b_mn_major>(p, maps, t, slices, a_by_tma, concat_pairs,
                                                 paired && peer_group(unit) == t.group, rank, smem_a, smem_b,
                                                 full_bars, empty_bars, wg_tid, it);
        if (dgated)
          load_dgated_h<Cfg>(p, &maps.h, t, !a_by_tma, smem_a, smem_b, full_bars, empty_bars, wg_tid, it);
      }
    }
  } else {
    // ---- Consumers ----
    setmaxnreg_inc<Cfg::consumer_registers(varlen_k)>();
    const int consumer = warpgroup - 1;
    float* staging = reinterpret_cast<float*>(shared + Cfg::staging_offset) + consumer * 64 * Cfg::staging_pitch;
    const DeviceActivation act{p.activation, p.glu_limit};
    float acc[BN / 2];
    uint32_t it = 0;
    // The STORE and BIAS instantiation of varlen M defers half its TMA-store epilogue into the next tile's main loop.
    constexpr bool defers_store = !varlen_k && !Activated;
    DeferredStore<T, Cfg> deferred;
    unsigned char* const buffers = shared + Cfg::staging_offset + consumer * Cfg::staging_bytes;
    // Hands ring slot `slot` back to the producers: unpaired every thread arrives on this CTA's barrier; paired,
    // once the warp is done, its lane 0 arrives on the barrier of both CTAs (either producer may overwrite it).
    const auto release = [&](uint32_t slot) {
      const uint32_t bar = empty_bars + 8 * slot;
      if (!paired) {
        mbarrier_arrive(bar);
        return;
      }
      __syncwarp();
      if (wg_tid % 32 == 0) {
        mbarrier_arrive_cluster(bar, 0, 1);
        mbarrier_arrive_cluster(bar, 1, 1);
      }
    };
    for (int64_t unit = first_unit; unit < units; unit += unit_step) {
      const WgmmaTile t = wgmma_tile_at<varlen_k, BM>(p, tile_of_unit(unit));
      const int64_t slices = slices_of(t);
      if (slices == 0) {
        // varlen K over an empty group: the product is 0 and C becomes beta C.
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
      }
      for (int64_t s = 0; s < slices; ++s, ++it) {
        const uint32_t slot = it % S, parity = (it / S) & 1;
        mbarrier_wait(full_bars + 8 * slot, parity);
        // NOTE: A arrived by cp.async (generic proxy); wgmma reads shared memory through the async proxy.
        if (!a_by_tma) fence_proxy_async_shared();
        // K-major A: this consumer's 64 rows of 128 bytes; MN-major A (varlen K): its 8 KiB block of 64 columns.
        const uint32_t a_tile =
            smem_a + slot * Cfg::a_stage_bytes + consumer * (a_mn_major ? Cfg::mn_block_bytes : 64 * 128);
        const uint32_t b_tile = smem_b + slot * Cfg::b_stage_bytes;
        wgmma_fence_accumulators(acc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
          // K-major: a 16-deep step is 32 bytes along each row; MN-major: 16 rows of 128 bytes.
          const uint64_t a_desc = a_mn_major ? wgmma_mnmajor_sw128_descriptor(a_tile + 2048 * kk, Cfg::mn_block_bytes)
                                             : wgmma_kmajor_sw128_descriptor(a_tile + 32 * kk);
          const uint64_t b_desc = b_mn_major ? wgmma_mnmajor_sw128_descriptor(b_tile + 2048 * kk, Cfg::mn_block_bytes)
                                             : wgmma_kmajor_sw128_descriptor(b_tile + 32 * kk);
          wgmma_m64k16<BN, T, a_mn_major, b_mn_major>(acc, a_desc, b_desc, s > 0 || kk > 0);
        }
        wgmma_commit();
        // The previous tile's kept boxes from the second slice on: at the first, each buffer still holds a box the
        // epilogue has just stored (1.00-1.02x against from the first slice).
        if constexpr (defers_store) {
          if (s > 0) deferred.store_next(&maps.c, buffers, consumer, wg_tid);
        }
        // One slice's wgmmas stay in flight while the next slice's are issued: wait for the previous slice's,
        // then hand its slot back to the producer.
        wgmma_wait<1>();
        if (s > 0) release((it - 1) % S);
      }
      // The previous tile's boxes the main loop left (fewer slices than boxes), under the last slice's wgmmas.
      if constexpr (defers_store) deferred.flush(&maps.c, buffers, consumer, wg_tid);
      wgmma_wait<0>();
      wgmma_fence_accumulators(acc);
      if (slices > 0) release((it - 1) % S);

      // ---- Epilogue by TMA stores (maps.c_by_tma; varlen M: this consumer's rows wholly inside the group) ----
      const int64_t first_row = t.m0 + 64 * consumer;
      const bool by_tma = tma_stores && (varlen_k || first_row + 64 <= t.m_end);
      if constexpr (defers_store) {
        if (by_tma) {
          deferred.take(p, &maps.c, acc, t, buffers, consumer, wg_tid);
          continue;
        }
      }
      // The TMA boxes take turns on two buffers inside this consumer's staging rows, and a tile may end on either
      // (fewer boxes at the last column tile), so a tile's epilogue, by TMA or by the threads, starts once every
      // earlier store has read its buffer (long since: a mainloop ago).
      if (tma_stores && wg_tid == 0) bulk_wait_group_read<0>();
      if (by_tma) {
        if constexpr (gated)
          store_gated_tile_by_tma<T, Cfg>(p, maps, acc, buffers, t, consumer, wg_tid);
        else if (varlen_k && p.c_fp32)
          store_tile_by_tma<float, Cfg>(p, &maps.c, acc, buffers, t, consumer, wg_tid);
        else if (varlen_k && p.c_transposed)
          store_tile_transposed_by_tma<T, Cfg>(p, &maps.c, acc, buffers, t, consumer, wg_tid);
        else
          store_tile_by_tma<T, Cfg>(p, &maps.c, acc, buffers, t, consumer, wg_tid);
        continue;
      }

      // ---- Epilogue: 64-column chunks through the staging rows, 8 values of one row per thread ----
      const int64_t n0 = t.n_tile * BN;
      const int items_per_row = split_glu ? 4 : 8;
      const int rows_per_pass = 128 / items_per_row;
      const int item = wg_tid % items_per_row;
      // One chunk's products into the staging rows, read once every thread of the consumer has written its part.
      const auto stage = [&](int chunk) {
        named_barrier_sync(2 + consumer, 128);  // the previous chunk's staging reads are done
        stage_chunk_at<Cfg>(acc, chunk, split_glu, interleaved, staging, wg_tid);
        named_barrier_sync(2 + consumer, 128);
      };
      if constexpr (dgated) {
        // The dA . a of each of this thread's rows over the tile's columns: per chunk the 8 lanes of a row sum
        // theirs by a fixed butterfly, then the chunks add in order. The rows' score scales once per tile.
        float row_dots[64 / 16] = {}, row_scales[64 / 16] = {};
#pragma unroll
        for (int pass = 0; pass < 64 / 16; ++pass) {
          const int64_t r = first_row + wg_tid / 8 + 16 * pass;
          if (r < t.m_end) row_scales[pass] = p.row_scale[p.pair_idx[r]];
        }
        // NOTE: neither the chunks nor the row passes are unrolled: unrolled, the copies of DGATED's activation
        // code overflowed the instruction cache (ncu: 70% of the epilogue's stalls were no_inst; x1.22-1.38 rolled).
        // The MoE layer's DGATED (SwiGLU, CONCAT, alpha = 1) has its own copy of the loop that branches on none of
        // them: this epilogue is issue-bound (~10 us per tile, the SMs' warps idle under it but two per scheduler).
        const auto chunks = [&](auto swiglu_concat) {
          constexpr bool SwigluConcat = decltype(swiglu_concat)::value;
#pragma unroll 1
          for (int chunk = 0; chunk < BN / Cfg::chunk_columns; ++chunk) {
            stage(chunk);
            // The chunk's h values: the ring entry the producer loaded after the tile's slices (load_dgated_h).
            const uint32_t slot = it % S;
            mbarrier_wait(full_bars + 8 * slot, (it / S) & 1);
            const unsigned char* box0 = shared + (dgated_h_box<Cfg>(smem_a, smem_b, slot, 0) - smem);
            const unsigned char* box1 = shared + (dgated_h_box<Cfg>(smem_a, smem_b, slot, 1) - smem);
            // Every lane takes part in the shuffles, rows past the group included.
#pragma unroll 1
            for (int pass = 0; pass < 64 / 16; ++pass) {
              const int row = wg_tid / 8 + 16 * pass;
              const int64_t r = first_row + row, j = n0 + Cfg::chunk_columns * chunk + 8 * item;
              float dot = 0.0f;
              if (r < t.m_end && j < p.n) {
                float g[8], u[8];
                load_h_from_boxes<T>(box0, box1, 64 * consumer + row, item,
                                     SwigluConcat || is_gated_activation(act.kind), !SwigluConcat && interleaved, g,
                                     u);
                dot = epilogue_dgated_from_h<T, SwigluConcat>(
                    p, act, staging + row * Cfg::staging_pitch + 8 * item, g, u, r, j, pick(row_scales, pass));
              }
#pragma unroll
              for (int offset = 4; offset >= 1; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
#pragma unroll
              for (int q = 0; q < 64 / 16; ++q)
                if (q == pass) row_dots[q] += dot;
            }
            release(slot);
            ++it;
          }
        };
        if (act.kind == MOEKIT_ACT_SWIGLU && !interleaved && p.alpha == 1.0f)
          chunks(std::true_type{});
        else
          chunks(std::false_type{});
        if (item == 0) {
#pragma unroll
          for (int pass = 0; pass < 64 / 16; ++pass) {
            const int64_t r = first_row + wg_tid / 8 + 16 * pass;
            if (r < t.m_end) p.ds_partials[r * p.n_tiles + t.n_tile] = row_dots[pass];
          }
        }
      } else {
        // STORE, BIAS, GATED: unrolled over the chunks (rolled, these lighter epilogues ran 0.8-0.99x). GATED with
        // alpha = 1 and no bias (the layer's up-projection) has its own copy without the scaling and the bias.
        const auto chunks = [&](auto scaled) {
          constexpr bool Scaled = decltype(scaled)::value;
#pragma unroll
          for (int chunk = 0; chunk < BN / Cfg::chunk_columns; ++chunk) {
            stage(chunk);
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
            continue;
          }
        }
        chunks(std::true_type{});
      }
    }
    // The last tile's boxes.
    if constexpr (defers_store) deferred.flush(&maps.c, buffers, consumer, wg_tid);
  }
  // The TMA stores read their shared memory sources until they complete.
  if (tma_stores && warpgroup > 0 && wg_tid == 0) bulk_wait_group<0>();
  // Paired: neither CTA leaves while its peer may still multicast into it or arrive on its barriers.
  if (paired) cluster_sync();
#else
  // NOTE: built for another architecture: choose_gemm_path never sends a launch here.
  __trap();
#endif
}

// The definition behind grouped_gemm_wgmma.h's declaration; each grouped_gemm_wgmma_<dtype>_<tile>.cu explicitly
// instantiates one.
template <int32_t Dtype, GemmTile Tile, Operands Op, bool Activated>
void launch_wgmma_tiles(const GroupedGemmProblem& p, const WgmmaOperandMaps& maps, int sm_count, bool paired,
                        cudaStream_t stream) {
  using T = typename StorageFor<Dtype>::type;
  using Cfg = typename WgmmaTileFor<Tile>::type;
  const int64_t bound = Op == Operands::varlen_k ? varlen_k_tile_count(p, Cfg::bm) : p.m_tiles * p.n_tiles;
  if (bound == 0) return;
  auto kernel = grouped_gemm_wgmma_kernel<T, Cfg, Op, Activated>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::shared_bytes),
             "grouped GEMM (wgmma): shared memory opt-in");
  // A programmatic dependent of the previous kernel (the kernel waits for it before reading anything): its CTAs'
  // launch and set-up overlap that kernel's end.
  cudaLaunchAttribute attributes[2]{};
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(Cfg::threads);
  config.dynamicSmemBytes = Cfg::shared_bytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = 1;
  if (!paired) {
    config.gridDim = dim3(static_cast<unsigned>(bound < sm_count ? bound : sm_count));
    check_cuda(cudaLaunchKernelEx(&config, kernel, p, maps), "grouped GEMM (wgmma): tile kernel");
    return;
  }
  // Clusters of 2 along the row tiles: as many as can be resident at once (a GPC's SMs pair up), at most one
  // per pair of row tiles and column tile.
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim.x = 2;
  attributes[1].val.clusterDim.y = 1;
  attributes[1].val.clusterDim.z = 1;
  config.numAttrs = 2;
  config.gridDim = dim3(static_cast<unsigned>(sm_count / 2 * 2));
  int resident = 0;
  check_cuda(cudaOccupancyMaxActiveClusters(&resident, kernel, &config), "grouped GEMM (wgmma): cluster occupancy");
  const int64_t units = Op == Operands::varlen_k ? bound / 2 : (p.m_tiles + 1) / 2 * p.n_tiles;
  const int64_t clusters = units < resident ? units : (resident > 0 ? resident : 1);
  config.gridDim = dim3(static_cast<unsigned>(2 * clusters));
  check_cuda(cudaLaunchKernelEx(&config, kernel, p, maps), "grouped GEMM (wgmma): paired tile kernel");
}

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
