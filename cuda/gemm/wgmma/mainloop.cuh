// The wgmma grouped GEMM's consumer main loop (grouped_gemm_wgmma_kernel.cuh): per reduction slice of a tile, wait
// for the slot's operands, issue the warpgroup's wgmma m64nBNk16 from the slot's descriptors (K-major or MN-major
// per operand), and release the slot once the wgmma reading it has retired, with one slice's wgmmas in flight while
// the next slice's are issued. The accumulators end the loop complete and fenced.
#pragma once

#include <cstdint>

#include "cuda/common/mbarrier.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/gemm/wgmma/pipeline.cuh"
#include "cuda/gemm/wgmma/tile_config.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

// One consumer's product over `slices` reduction slices into acc (cooperative: its 64 rows of the tile, consumer 0
// rows 0..63, consumer 1 rows 64..127; ping-pong: all 128 rows, two m64 products per step); none (varlen K over an
// empty group) leaves acc zero. `it` is the consumer's place in the
// ring, across tiles. under_slice(s) runs after slice s's wgmmas are issued, before waiting on the previous slice's;
// under_last() after the last slice's are issued, before waiting on them (epilogue work of the previous tile that
// the tensor cores' work hides).
template <class T, class Cfg, bool a_mn_major, bool b_mn_major, class UnderSlice, class UnderLast>
__device__ __forceinline__ void consumer_mainloop(float (&acc)[Cfg::accumulators], int64_t slices, bool a_by_tma,
                                                  uint32_t smem_a, uint32_t smem_b,
                                                  const PipelineBarriers<Cfg::stages>& ring,
                                                  PipelineState<Cfg::stages>& it, bool paired, int consumer,
                                                  int wg_tid, UnderSlice&& under_slice, UnderLast&& under_last) {
  constexpr int BN = Cfg::bn, BK = Cfg::bk;
  if (slices == 0) {
    // varlen K over an empty group: the product is 0 and C becomes beta C.
#pragma unroll
    for (int i = 0; i < Cfg::accumulators; ++i) acc[i] = 0.0f;
  }
  for (int64_t s = 0; s < slices; ++s, it.advance()) {
    const uint32_t slot = it.index();
    ring.wait_full(it);
    // NOTE: A arrived by cp.async (generic proxy); wgmma reads shared memory through the async proxy.
    if (!a_by_tma) fence_proxy_async_shared();
    const uint32_t b_tile = smem_b + slot * Cfg::b_stage_bytes;
    wgmma_fence_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      // K-major: a 16-deep step is 32 bytes along each row; MN-major: 16 rows of 128 bytes.
      const uint64_t b_desc = b_mn_major ? wgmma_mnmajor_sw128_descriptor(b_tile + 2048 * kk, Cfg::mn_block_bytes)
                                         : wgmma_kmajor_sw128_descriptor(b_tile + 32 * kk);
#pragma unroll
      for (int block = 0; block < Cfg::row_blocks; ++block) {
        // K-major A: the block's 64 rows of 128 bytes; MN-major A (varlen K): its 8 KiB block of 64 columns.
        const int a_block = Cfg::pingpong ? block : consumer;
        const uint32_t a_tile =
            smem_a + slot * Cfg::a_stage_bytes + a_block * (a_mn_major ? Cfg::mn_block_bytes : 64 * 128);
        const uint64_t a_desc = a_mn_major ? wgmma_mnmajor_sw128_descriptor(a_tile + 2048 * kk, Cfg::mn_block_bytes)
                                           : wgmma_kmajor_sw128_descriptor(a_tile + 32 * kk);
        wgmma_m64k16<BN, T, a_mn_major, b_mn_major>(row_block_accumulators<Cfg>(acc, block), a_desc, b_desc,
                                                    s > 0 || kk > 0);
      }
    }
    wgmma_commit();
    under_slice(s);
    // One slice's wgmmas stay in flight while the next slice's are issued: wait for the previous slice's,
    // then hand its slot back to the producer.
    wgmma_wait<1>();
    if (s > 0) ring.release(it.previous_index(), paired, wg_tid);
  }
  under_last();
  wgmma_wait<0>();
  wgmma_fence_accumulators(acc);
  if (slices > 0) ring.release(it.previous_index(), paired, wg_tid);
}

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
