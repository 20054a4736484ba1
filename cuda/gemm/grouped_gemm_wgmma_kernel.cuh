// The grouped GEMM tile kernel of sm_90a, bf16 / fp16 in, fp32 accumulators (grouped_gemm.h's semantics, the same
// epilogue code and rounding points as the mma.sync kernel: gemm_tile_parts.cuh), for the operand layouts Op:
//   varlen_m_nk: B [E, n, k] (K-major) with the epilogues STORE and BIAS, or (its own instantiation) GATED;
//   varlen_m_kn: B [E, k, n] (MN-major) with STORE and BIAS, or (its own instantiation) DGATED;
//   varlen_k:    C[e] [m, n] = A_e^T B_e over the group's rows, A [rows, m] and B [rows, n] both MN-major in shared
//                memory, either gathered by row, epilogue STORE (alpha, beta, bf16/fp16/fp32 C); with c_transposed
//                the problem is the caller's transpose and its tiles go to C transposed
//                (store_tile_transposed_by_tma).
//
// This file is the kernel body and its host launcher; each role lives in its own file under wgmma/. One persistent
// CTA per SM walks the tiles (wgmma/tile_scheduler.cuh) with three warpgroups around a ring of operand slots in
// shared memory (wgmma/tile_config.cuh: the configuration and shared layout; wgmma/pipeline.cuh: the ring's
// barriers and the named barriers):
//   producer (warpgroup 0, registers given away): per 64-deep reduction slice, A's and B's tiles into the next slot
//     by TMA boxes and 16-byte cp.async in the 128-byte swizzle (wgmma/producer_loads.cuh); DGATED: after a tile's
//     slices, one more ring entry per 64-column epilogue chunk carrying h's values for it.
//   consumers (warpgroups 1, 2: rows 0..63 and 64..127 of the tile): wgmma m64nBNk16 from the slot's descriptors,
//     then release the slot on its `empty` mbarrier (wgmma/mainloop.cuh); after the last slice, varlen K with
//     beta = 0 into C of the operand dtype, or beta = 1 into an fp32 C, and varlen M's STORE where the consumer's 64
//     rows lie inside the group (WgmmaOperandMaps::c_by_tma), puts its values into boxes in shared memory that TMA
//     stores (or reduce-adds) write while the consumers go on (wgmma/epilogue_tma_store.cuh; varlen M's STORE half
//     then and half under the next tile's main loop: wgmma/epilogue_deferred_store.cuh; GATED's h and a, formed in
//     the registers, the same way: wgmma/epilogue_gated.cuh); every other product goes through a per-warpgroup fp32
//     staging chunk of 64 x 64 in shared memory to the shared epilogues (wgmma/epilogue_staged.cuh), DGATED's
//     reading h from its ring entries (wgmma/epilogue_dgated.cuh).
//
// Schedules (GemmSchedule): cooperative, as above; ping-pong (varlen M, 128x128), the consumers take the CTA's tiles
// in turn, each a whole tile (two m64 products per step) whose epilogue, by TMA stores or the threads, runs under the
// other consumer's main loop.
//
// Preconditions (wgmma_capable checks them): varlen M k > 0, k and n multiples of 8 (the tails zero-filled); B's row
// and group strides multiples of 8 elements; the grid at most the device's SM count (one CTA per SM: ~226 KiB).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/cp_async.cuh"
#include "cuda/common/cuda_check.h"
#include "cuda/common/grid_dependency.cuh"
#include "cuda/common/mbarrier.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/gemm/gemm_tile_parts.cuh"
#include "cuda/gemm/grouped_gemm_wgmma.h"
#include "cuda/gemm/wgmma/epilogue_deferred_store.cuh"
#include "cuda/gemm/wgmma/epilogue_dgated.cuh"
#include "cuda/gemm/wgmma/epilogue_gated.cuh"
#include "cuda/gemm/wgmma/epilogue_staged.cuh"
#include "cuda/gemm/wgmma/epilogue_tma_store.cuh"
#include "cuda/gemm/wgmma/mainloop.cuh"
#include "cuda/gemm/wgmma/pipeline.cuh"
#include "cuda/gemm/wgmma/producer_loads.cuh"
#include "cuda/gemm/wgmma/tile_config.cuh"
#include "cuda/gemm/wgmma/tile_scheduler.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

// Activated: the instantiation for the layout's activation epilogue (B [E, n, k]: GATED; B [E, k, n]: DGATED), with
// no other epilogue's code; otherwise STORE and BIAS (varlen K: STORE). NOTE: one kernel with both carried the
// STORE epilogue's TMA stores into GATED's register allocation, and the up-projection ran 4-8% slower.
template <class T, class Cfg, Operands Op, bool Activated>
__global__ void __launch_bounds__(Cfg::threads, 1)
    grouped_gemm_wgmma_kernel(const GroupedGemmProblem p, const __grid_constant__ WgmmaOperandMaps maps) {
#if MOEKIT_SM90A_ENABLED
  constexpr int BM = Cfg::bm, BK = Cfg::bk, S = Cfg::stages;
  constexpr bool varlen_k = Op == Operands::varlen_k;
  constexpr bool a_mn_major = varlen_k;
  constexpr bool b_mn_major = Op != Operands::varlen_m_nk;
  // Varlen M with A not gathered: A by TMA too (the producer's issue rate and the cp.async latency bound the
  // gathered kernel; TMA boxes take neither).
  const bool a_by_tma = !varlen_k && p.gather != MOEKIT_GEMM_GATHER_A;
  static_assert(!(Activated && varlen_k), "varlen K is STORE only");
  static_assert(!(Cfg::pingpong && varlen_k), "ping-pong runs varlen M");
  // GATED pairs the columns of B [E, n, k]; DGATED reads B [E, k, n] (wgmma_capable).
  constexpr bool gated = Activated && Op == Operands::varlen_m_nk;
  constexpr bool dgated = Activated && Op == Operands::varlen_m_kn;
  extern __shared__ __align__(1024) unsigned char shared[];
  const uint32_t smem = shared_address(shared);
  const uint32_t smem_a = smem + Cfg::a_offset;
  const uint32_t smem_b = smem + Cfg::b_offset;
  const uint32_t full_bars = smem + Cfg::barrier_offset;
  const PipelineBarriers<S> ring{full_bars, full_bars + 8 * S};
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
    // Unpaired: every consumer thread arrives on `empty`; paired: one arrival per consumer warp of either CTA.
    ring.init(a_by_tma ? 1 : 128 + 1, paired ? 2 * 4 * Cfg::slot_readers : 128 * Cfg::slot_readers);
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

  const WgmmaTileWalk<varlen_k, BM, BK> walk(p, paired, rank);
  const bool split_glu = gated && is_gated_activation(p.activation);
  // The epilogue stores C by TMA (WgmmaOperandMaps::c_by_tma: STORE, or GATED's h and a; never DGATED's).
  const bool tma_stores = !dgated && maps.c_by_tma;
  const bool interleaved = p.glu_layout == MOEKIT_GLU_INTERLEAVED;
  const bool concat_pairs = split_glu && !interleaved;

  if (warpgroup == 0) {
    // ---- Producer ----
    setmaxnreg_dec<Cfg::producer_registers(varlen_k)>();
    PipelineState<S> it;
    // All TMA: thread 0 loads every slot; the rest of the warpgroup has nothing to do.
    const int64_t walk_end = a_by_tma && wg_tid != 0 ? 0 : walk.units;
    for (int64_t unit = walk.first_unit; unit < walk_end; unit += walk.unit_step) {
      const WgmmaTile t = walk.tile(unit);
      const int64_t slices = walk.slices(t);
      if constexpr (varlen_k) {
        if (p.gather == MOEKIT_GEMM_GATHER_B)
          load_varlen_k_slices<T, Cfg, false>(p, &maps.b, t, slices, paired, rank, smem_a, smem_b, ring, wg_tid, it);
        else
          load_varlen_k_slices<T, Cfg, true>(p, &maps.b, t, slices, paired, rank, smem_a, smem_b, ring, wg_tid, it);
      } else {
        load_varlen_m_slices<T, Cfg, b_mn_major>(p, maps, t, slices, a_by_tma, concat_pairs,
                                                 paired && walk.peer_group(unit) == t.group, rank, smem_a, smem_b,
                                                 ring, wg_tid, it);
        if (dgated) load_dgated_h<Cfg>(p, &maps.h, t, !a_by_tma, smem_a, smem_b, ring, wg_tid, it);
      }
    }
  } else {
    // ---- Consumers ----
    setmaxnreg_inc<Cfg::consumer_registers(varlen_k)>();
    const int consumer = warpgroup - 1;
    float* staging = reinterpret_cast<float*>(shared + Cfg::staging_offset) + consumer * 64 * Cfg::staging_pitch;
    const DeviceActivation act{p.activation, p.glu_limit};
    float acc[Cfg::accumulators];
    PipelineState<S> it;
    // The STORE and BIAS instantiation of varlen M, cooperative, defers half its TMA-store epilogue into the next
    // tile's main loop (ping-pong's epilogue runs under the other consumer's main loop instead).
    constexpr bool defers_store = !varlen_k && !Activated && !Cfg::pingpong;
    DeferredStore<T, Cfg> deferred;
    unsigned char* const buffers = shared + Cfg::staging_offset + consumer * Cfg::staging_bytes;
    // Ping-pong: the ring entries of a tile (its slices, DGATED's h entries), which the other consumer reads.
    const auto tile_entries = static_cast<uint32_t>((p.k + BK - 1) / BK + (dgated ? Cfg::bn / 64 : 0));
    int64_t turn = 0;
    for (int64_t unit = walk.first_unit; unit < walk.units; unit += walk.unit_step, ++turn) {
      if constexpr (Cfg::pingpong) {
        // The consumers take the CTA's tiles in turn.
        if (turn % 2 != consumer) {
          it.skip(tile_entries);
          continue;
        }
      }
      if constexpr (Cfg::pingpong) {
        if (turn > 0) pingpong_take_turn(consumer);
      }
      const WgmmaTile t = walk.tile(unit);
      const int64_t slices = walk.slices(t);
      consumer_mainloop<T, Cfg, a_mn_major, b_mn_major>(
          acc, slices, a_by_tma, smem_a, smem_b, ring, it, paired, consumer, wg_tid,
          [&](int64_t s) {
            // The previous tile's kept boxes from the second slice on: at the first, each buffer still holds a box
            // the epilogue has just stored (1.00-1.02x against from the first slice).
            if constexpr (defers_store) {
              if (s > 0) deferred.store_next(&maps.c, buffers, consumer, wg_tid);
            }
          },
          [&] {
            // The previous tile's boxes the main loop left (fewer slices than boxes), under the last slice's wgmmas.
            if constexpr (defers_store) deferred.flush(&maps.c, buffers, consumer, wg_tid);
            // Ping-pong: every slice has landed; with DGATED's h entries too, the other consumer may take its turn
            // (its wgmmas queue behind this tile's last).
            if constexpr (Cfg::pingpong) {
              if constexpr (dgated) {
                PipelineState<S> h = it;
                for (int chunk = 0; chunk < Cfg::bn / 64; ++chunk, h.advance()) ring.wait_full(h);
              }
              if (unit + walk.unit_step < walk.units) pingpong_hand_over(consumer);
            }
          });
      // The first row of this consumer's accumulators: cooperative its 64 rows, ping-pong the whole tile.
      const int64_t first_row = t.m0 + (Cfg::pingpong ? 0 : 64 * consumer);
      if constexpr (dgated) {
        // ---- DGATED by the threads: 64-column chunks through the staging rows, h from the ring ----
        // The dA . a of each of this thread's rows per 64-column chunk, with the rows' score scales read once per
        // tile. NOTE: this choice between dgated_chunks' two copies, and `item`, stay in the kernel body: moved into
        // a function of their own, they compiled to other machine code.
        const int item = wg_tid % 8;
        float row_scales[Cfg::row_blocks * 64 / 16] = {};
        load_dgated_row_scales<Cfg>(p, t, first_row, wg_tid, row_scales);
        const auto chunks = [&](auto swiglu_concat) {
          dgated_chunks<T, Cfg, decltype(swiglu_concat)::value>(p, act, acc, staging, shared, smem, smem_a, smem_b,
                                                                ring, it, paired, t, first_row, interleaved, item,
                                                                consumer, wg_tid, row_scales);
        };
        if (act.kind == MOEKIT_ACT_SWIGLU && !interleaved && p.alpha == 1.0f)
          chunks(std::true_type{});
        else
          chunks(std::false_type{});
      } else {
#pragma unroll
        for (int block = 0; block < Cfg::row_blocks; ++block) {
          const float(&block_acc)[Cfg::bn / 2] = row_block_accumulators<Cfg>(acc, block);
          const int row_block = Cfg::pingpong ? block : consumer;
          const int64_t block_row = first_row + 64 * block;
          // ---- Epilogue by TMA stores (maps.c_by_tma; varlen M: these 64 rows wholly inside the group) ----
          const bool by_tma = tma_stores && (varlen_k || block_row + 64 <= t.m_end);
          if constexpr (defers_store) {
            if (by_tma) {
              deferred.take(p, &maps.c, block_acc, t, buffers, consumer, wg_tid);
              continue;
            }
          }
          // The TMA boxes take turns on two buffers inside this consumer's staging rows, and a row block may end on
          // either (fewer boxes at the last column tile), so a block's epilogue, by TMA or by the threads, starts once
          // every earlier store has read its buffer (long since: a mainloop or a row block ago).
          if (tma_stores && wg_tid == 0) bulk_wait_group_read<0>();
          if (by_tma) {
            if constexpr (gated)
              store_gated_tile_by_tma<T, Cfg>(p, maps, block_acc, buffers, t, row_block, consumer, wg_tid);
            else if (varlen_k && p.c_fp32)
              store_tile_by_tma<float, Cfg>(p, &maps.c, block_acc, buffers, t, row_block, consumer, wg_tid);
            else if (varlen_k && p.c_transposed)
              store_tile_transposed_by_tma<T, Cfg>(p, &maps.c, block_acc, buffers, t, consumer, wg_tid);
            else
              store_tile_by_tma<T, Cfg>(p, &maps.c, block_acc, buffers, t, row_block, consumer, wg_tid);
            continue;
          }
          // ---- Epilogue by the threads: 64-column chunks through the staging rows ----
          store_tile_by_threads<T, Cfg, varlen_k, gated>(p, act, block_acc, staging, t, block_row, split_glu,
                                                         interleaved, consumer, wg_tid);
        }
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
template <int32_t Dtype, GemmTile Tile, Operands Op, bool Activated, GemmSchedule Schedule>
void launch_wgmma_tiles(const GroupedGemmProblem& p, const WgmmaOperandMaps& maps, int sm_count, bool paired,
                        cudaStream_t stream) {
  using T = typename StorageFor<Dtype>::type;
  using Cfg = typename WgmmaTileFor<Tile, Schedule>::type;
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
