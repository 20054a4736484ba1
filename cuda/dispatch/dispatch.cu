// Dispatch metadata on the GPU (docs/math.md section 2): a STABLE counting sort of the valid pairs by local expert.
//
// The pairs are cut into chunks of `chunk_pairs` consecutive pairs, one block each; inside a block, warp w owns
// the 256 consecutive pairs [w * 256, (w + 1) * 256) of the chunk and reads them 32 at a time (lane l takes the
// l-th). Three kernels:
//   1. count_chunk_pairs:   counts[c][e] = pairs of chunk c routed to local expert e.
//   2. prefix_over_chunks:  counts[c][e] becomes the pairs of expert e in chunks < c; totals[e] = all of them.
//   3. scatter_ranked_pairs: every block scans totals into the expert starts (block 0 writes expert_offsets),
//      ranks its pairs stably inside the chunk (per-warp counters + __match_any_sync) and writes
//        position = start[e] + counts[c][e] + (pairs of e in earlier warps of the chunk) + rank in the warp.
// A pair's position thus counts exactly the valid pairs before it (same expert, smaller p) plus the pairs of
// smaller experts: the reference's stable sort. Everything is integer arithmetic in a fixed order, so the result
// is the same on every run; the only atomics (shared-memory counts in kernel 1) add integers.
// Kernels 2 and 3 are launched as programmatic dependents (cuda/common/grid_dependency.cuh): they start while
// their predecessor runs, and kernel 3 ranks its pairs (which needs only the ids) before it waits.
//
// Preconditions: P = pair_slots < 2^31 (outputs are int32); E fits dispatch_layout's shared-memory budget; the
// workspace holds dispatch_layout(E, P bound).workspace_bytes. Rows >= Pv of gather_idx and pair_idx are never
// written; grouped_pos is written in full (-1 for dropped pairs and for general-routing slots past tok_offsets[T]).
#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/common/grid_dependency.cuh"
#include "cuda/dispatch/dispatch.h"
#include "cuda/dispatch/pairs.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace {

constexpr int kLanes = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpPairs = kLanes * kDispatchItemsPerLane;  // consecutive pairs one warp owns in a chunk
// The prefix kernel: a block takes 32 experts (one per lane) and splits the chunks among its warps.
constexpr int kPrefixWarps = 8;

static_assert(kDispatchMaxWarps * kWarpPairs <= 65535,
              "the scatter kernel's 16-bit per-warp counters must hold a whole chunk's pairs");
static_assert(kDispatchMaxWarps <= kLanes, "the block scan combines one partial sum per warp within one warp");

__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x) % kLanes; }
__device__ __forceinline__ int warp_id() { return static_cast<int>(threadIdx.x) / kLanes; }

// First pair of the warp's 256 in the chunk of this block (64-bit: the last chunk may start near 2^31).
__device__ __forceinline__ int64_t warp_first_pair(int64_t chunk_pairs) {
  return static_cast<int64_t>(blockIdx.x) * chunk_pairs + static_cast<int64_t>(warp_id()) * kWarpPairs;
}

// ---------------------------------------------------------------------------------------------------------------
// 1. Pairs per (chunk, expert)
// ---------------------------------------------------------------------------------------------------------------
// Shared memory: histogram [E] int32.
__global__ void count_chunk_pairs(DispatchProblem pr, int64_t chunk_pairs,
                                  int32_t* counts /* [chunks, E] */) {
  extern __shared__ int32_t histogram[];
  allow_next_grid();
  const int experts = static_cast<int>(pr.experts);
  for (int e = threadIdx.x; e < experts; e += blockDim.x) histogram[e] = 0;
  __syncthreads();

  const int32_t pairs = dispatch_pair_count(pr);
  const int64_t first = warp_first_pair(chunk_pairs);
#pragma unroll
  for (int j = 0; j < kDispatchItemsPerLane; ++j) {
    int64_t p = first + j * kLanes + lane_id();
    int32_t e = p < pairs ? dispatch_local_expert(pr, static_cast<int32_t>(p)) : -1;
    // NOTE: one shared atomic per distinct expert of the 32 pairs: with every token on one expert, lanes would
    // otherwise serialise on a single address.
    unsigned peers = __match_any_sync(kFullMask, e);
    if (e >= 0 && lane_id() == __ffs(peers) - 1) atomicAdd(&histogram[e], __popc(peers));
  }
  __syncthreads();

  int32_t* row = counts + static_cast<int64_t>(blockIdx.x) * experts;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) row[e] = histogram[e];
}

// ---------------------------------------------------------------------------------------------------------------
// 2. Exclusive prefix of every expert's counts over the chunks, and the expert totals
// ---------------------------------------------------------------------------------------------------------------
// Block: kPrefixWarps warps; lane x takes expert blockIdx.x * 32 + x (coalesced rows of counts), warp w takes a
// contiguous slice of the chunks.
__global__ void __launch_bounds__(kPrefixWarps * kLanes)
    prefix_over_chunks(int32_t* counts /* [chunks, E] in: counts, out: exclusive prefix over chunks */,
                       int32_t* totals /* [E] */, int chunks, int experts) {
  __shared__ int32_t slice_sums[kPrefixWarps][kLanes];
  allow_next_grid();
  wait_for_previous_grid();  // counts come from count_chunk_pairs
  const int lane = lane_id();
  const int warp = warp_id();
  const int e = static_cast<int>(blockIdx.x) * kLanes + lane;
  const bool active = e < experts;
  const int per_warp = (chunks + kPrefixWarps - 1) / kPrefixWarps;
  const int c_begin = min(chunks, warp * per_warp);
  const int c_end = min(chunks, c_begin + per_warp);

  int32_t sum = 0;
  if (active)
    for (int c = c_begin; c < c_end; ++c) sum += counts[static_cast<int64_t>(c) * experts + e];
  slice_sums[warp][lane] = sum;
  __syncthreads();

  int32_t run = 0;
  for (int w = 0; w < warp; ++w) run += slice_sums[w][lane];
  if (active) {
    for (int c = c_begin; c < c_end; ++c) {
      int32_t* cell = counts + static_cast<int64_t>(c) * experts + e;
      int32_t v = *cell;
      *cell = run;
      run += v;
    }
    if (warp == kPrefixWarps - 1) totals[e] = run;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// 3. Stable ranks and the scatter
// ---------------------------------------------------------------------------------------------------------------
// Exclusive scan of data[0, n) in shared memory by the whole block (at most 32 warps); returns the total.
// Thread t scans the contiguous segment t of the array, so the order of the additions is fixed.
__device__ int32_t block_exclusive_scan(int32_t* data, int n, int32_t* warp_sums /* [32] */) {
  const int lane = lane_id();
  const int warp = warp_id();
  const int warps = static_cast<int>(blockDim.x) / kLanes;
  const int segment = (n + static_cast<int>(blockDim.x) - 1) / static_cast<int>(blockDim.x);
  const int lo = min(n, static_cast<int>(threadIdx.x) * segment);
  const int hi = min(n, lo + segment);
  int32_t sum = 0;
  for (int i = lo; i < hi; ++i) sum += data[i];
  int32_t inclusive = sum;
  for (int d = 1; d < kLanes; d *= 2) {
    int32_t v = __shfl_up_sync(kFullMask, inclusive, d);
    if (lane >= d) inclusive += v;
  }
  if (lane == kLanes - 1) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int32_t w_inclusive = lane < warps ? warp_sums[lane] : 0;
    for (int d = 1; d < kLanes; d *= 2) {
      int32_t v = __shfl_up_sync(kFullMask, w_inclusive, d);
      if (lane >= d) w_inclusive += v;
    }
    if (lane < warps) warp_sums[lane] = w_inclusive;
  }
  __syncthreads();
  int32_t offset = (warp > 0 ? warp_sums[warp - 1] : 0) + inclusive - sum;
  const int32_t total = warp_sums[warps - 1];
  for (int i = lo; i < hi; ++i) {
    int32_t v = data[i];
    data[i] = offset;
    offset += v;
  }
  __syncthreads();
  return total;
}

// Shared memory (dispatch_scatter_shared_bytes):
//   expert_base [E] int32        start of expert e's rows for this chunk
//   warp_sums   [32] int32       the block scan's per-warp partials
//   warp_counts [warps, E] u16   pairs of expert e seen by warp w, then the pairs of e in warps < w
__global__ void scatter_ranked_pairs(DispatchProblem pr, int64_t chunk_pairs,
                                     const int32_t* chunk_prefix /* [chunks, E] */,
                                     const int32_t* totals /* [E] */) {
  extern __shared__ __align__(16) unsigned char shared[];
  const int experts = static_cast<int>(pr.experts);
  const int warps = static_cast<int>(blockDim.x) / kLanes;
  int32_t* expert_base = reinterpret_cast<int32_t*>(shared);
  int32_t* warp_sums = expert_base + experts;
  uint16_t* warp_counts = reinterpret_cast<uint16_t*>(warp_sums + kLanes);
  const int lane = lane_id();
  const int warp = warp_id();

  for (int i = threadIdx.x; i < warps * experts; i += blockDim.x) warp_counts[i] = 0;
  __syncthreads();

  // Rank inside the warp: the warp's earlier pairs of the same expert (its counter) plus the lower lanes among
  // the 32 pairs read now with the same expert (__match_any_sync groups them; the lowest lane updates the counter).
  const int32_t pairs = dispatch_pair_count(pr);
  const int64_t first = warp_first_pair(chunk_pairs);
  uint16_t* my_counts = warp_counts + warp * experts;
  const unsigned lower_lanes = (1u << lane) - 1u;
  int32_t expert[kDispatchItemsPerLane];
  int32_t rank[kDispatchItemsPerLane];
#pragma unroll
  for (int j = 0; j < kDispatchItemsPerLane; ++j) {
    int64_t p = first + j * kLanes + lane;
    int32_t e = p < pairs ? dispatch_local_expert(pr, static_cast<int32_t>(p)) : -1;
    unsigned peers = __match_any_sync(kFullMask, e);
    int leader = __ffs(peers) - 1;
    int32_t seen = 0;
    if (e >= 0 && lane == leader) {
      seen = my_counts[e];
      my_counts[e] = static_cast<uint16_t>(seen + __popc(peers));
    }
    seen = __shfl_sync(kFullMask, seen, leader);
    expert[j] = e;
    rank[j] = seen + __popc(peers & lower_lanes);
    // NOTE: the next leader of the same expert may be another lane; it must see this counter update.
    __syncwarp();
  }

  // Everything below reads what prefix_over_chunks wrote; outputs are written only after the wait too.
  wait_for_previous_grid();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) expert_base[e] = totals[e];
  __syncthreads();  // also orders every warp's counter updates before the prefix over warps below
  const int32_t valid = block_exclusive_scan(expert_base, experts, warp_sums);
  const int32_t* prefix_row = chunk_prefix + static_cast<int64_t>(blockIdx.x) * experts;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int32_t start = expert_base[e];
    if (blockIdx.x == 0) pr.expert_offsets[e] = start;
    expert_base[e] = start + prefix_row[e];
    int32_t run = 0;
    for (int w = 0; w < warps; ++w) {
      int32_t count = warp_counts[w * experts + e];
      warp_counts[w * experts + e] = static_cast<uint16_t>(run);
      run += count;
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) pr.expert_offsets[experts] = valid;
  __syncthreads();

#pragma unroll
  for (int j = 0; j < kDispatchItemsPerLane; ++j) {
    int64_t p = first + j * kLanes + lane;
    if (p >= pr.pair_slots) continue;
    int32_t e = expert[j];
    if (e < 0) {
      pr.grouped_pos[p] = -1;
      continue;
    }
    int32_t position = expert_base[e] + my_counts[e] + rank[j];
    pr.gather_idx[position] = dispatch_pair_token(pr, static_cast<int32_t>(p));
    pr.pair_idx[position] = static_cast<int32_t>(p);
    pr.grouped_pos[p] = position;
  }
}

// Launches `kernel` as a programmatic dependent of the previous kernel on `stream` (it calls
// wait_for_previous_grid() before reading that kernel's results).
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), unsigned blocks, int threads, size_t shared_bytes,
                      cudaStream_t stream, const char* name, Args... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  check_cuda(cudaLaunchKernelEx(&config, kernel, args...), name);
}

void allow_shared_bytes(const void* kernel, size_t bytes) {
  // NOTE: above 48 KiB of dynamic shared memory a kernel must opt in.
  if (bytes > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
               "dispatch: cudaFuncSetAttribute");
}

}  // namespace

void launch_dispatch(const DispatchProblem& problem, const DispatchLayout& layout, void* workspace,
                     cudaStream_t stream) {
  const int64_t chunks =
      problem.pair_slots > 0 ? (problem.pair_slots + layout.chunk_pairs - 1) / layout.chunk_pairs : 1;
  auto* base = static_cast<unsigned char*>(workspace);
  auto* counts = reinterpret_cast<int32_t*>(base + layout.counts_offset);
  auto* totals = reinterpret_cast<int32_t*>(base + layout.totals_offset);
  const int threads = layout.warps * kLanes;
  const int experts = static_cast<int>(problem.experts);

  allow_shared_bytes(reinterpret_cast<const void*>(&count_chunk_pairs), layout.count_shared_bytes);
  count_chunk_pairs<<<static_cast<unsigned>(chunks), threads, layout.count_shared_bytes, stream>>>(
      problem, layout.chunk_pairs, counts);
  check_launch("dispatch: count_chunk_pairs");

  const unsigned prefix_blocks = static_cast<unsigned>((experts + kLanes - 1) / kLanes);
  launch_dependent(prefix_over_chunks, prefix_blocks, kPrefixWarps * kLanes, 0, stream,
                   "dispatch: prefix_over_chunks", counts, totals, static_cast<int>(chunks), experts);

  allow_shared_bytes(reinterpret_cast<const void*>(&scatter_ranked_pairs), layout.scatter_shared_bytes);
  launch_dependent(scatter_ranked_pairs, static_cast<unsigned>(chunks), threads, layout.scatter_shared_bytes, stream,
                   "dispatch: scatter_ranked_pairs", problem, layout.chunk_pairs,
                   static_cast<const int32_t*>(counts), static_cast<const int32_t*>(totals));
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
