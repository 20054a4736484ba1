// The wgmma grouped GEMM's CTA configuration (grouped_gemm_wgmma_kernel.cuh): tile shape, ring depth, warpgroup
// roles and their registers, and the dynamic shared-memory layout every role addresses — the ring's A and B slots,
// each consumer's fp32 staging rows (which also hold its two TMA store boxes), then the ring's mbarriers — plus
// where a DGATED epilogue entry puts its h boxes inside a slot. Cooperative: each consumer warpgroup holds 64 rows of
// the tile; ping-pong: each holds a whole tile of its own, two 64-row blocks of accumulators.
#pragma once

#include <cstdint>

#include "cuda/gemm/gemm_config.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

template <int BN, GemmSchedule Schedule = GemmSchedule::cooperative>
struct WgmmaTileConfig {
  static constexpr bool pingpong = Schedule == GemmSchedule::pingpong;
  static constexpr int bm = 128;
  static constexpr int bn = BN;
  static constexpr int bk = 64;  // one 128-byte swizzle row of 16-bit values
  // Ping-pong's 128x128 slots are a third smaller than 128x256's: two more fit, for the DGATED h entries the
  // epilogue holds while the other consumer's slices stream in.
  static constexpr int stages = pingpong ? 6 : 4;
  static constexpr int consumer_warpgroups = 2;
  // 64-row blocks of the tile a consumer computes, its accumulators (per thread), and the consumers reading each
  // ring slot (so releasing it).
  static constexpr int row_blocks = pingpong ? 2 : 1;
  static constexpr int accumulators = BN / 2 * row_blocks;
  static constexpr int slot_readers = pingpong ? 1 : consumer_warpgroups;
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
  static_assert(bm == 64 * (pingpong ? row_blocks : consumer_warpgroups),
                "a consumer warpgroup owns 64 rows of the tile (cooperative) or all of them (ping-pong)");
  static_assert(!pingpong || BN == 128, "a ping-pong consumer holds its 128 x BN accumulators in 128 registers");
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

template <GemmTile Tile, GemmSchedule Schedule>
struct WgmmaTileFor;
template <>
struct WgmmaTileFor<GemmTile::m128_n256, GemmSchedule::cooperative> {
  using type = WgmmaTileConfig<256>;
};
template <>
struct WgmmaTileFor<GemmTile::m128_n128, GemmSchedule::cooperative> {
  using type = WgmmaTileConfig<128>;
};
template <>
struct WgmmaTileFor<GemmTile::m128_n128, GemmSchedule::pingpong> {
  using type = WgmmaTileConfig<128, GemmSchedule::pingpong>;
};

// Row block `block` (rows 64 block..+63 of the tile) of a consumer's accumulators (N: every block's, or one's).
template <class Cfg, int N>
__device__ __forceinline__ float (&row_block_accumulators(float (&acc)[N], int block))[Cfg::bn / 2] {
  static_assert(N % (Cfg::bn / 2) == 0, "whole row blocks");
  return *reinterpret_cast<float(*)[Cfg::bn / 2]>(acc + block * (Cfg::bn / 2));
}
template <class Cfg, int N>
__device__ __forceinline__ const float (&row_block_accumulators(const float (&acc)[N], int block))[Cfg::bn / 2] {
  static_assert(N % (Cfg::bn / 2) == 0, "whole row blocks");
  return *reinterpret_cast<const float(*)[Cfg::bn / 2]>(acc + block * (Cfg::bn / 2));
}

// The shared addresses of the two h boxes a DGATED epilogue entry of ring slot `slot` holds: the slot's A tile
// (16 KiB, one 64 x 128 box) and the first 16 KiB of its B tile.
template <class Cfg>
__device__ __forceinline__ uint32_t dgated_h_box(uint32_t smem_a, uint32_t smem_b, uint32_t slot, int box) {
  return box == 0 ? smem_a + slot * Cfg::a_stage_bytes : smem_b + slot * Cfg::b_stage_bytes;
}

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
