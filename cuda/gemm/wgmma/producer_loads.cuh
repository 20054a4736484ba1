// The wgmma grouped GEMM's producer warpgroup (grouped_gemm_wgmma_kernel.cuh): per tile, each 64-deep reduction
// slice's A and B tiles into the next ring slot, completing on the slot's `full` mbarrier (TMA bytes + one cp.async
// arrival per producer thread; all TMA: thread 0's arrival only).
//   varlen M (load_varlen_m_slices): B's BN x 64 tile by TMA (NK: two boxes of BN/2 rows, for GATED CONCAT the gate
//     rows j0.. and the up rows act_width + j0..; KN: BN/64 boxes of 64 reduction rows x 64 columns, each one 8 KiB
//     block of the MN-major layout) and A's 128 x 64 tile: gathered, by 16-byte cp.async from the tile's rows, whose
//     indices it first loads into registers, rows past the tile's group zero-filled and never read; not gathered, by
//     one TMA box of the tile's 128 rows (rows past the group are the next group's, read but never stored: an output
//     row depends on its A row only). Both land in the 128-byte swizzle.
//   varlen K (load_varlen_k_slices): per 64-row reduction slice, the operand that is not gathered by TMA (8 KiB
//     MN-major boxes of 64 rows x 64 columns) when the slice lies wholly inside the group, and the gathered one (or,
//     in the group's last partial slice, both) by cp.async: each octet of producer threads copies whole 128-byte
//     lines of 4 reduction rows into the same MN-major blocks, from the row's source; rows past the group's end are
//     zero-filled.
//   DGATED (load_dgated_h): after a tile's slices, one more ring entry per 64-column epilogue chunk carrying h's
//     values for it.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/common/cp_async.cuh"
#include "cuda/common/mbarrier.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/gemm/gemm_tile_parts.cuh"
#include "cuda/gemm/grouped_gemm_wgmma.h"
#include "cuda/gemm/wgmma/pipeline.cuh"
#include "cuda/gemm/wgmma/tile_config.cuh"
#include "cuda/gemm/wgmma/tile_scheduler.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

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
// loads its half of B's blocks into both CTAs. `it`: the producer's place in the ring, across tiles. TmaB: B is the TMA operand (B not
// gathered), known at compile time so that a whole slice issues only its copied operand's copies.
template <class T, class Cfg, bool TmaB>
__device__ __forceinline__ void load_varlen_k_slices(const GroupedGemmProblem& p, const CUtensorMap* map,
                                                     const WgmmaTile& t, int64_t slices, bool multicast, uint32_t rank,
                                                     uint32_t smem_a, uint32_t smem_b,
                                                     const PipelineBarriers<Cfg::stages>& ring, int wg_tid,
                                                     PipelineState<Cfg::stages>& it) {
  constexpr int BK = Cfg::bk, BN = Cfg::bn;
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
          static_cast<int32_t>(gather_row(p, min(first + rows_per_pass * i, last_row)));
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
  for (int64_t s = 0; s < slices; ++s, it.advance()) {
    const uint32_t slot = it.index();
    ring.wait_empty(it);
    const uint32_t full = ring.full(slot);
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
// per tile. `it`: the producer's place in the ring, across tiles.
template <class T, class Cfg, bool b_mn_major>
__device__ __forceinline__ void load_varlen_m_slices(const GroupedGemmProblem& p, const WgmmaOperandMaps& maps,
                                                     const WgmmaTile& t, int64_t slices, bool a_by_tma,
                                                     bool concat_pairs, bool multicast, uint32_t rank, uint32_t smem_a,
                                                     uint32_t smem_b, const PipelineBarriers<Cfg::stages>& ring,
                                                     int wg_tid, PipelineState<Cfg::stages>& it) {
  constexpr int BM = Cfg::bm, BN = Cfg::bn, BK = Cfg::bk;
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
    for (int64_t s = 0; s < slices; ++s, it.advance()) {
      const uint32_t slot = it.index();
      ring.wait_empty(it);
      const uint32_t full = ring.full(slot);
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
    const int64_t src = ok ? (gather_a ? gather_row(p, r) : r) : 0;
    rows[i] = a_base + (ok ? src * p.lda + 8 * chunk : 0);
    inside |= static_cast<uint32_t>(ok) << i;
  }
  for (int64_t s = 0; s < slices; ++s, it.advance()) {
    const uint32_t slot = it.index();
    ring.wait_empty(it);
    const uint32_t full = ring.full(slot);
    const auto k0 = static_cast<int32_t>(s * BK);
    if (wg_tid == 0) {
      // Multicast: half from this CTA, half from the peer.
      mbarrier_arrive_expect_tx(full, Cfg::b_stage_bytes);
      load_b(slot, full, k0);
    }
    const uint32_t a_slot = smem_a + slot * Cfg::a_stage_bytes;
    // k's tail (a multiple of 8): the chunks past k are zero-filled, as TMA fills B's.
    const uint32_t live = k0 + 8 * chunk < p.k ? inside : 0u;
#pragma unroll
    for (int i = 0; i < BM / 16; ++i) {
      const int row = wg_tid / 8 + 16 * i;
      cp_async_16(a_slot + kmajor_offset(row, chunk), rows[i] + k0, (live >> i) & 1u);
    }
    mbarrier_arrive_on_cp_async(full);
  }
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
                                              const PipelineBarriers<Cfg::stages>& ring, int wg_tid,
                                              PipelineState<Cfg::stages>& it) {
  constexpr int box_bytes = Cfg::bm * 64 * 2;
  static_assert(box_bytes == Cfg::a_stage_bytes && box_bytes <= Cfg::b_stage_bytes, "a slot holds two h boxes");
  const bool gated = is_gated_activation(p.activation);
  const bool interleaved = p.glu_layout == MOEKIT_GLU_INTERLEAVED;
  const auto row0 = static_cast<int32_t>(t.row_begin);
#pragma unroll 1
  for (int chunk = 0; chunk < Cfg::bn / 64; ++chunk, it.advance()) {
    const uint32_t slot = it.index();
    ring.wait_empty(it);
    const uint32_t full = ring.full(slot);
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

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
