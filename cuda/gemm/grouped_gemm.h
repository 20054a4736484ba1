// Host-callable launcher of the CUDA grouped GEMM (docs/math.md section 5) and the problem it reads. Plain C++:
// src/cuda_backend/gemm_ops.cpp fills the problem from the validated tensor views and calls run_grouped_gemm.
//
//   varlen M: for every grouped row r of group e (offsets[e] <= r < offsets[e+1], read on the device),
//             product[r] = A[row(r)] B_e with row(r) = gather ? gather_idx[r] : r, B_e [n, k] (NK) or [k, n] (KN);
//             then the epilogue: STORE / BIAS  C[r] = alpha product + bias[e] + beta C[r]
//                                GATED         h[r] = round(alpha product + bias[e]); a[r] = round(act(h[r]))
//                                DGATED        dA = alpha product; dh, a' = s a, ds[pair_idx[r]] = dA . a
//   varlen K: C[e] [m, n] = alpha sum over the rows r of group e of A[row_a(r)]^T B[row_b(r)] + beta C[e].
//
// Preconditions (src/cuda_backend/gemm_ops.cpp checks them): bf16 / fp16 operands; k, n, m and every row stride
// multiples of 8 elements; every base pointer 16-byte aligned.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/gemm_config.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

struct GroupedGemmProblem {
  int32_t mode;      // moekit_gemm_mode_t
  int32_t b_layout;  // moekit_gemm_b_layout_t (varlen M)
  int32_t gather;    // moekit_gemm_gather_t
  int32_t epilogue;  // moekit_gemm_epilogue_t
  int32_t dtype;     // operand dtype: MOEKIT_DTYPE_BF16 or FP16
  int64_t groups;    // E
  int64_t rows;      // grouped rows of this call (M); offsets are clamped to it
  int64_t m;         // varlen K: C's middle dim
  int64_t n;         // the product's width (DGATED: the activation width)
  int64_t k;         // varlen M: the reduction length

  const void* a;  // varlen M [rows or S, k]; varlen K [rows or S, m]; rows lda apart
  int64_t lda;
  const void* b;  // varlen M [E, n', k] (NK) or [E, k, n'] (KN); varlen K [rows or S, n]
  int64_t ldb;
  int64_t b_group_stride;
  const int32_t* offsets;  // [E+1]
  const void* gather_idx;  // [rows] int32 or int64, or nullptr
  bool gather_int64;
  // Rows of the gathered source (S >= 1 whenever rows > 0 with a gather): an entry of gather_idx is clamped to
  // [0, S), so no value reads outside the source.
  int64_t source_rows;

  float alpha;
  float beta;          // STORE / BIAS; C is read only when beta != 0
  const void* bias;    // [E, n] operand dtype or nullptr
  int64_t bias_stride;
  void* c;             // varlen M [rows, n] (C, h or dh); varlen K [E, m, n]
  int64_t ldc;
  int64_t c_group_stride;
  bool c_fp32;         // C in fp32 (STORE / BIAS), else the operand dtype
  // varlen K run as its transpose (GemmKernel::transposed): a, b, m, n and gather are those of
  // C^T = B^T A, and the tiles are stored transposed through the map of the caller's C.
  bool c_transposed;

  int32_t activation;  // GATED / DGATED: moekit_activation_t
  int32_t glu_layout;  // moekit_glu_layout_t
  float glu_limit;
  int64_t act_width;   // I: the width of a
  const void* h;       // DGATED [rows, h width]
  int64_t ldh;
  void* act;           // GATED a / DGATED a' [rows, I]
  int64_t ld_act;
  const float* row_scale;  // DGATED [P] flat, read at pair_idx[r]
  const int32_t* pair_idx; // DGATED [rows]
  float* dscores;          // DGATED [P] flat, written at pair_idx[r]
  int64_t pairs;           // DGATED: P, the entries of row_scale and dscores; a pair_idx entry outside [0, P)
                           // reads a scale of 0 and writes no ds

  // Workspace (gemm_workspace_layout), filled by run_grouped_gemm.
  int64_t m_tiles;
  int64_t n_tiles;
  int32_t* tile_count;
  int32_t* tile_starts;
  int32_t* tile_list;  // int4 entries
  int64_t ds_chunks;  // DGATED: 64-column chunks of the product (ds_partials' columns)
  float* ds_partials;
};

// Enqueues the grouped GEMM on `stream` with the plan's `kernel` (GemmConfig::for_call): for varlen M first the
// row-tile list (a one-block kernel reading the offsets), then the tiles (the mma.sync kernel or the persistent sm_90a
// wgmma kernel), then for DGATED the sum of each row's per-tile dots into dscores. No host sync.
void run_grouped_gemm(GroupedGemmProblem problem, const GemmKernel& kernel, const GemmWorkspaceLayout& layout,
                      void* workspace, cudaStream_t stream);

// One instantiation of the tile kernel per translation unit (grouped_gemm_<operands>_<dtype>_<tile>.cu).
enum class Operands : int32_t {
  varlen_m_nk = 0,  // A [rows, k] K-major, B_e [n, k] K-major
  varlen_m_kn = 1,  // A K-major, B_e [k, n] N-major
  varlen_k = 2,     // A [rows, m] and B [rows, n]: both reduced over their rows
};

template <int32_t Dtype, GemmTile Tile, Operands Op>
void launch_gemm_tiles(const GroupedGemmProblem& problem, cudaStream_t stream);

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
