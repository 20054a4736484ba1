// The wgmma grouped GEMM's CTA configuration (grouped_gemm_wgmma_kernel.cuh): tile shape, ring depth, warpgroup
// roles and their registers, and the dynamic shared-memory layout every role addresses — the ring's A and B slots,
// each consumer's fp32 staging rows (which also hold its two TMA store boxes), then the ring's mbarriers — plus
// where a DGATED epilogue entry puts its h boxes inside a slot.
#pragma once

#include <cstdint>

#include "cuda/gemm/gemm_config.h"

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
