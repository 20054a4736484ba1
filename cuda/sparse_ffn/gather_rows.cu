// Gathers the subsample rows of the gate weight into one contiguous matrix, the B operand of the energy GEMM:
//   w_sel[g * spg + j, :] = w_gate[subsample_rows[g * spg + j], :]        ([NG * spg, D], 2-byte storage)
// A copy of 2-byte elements, the same for bf16 and fp16, so there is one kernel for both.
//
// Launch shape: one warp per output row, 8 rows per block; 16-byte vectors when D and the source row stride
// are multiples of 8 elements (rows are then 16-byte aligned, as every CUDA tensor's data is), 2-byte elements
// otherwise. Bytes moved: 2 * NG * spg * D * 2 (read + write).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/sparse_ffn/group_select.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace sparse_ffn {

namespace {

constexpr int kGatherRowsPerBlock = 8;

__global__ void __launch_bounds__(kGatherRowsPerBlock * 32, 1) gather_rows_kernel(GatherRowsArgs a, bool vectors) {
  // int: NG * spg <= F < 2^31 (the plan's limit).
  const int r = static_cast<int>(blockIdx.x) * kGatherRowsPerBlock + static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (r >= static_cast<int>(a.groups * a.rows_per_group)) return;
  const int64_t g = r / static_cast<int>(a.rows_per_group);
  int64_t n = a.subsample_rows[r];
  // NOTE: the reference rejects such a row; here it cannot be checked without a host sync, so it is confined to
  // the group (its first neuron) and nothing outside w_gate is read.
  if (n < g * a.group_size || n >= (g + 1) * a.group_size) n = g * a.group_size;
  if (vectors) {
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.w_gate) + n * a.w_gate_stride);
    uint4* dst = reinterpret_cast<uint4*>(static_cast<uint16_t*>(a.w_sel) + static_cast<int64_t>(r) * a.d_model);
    for (int64_t c = lane; c < a.d_model / 8; c += 32) dst[c] = src[c];
  } else {
    const uint16_t* src = static_cast<const uint16_t*>(a.w_gate) + n * a.w_gate_stride;
    uint16_t* dst = static_cast<uint16_t*>(a.w_sel) + static_cast<int64_t>(r) * a.d_model;
    for (int64_t c = lane; c < a.d_model; c += 32) dst[c] = src[c];
  }
}

}  // namespace

void launch_gather_subsample_rows(const GatherRowsArgs& args, cudaStream_t stream) {
  const int64_t rows = args.groups * args.rows_per_group;
  if (rows == 0) return;
  const bool vectors = args.d_model % 8 == 0 && args.w_gate_stride % 8 == 0;
  const int64_t blocks = (rows + kGatherRowsPerBlock - 1) / kGatherRowsPerBlock;
  gather_rows_kernel<<<static_cast<unsigned>(blocks), kGatherRowsPerBlock * 32, 0, stream>>>(args, vectors);
  check_launch("group select: subsample row gather");
}

}  // namespace sparse_ffn
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
