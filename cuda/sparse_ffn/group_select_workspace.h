// How group selection on the CUDA backend runs a plan and lays out its workspace: one function gives the size
// plan_sizes reports and the offsets the run uses, so they cannot disagree.
//
// Sections (each 256-byte aligned):
//   w_sel  [NG * spg, D] storage dtype   the gathered subsample rows of Wg (only when spg > 0)
//   pre    [chunk, NG * pg] storage dtype the gate pre-activation of one chunk of tokens (pg = spg or G)
//   gemm      cuBLASLt's workspace
//   partials  [kCountSlices, NG] int32: the per-slice histograms of the counts pass
// Tokens are processed in chunks, so the workspace is bounded whatever T is: a chunk's pre-activation is at most
// kPreChunkBytes and at most kMaxChunkTokens tokens. Chunks are kept large: each chunk's GEMM should fill the
// GPU for several waves, and each chunk's energy kernel pays one token's latency at its tail.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/dense/dense_gemm.h"
#include "cuda/sparse_ffn/group_select.h"
#include "cuda/common/status_error.h"
#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace sparse_ffn {

constexpr size_t kPreChunkBytes = size_t{32} << 20;
constexpr int64_t kMaxChunkTokens = 4096;
constexpr int64_t kChunkTokenMultiple = 64;

struct GroupSelectLayout {
  int64_t groups;          // NG
  int64_t rows_per_group;  // pg: spg, or G when spg == 0
  int64_t selected_rows;   // NG * pg: the pre-activation's width
  int64_t chunk_tokens;    // tokens per GEMM + selection step
  bool gathers_rows;       // spg > 0
  size_t w_sel_offset, w_sel_bytes;
  size_t pre_offset, pre_bytes;
  size_t gemm_offset, gemm_bytes;
  size_t partials_offset, partials_bytes;
  size_t total_bytes;
};

// Throws NOT_SUPPORTED for what the CUDA kernels do not serve (fp32/fp64 storage, more than kMaxSelectGroups
// groups).
inline GroupSelectLayout group_select_layout(const moekit_sparse_ffn_desc_t& d) {
  if (d.dtype != MOEKIT_DTYPE_BF16 && d.dtype != MOEKIT_DTYPE_FP16)
    throw_not_supported("dtype: group selection on the CUDA backend takes bf16 or fp16 storage, got dtype " +
                        std::to_string(d.dtype));
  GroupSelectLayout l{};
  l.groups = d.d_ff / d.group_size;
  if (l.groups > kMaxSelectGroups)
    throw_not_supported("d_ff: group selection on the CUDA backend serves at most " +
                        std::to_string(kMaxSelectGroups) + " groups, got d_ff / group_size = " +
                        std::to_string(l.groups));
  l.gathers_rows = d.subsample > 0;
  l.rows_per_group = l.gathers_rows ? d.subsample : d.group_size;
  l.selected_rows = l.groups * l.rows_per_group;
  const size_t element = 2;
  const size_t row_bytes = static_cast<size_t>(l.selected_rows) * element;
  int64_t chunk = static_cast<int64_t>(kPreChunkBytes / row_bytes) / kChunkTokenMultiple * kChunkTokenMultiple;
  chunk = std::clamp<int64_t>(chunk, kChunkTokenMultiple, kMaxChunkTokens);
  l.chunk_tokens = std::min(chunk, d.max_tokens);

  auto align = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  size_t offset = 0;
  l.w_sel_offset = offset;
  l.w_sel_bytes = l.gathers_rows ? static_cast<size_t>(l.selected_rows) * static_cast<size_t>(d.d_model) * element : 0;
  offset += align(l.w_sel_bytes);
  l.pre_offset = offset;
  l.pre_bytes = static_cast<size_t>(l.chunk_tokens) * row_bytes;
  offset += align(l.pre_bytes);
  l.gemm_offset = offset;
  l.gemm_bytes = kDenseGemmWorkspaceBytes;
  offset += align(l.gemm_bytes);
  l.partials_offset = offset;
  l.partials_bytes = static_cast<size_t>(kCountSlices * l.groups) * sizeof(int32_t);
  offset += align(l.partials_bytes);
  l.total_bytes = offset;
  return l;
}

}  // namespace sparse_ffn
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
