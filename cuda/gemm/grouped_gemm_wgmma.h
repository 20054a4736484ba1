// Host-callable pieces of the sm_90a grouped GEMM path (grouped_gemm_wgmma_kernel.cuh): the TMA descriptor of the
// weight operand and the persistent tile kernel's launch. run_grouped_gemm calls them when the plan chose
// GemmPath::wgmma (src/gemm_tiling.h). Plain C++.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/grouped_gemm.h"
#include "gemm_tiling.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

// The TMA map of B [E, n, k] (K-major, varlen M): rank 3 (k, n, E), boxes of 64 x `box_rows` x 1 in the 128-byte
// swizzle, zeros outside the tensor. The driver's encoder is reached through the runtime
// (cudaGetDriverEntryPointByVersion), so nothing links libcuda. Throws on a descriptor the driver refuses.
CUtensorMap make_weight_tensor_map(const GroupedGemmProblem& p, int box_rows);

// Enqueues the persistent wgmma tile kernel over the row-tile list run_grouped_gemm built: min(tiles bound,
// sm_count) CTAs. One instantiation per translation unit (instantiations/grouped_gemm_wgmma_<dtype>_<tile>.cu).
template <int32_t Dtype, GemmTile Tile>
void launch_wgmma_tiles(const GroupedGemmProblem& p, const CUtensorMap& b_map, int sm_count, cudaStream_t stream);

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
