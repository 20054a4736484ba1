// The wgmma grouped GEMM's GATED epilogue by TMA store (grouped_gemm_wgmma_kernel.cuh, the GATED instantiation with
// WgmmaOperandMaps::c_by_tma): h and a = act(h) formed in the registers from a consumer's gate and up accumulators
// and stored in boxes (epilogue_tma_store.cuh's pieces), with the rounding points of the threads' epilogue_gated_glu.
#pragma once

#include <cstdint>

#include "cuda/common/activation.cuh"
#include "cuda/gemm/grouped_gemm_wgmma.h"
#include "cuda/gemm/wgmma/epilogue_tma_store.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

// GATED with h and a written by TMA (maps.c_by_tma: a gated activation, CONCAT, alpha = 1, no bias, I a multiple
// of 64), rows 64 row_block..+63 of the tile (a consumer's; acc their accumulators) wholly inside the tile's group.
// Gate column c and up column c of the tile's activation columns are product blocks i and BN / 16 + i, held by the
// same thread, so a = act(h) is formed in registers: no fp32 staging, no row loop. Per 64 activation columns j0..
// three boxes (epilogue_box_by_tma): h's gate columns (C at j0), h's up columns (C at I + j0) and a's (maps.act at
// j0), rounded where epilogue_gated_glu rounds them (a from the rounded h), so the bits are those of the threads'
// epilogue. The activation kind is switched once per up box, where a is formed (each kind's copy of that code is the
// only one a run executes).
template <class T, class Cfg>
__device__ __forceinline__ void store_gated_tile_by_tma(const GroupedGemmProblem& p, const WgmmaOperandMaps& maps,
                                                        const float (&acc)[Cfg::bn / 2], unsigned char* buffers,
                                                        const WgmmaTile& t, int row_block, int consumer,
                                                        int wg_tid) {
  constexpr int BN = Cfg::bn;
  const auto y = static_cast<int32_t>(t.m0 + 64 * row_block);
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

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
