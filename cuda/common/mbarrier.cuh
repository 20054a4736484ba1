// Shared-memory barriers of sm_90 (mbarrier): a phase completes when the expected number of arrivals has arrived
// and every byte announced with expect_tx has landed. Producers and consumers of a ring of buffers wait on a
// phase by its parity, so a barrier is reused round after round without re-initialisation. Named barriers
// (bar.sync with an id and a thread count) synchronise one role's warps without stopping the others.
#pragma once

#include <cstdint>

namespace moekit {
inline namespace v0 {
namespace cuda {

// Sets up the barrier at shared address `bar` for `arrivals` arrivals per phase (one thread, before any use).
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}

// Makes the initialised barriers visible to the other threads and to the asynchronous (TMA) unit; a block-wide
// barrier must follow before anyone waits on them.
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival.
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// One arrival that also announces `bytes` more of asynchronous copies (TMA) to complete this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// One arrival, made when every cp.async this thread has issued so far has landed (counts toward `arrivals`).
__device__ __forceinline__ void mbarrier_arrive_on_cp_async(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// `count` arrivals on the barrier at the same shared offset in CTA `rank` of this cluster (this CTA included).
// NOTE: the default (release at CTA scope), not .release.cluster: a ring slot is released after wgmma.wait_group
// has retired its reads, so no cluster-wide fence is needed, and that fence (a MEMBAR per consumer warp and slice)
// was the paired kernel's top stall.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t bar, uint32_t rank, uint32_t count) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote], %2;\n}\n" ::"r"(bar),
      "r"(rank), "r"(count)
      : "memory");
}

// The number of CTAs in this CTA's cluster (1 for a launch without clusters).
__device__ __forceinline__ uint32_t cluster_num_ctas() {
  uint32_t count;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(count));
  return count;
}

// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// Every thread of every CTA of the cluster arrives and waits (release / acquire at cluster scope).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// Blocks until the phase of parity `parity` has completed (a fresh barrier counts parity 1 as completed).
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

// Barrier `id` (1..15; 0 is __syncthreads) over `threads` threads, a multiple of 32.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrives on barrier `id` over `threads` threads without waiting (the threads of a named_barrier_sync on it complete
// it).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Orders this thread's generic-proxy view of shared memory (cp.async, st.shared) before its later
// asynchronous-proxy accesses (wgmma operand reads, TMA).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
