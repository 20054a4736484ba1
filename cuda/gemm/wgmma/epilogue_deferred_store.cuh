// The wgmma grouped GEMM's varlen-M STORE by TMA with half of it deferred (grouped_gemm_wgmma_kernel.cuh, the
// STORE and BIAS instantiation): DeferredStore stores the first half of a tile's boxes after its main loop and
// the rest one per reduction slice of the next tile's main loop (mainloop.cuh's hooks), from the box pieces of
// epilogue_tma_store.cuh.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/gemm/wgmma/epilogue_tma_store.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

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
    // The last column tile's partial box too (its columns past n clipped by the map).
    boxes = static_cast<int>((min(p.n - n0, static_cast<int64_t>(Cfg::bn)) + 63) / 64);
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

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
