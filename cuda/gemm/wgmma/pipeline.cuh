// The wgmma grouped GEMM's synchronisation (grouped_gemm_wgmma_kernel.cuh): the ring of Cfg::stages operand slots
// between the producer warpgroup and the consumers — where a role stands in it (PipelineState: slot index and phase
// parity), each slot's `full` and `empty` mbarriers and the consumers' release of a slot, alone or paired across a
// cluster of 2 — the named barriers (bar.sync ids) of the CTA, and ping-pong's turns on the ring.
#pragma once

#include <cstdint>

#include "cuda/common/mbarrier.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

// The kernel's named barriers (bar.sync ids; 0 is __syncthreads, 1 is free). Each consumer warpgroup's 128 threads
// synchronise alone on their own id around their staging rows and TMA store boxes, so the other consumer and the
// producer go on.
// Ping-pong: the hand-off of the ring from one consumer to the other (pingpong_hand_off).
enum class NamedBarrier : int {
  consumer0_epilogue = 2,  // consumer warpgroup 0; consumer c's is consumer0_epilogue + c
  consumer1_epilogue = 3,
  hand_off_to_consumer0 = 4,  // consumer c's is hand_off_to_consumer0 + c
  hand_off_to_consumer1 = 5,
};
static_assert(static_cast<int>(NamedBarrier::consumer1_epilogue) ==
                      static_cast<int>(NamedBarrier::consumer0_epilogue) + 1 &&
                  static_cast<int>(NamedBarrier::hand_off_to_consumer1) ==
                      static_cast<int>(NamedBarrier::hand_off_to_consumer0) + 1,
              "consumer c's barrier ids are consumer0_epilogue + c and hand_off_to_consumer0 + c");

// Consumer `consumer`'s 128 threads wait for each other (NamedBarrier::consumer0_epilogue + consumer).
__device__ __forceinline__ void consumer_barrier_sync(int consumer) {
  named_barrier_sync(static_cast<int>(NamedBarrier::consumer0_epilogue) + consumer, 128);
}

// Ping-pong's turns on the ring: a consumer starts a tile's main loop once the other has waited for every entry of
// its own previous tile (take_turn), and hands the ring over once it has waited for all of its tile's (hand_over).
// NOTE: the ring's waits go by phase parity, which cannot tell a slot's fill for entry c from that for c - 2 Stages,
// so no consumer may wait for entry c before entry c - Stages has landed; a consumer that skipped the other's tile
// would otherwise take that tile's data for its own. The turns also keep the tensor cores to one main loop at a
// time, the other consumer's epilogue running beside it.
__device__ __forceinline__ void pingpong_take_turn(int consumer) {
  named_barrier_sync(static_cast<int>(NamedBarrier::hand_off_to_consumer0) + consumer, 256);
}
__device__ __forceinline__ void pingpong_hand_over(int consumer) {
  named_barrier_arrive(static_cast<int>(NamedBarrier::hand_off_to_consumer0) + (consumer ^ 1), 256);
}

// Where a role stands in the ring of Stages slots: `count` ring uses so far, across tiles (the producer and each
// consumer keep their own and walk the same entries in the same order). Use `count` takes slot count % Stages, in
// the barrier phase of parity (count / Stages) & 1. NOTE: one counter, index and phase derived from it: an index
// and a phase kept apart (advance: a compare, a reset and a flip) compiled to other machine code for this kernel.
template <int Stages>
struct PipelineState {
  uint32_t count = 0;
  __device__ __forceinline__ uint32_t index() const { return count % Stages; }
  __device__ __forceinline__ uint32_t phase() const { return (count / Stages) & 1; }
  // The slot of the use before this one.
  __device__ __forceinline__ uint32_t previous_index() const { return (count - 1) % Stages; }
  __device__ __forceinline__ void advance() { ++count; }
  // Past `uses` entries another role reads (ping-pong: the other consumer's tile).
  __device__ __forceinline__ void skip(uint32_t uses) { count += uses; }
};

// The ring's mbarriers in shared memory, 8 bytes each: full[Stages] (the operands of a slot landed) and
// empty[Stages] (a slot read by the consumers).
template <int Stages>
struct PipelineBarriers {
  uint32_t full_bars;   // [Stages] operands of a slot landed
  uint32_t empty_bars;  // [Stages] a slot read by the consumers

  __device__ __forceinline__ uint32_t full(uint32_t slot) const { return full_bars + 8 * slot; }
  __device__ __forceinline__ uint32_t empty(uint32_t slot) const { return empty_bars + 8 * slot; }

  // Sets up every slot's barriers (one thread, before any use; mbarrier_init_fence and a block-wide barrier follow).
  __device__ __forceinline__ void init(uint32_t full_arrivals, uint32_t empty_arrivals) const {
#pragma unroll
    for (int s = 0; s < Stages; ++s) {
      mbarrier_init(full_bars + 8 * s, full_arrivals);
      mbarrier_init(empty_bars + 8 * s, empty_arrivals);
    }
  }

  // The producer: waits until the consumers have released the slot of `state` (a fresh ring counts as released).
  // NOTE: here and in wait_full, slot and parity are formed before the barrier's address, as the loops these waits
  // replace formed them: in the other order the consumers' main loop compiled to other machine code.
  __device__ __forceinline__ void wait_empty(const PipelineState<Stages>& state) const {
    const uint32_t slot = state.index(), parity = state.phase();
    mbarrier_wait(empty(slot), parity ^ 1);
  }

  // A consumer: waits until the operands of the slot of `state` have landed.
  __device__ __forceinline__ void wait_full(const PipelineState<Stages>& state) const {
    const uint32_t slot = state.index(), parity = state.phase();
    mbarrier_wait(full(slot), parity);
  }

  // Hands ring slot `slot` back to the producers: unpaired every thread arrives on this CTA's barrier; paired,
  // once the warp is done, its lane 0 arrives on the barrier of both CTAs (either producer may overwrite it).
  __device__ __forceinline__ void release(uint32_t slot, bool paired, int wg_tid) const {
    const uint32_t bar = empty(slot);
    if (!paired) {
      mbarrier_arrive(bar);
      return;
    }
    __syncwarp();
    if (wg_tid % 32 == 0) {
      mbarrier_arrive_cluster(bar, 0, 1);
      mbarrier_arrive_cluster(bar, 1, 1);
    }
  }
};

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
