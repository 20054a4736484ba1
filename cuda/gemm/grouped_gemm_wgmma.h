// Host-callable pieces of the sm_90a grouped GEMM path (grouped_gemm_wgmma_kernel.cuh): the TMA descriptors of its
// operands and the persistent tile kernel's launch. run_grouped_gemm calls them for a kernel of GemmPath::wgmma
// (cuda/gemm/gemm_config.h). Plain C++.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/grouped_gemm.h"
#include "cuda/gemm/gemm_config.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

// The TMA map of B for varlen M: B [E, n, k] (NK, K-major) as rank 3 (k, n, E), or B [E, k, n] (KN, MN-major) as
// (n, k, E); boxes of 64 contiguous elements x `box_rows` rows x 1 expert in the 128-byte swizzle, zeros outside the
// tensor. The driver's encoder is reached through the runtime
// (cudaGetDriverEntryPointByVersion), so nothing links libcuda. Throws on a descriptor the driver refuses.
CUtensorMap make_weight_tensor_map(const GroupedGemmProblem& p, int box_rows);

// The TMA map of varlen M's A [rows, k] when it is not gathered, as rank 3 (k, rows, 1): boxes of 64 x
// `box_rows` (a whole row tile) in the 128-byte swizzle, zeros past the last row.
CUtensorMap make_activation_tensor_map(const GroupedGemmProblem& p, int box_rows);
// The TMA map of varlen K's operand that is not gathered (B [rows, n], or A [rows, m] when B is gathered) as rank 3
// (columns, rows, 1), boxes of 64 columns x 64 reduction rows: each box one 8 KiB block of the MN-major layout.
CUtensorMap make_reduction_rows_tensor_map(const GroupedGemmProblem& p);
// The TMA maps the persistent wgmma kernel reads, one kernel parameter.
struct WgmmaOperandMaps {
  CUtensorMap b;  // varlen M: B's; varlen K: that of the operand that is not gathered
  CUtensorMap a;  // varlen M with A not gathered: A's (make_activation_tensor_map); unused otherwise
  CUtensorMap c;  // with c_by_tma: C's (make_output_tensor_map)
  CUtensorMap h;  // DGATED: h's (make_dgated_h_tensor_map); unused otherwise
  CUtensorMap act;  // GATED with c_by_tma: a's (make_gated_act_tensor_map); unused otherwise
  // The epilogue writes C by TMA from shared memory (the kernel's GemmKernel::c: varlen K stores into C of the
  // operand dtype or reduce-adds into an fp32 C; varlen M STORE, and GATED's h and a: stores of each consumer's 64
  // rows that lie wholly inside the tile's group, the rest by the threads); else every thread stores its values.
  bool c_by_tma;
};
// A varlen-K problem as its transpose C^T = B^T A (GemmKernel::transposed): A and B, m and n swapped, A gathered, n_tiles for column tiles of bn, c_transposed set (C
// itself, its strides and its map stay the caller's).
GroupedGemmProblem transpose_weight_gradient(const GroupedGemmProblem& p, int64_t bn);
// The TMA map of C for the epilogue's stores: varlen K's C [E, m, n] as (n, m, E), varlen M's C [rows, n] as
// (n, rows, 1); boxes of 128 bytes (64 operand-dtype or 32 fp32 columns) x 64 rows x 1 in the 128-byte swizzle,
// nothing written outside the tensor.
CUtensorMap make_output_tensor_map(const GroupedGemmProblem& p);
// The TMA map of GATED's a [rows, I] for the epilogue's stores, as (I, rows, 1): boxes of 64 columns x 64 rows in the
// 128-byte swizzle.
CUtensorMap make_gated_act_tensor_map(const GroupedGemmProblem& p);
// The TMA map of DGATED's h [rows, h width] (gate and up, or z), as rank 3 (h width, rows, 1): boxes of 64 columns x
// a whole row tile in the 128-byte swizzle, zeros past the last row. The producer loads the epilogue's h through it.
CUtensorMap make_dgated_h_tensor_map(const GroupedGemmProblem& p, int box_rows);
// Enqueues the persistent wgmma tile kernel, a programmatic dependent of the kernel before it on `stream` (it waits
// for that kernel before reading anything): varlen M over the row-tile list run_grouped_gemm built, varlen K over
// group x m tile x n tile; min(tiles bound, sm_count) CTAs, or with `paired` (varlen M: a tile list padded to an
// even count; varlen K: an even m tile count per group, B not gathered) clusters of 2 CTAs taking pairs of row tiles, sharing the B tile by
// multicast within a group.
// `Activated`: the kernel for the layout's activation epilogue (B [E, n, k]: GATED; B [E, k, n]: DGATED); the others
// take STORE and BIAS. `Schedule`: the consumers' (ping-pong: varlen M, 128x128). One instantiation per translation
// unit (instantiations/grouped_gemm_wgmma_<nk|nk_gated|kn|kn_dgated|vk>_<dtype>_<tile>[_pingpong].cu).
template <int32_t Dtype, GemmTile Tile, Operands Op, bool Activated = false,
          GemmSchedule Schedule = GemmSchedule::cooperative>
void launch_wgmma_tiles(const GroupedGemmProblem& p, const WgmmaOperandMaps& maps, int sm_count, bool paired,
                        cudaStream_t stream);

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
