// The TMA descriptors of the grouped GEMM's operands for the wgmma path (grouped_gemm_wgmma.h).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <string>

#include "cuda/common/activation.cuh"
#include "cuda/common/cuda_check.h"
#include "cuda/gemm/grouped_gemm_wgmma.h"
#include "cuda/common/status_error.h"
#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

namespace {

using EncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;

// The driver's cuTensorMapEncodeTiled, looked up once per process.
EncodeTiled encode_tiled() {
  static const EncodeTiled encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    check_cuda(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found),
               "grouped GEMM (wgmma): driver entry point");
    if (found != cudaDriverEntryPointSuccess || function == nullptr)
      throw_internal("grouped GEMM (wgmma): the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<EncodeTiled>(function);
  }();
  return encode;
}

// A rank-3 map of `type` elements over `data`: dims innermost first (the innermost contiguous), `strides` the bytes
// between consecutive indices of dims 1 and 2, boxes of 128 bytes (box_columns elements) x box_rows x 1 in the
// 128-byte swizzle, zeros outside.
CUtensorMap encode_map(CUtensorMapDataType type, const void* data, const cuuint64_t (&dims)[3],
                       const cuuint64_t (&strides)[2], int box_columns, int box_rows) {
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_columns), static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  CUtensorMap map{};
  const CUresult status = encode_tiled()(&map, type, 3, const_cast<void*>(data), dims, strides, box, element_strides,
                                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS)
    throw_internal("grouped GEMM (wgmma): cuTensorMapEncodeTiled failed with CUresult " + std::to_string(status));
  return map;
}

constexpr cuuint64_t element_bytes = 2;

// The map type of the 16-bit operand dtype; its 128-byte boxes are 64 elements wide.
CUtensorMapDataType operand_type(int32_t dtype) {
  return dtype == MOEKIT_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// A row-major [rows, columns] matrix of 16-bit elements, `ld` elements between rows, as rank 3 (columns, rows, 1).
CUtensorMap matrix_map(int32_t dtype, const void* data, int64_t columns, int64_t rows, int64_t ld, int box_rows) {
  const auto row_bytes = static_cast<cuuint64_t>(ld) * element_bytes;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(columns), static_cast<cuuint64_t>(rows), 1};
  const cuuint64_t strides[2] = {row_bytes, row_bytes * static_cast<cuuint64_t>(rows)};
  return encode_map(operand_type(dtype), data, dims, strides, 64, box_rows);
}

}  // namespace

CUtensorMap make_weight_tensor_map(const GroupedGemmProblem& p, int box_rows) {
  // NK: (k, n, E), rows of k; KN: (n, k, E), rows of n.
  const bool kn = p.b_layout == MOEKIT_GEMM_B_KN;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kn ? p.n : p.k), static_cast<cuuint64_t>(kn ? p.k : p.n),
                              static_cast<cuuint64_t>(p.groups)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(p.ldb) * element_bytes,
                                 static_cast<cuuint64_t>(p.b_group_stride) * element_bytes};
  return encode_map(operand_type(p.dtype), p.b, dims, strides, 64, box_rows);
}

CUtensorMap make_activation_tensor_map(const GroupedGemmProblem& p, int box_rows) {
  return matrix_map(p.dtype, p.a, p.k, p.rows, p.lda, box_rows);
}

CUtensorMap make_dgated_h_tensor_map(const GroupedGemmProblem& p, int box_rows) {
  const int64_t width = is_gated_activation(p.activation) ? 2 * p.act_width : p.act_width;
  return matrix_map(p.dtype, p.h, width, p.rows, p.ldh, box_rows);
}

GroupedGemmProblem transpose_weight_gradient(const GroupedGemmProblem& p, int64_t bn) {
  GroupedGemmProblem t = p;
  t.a = p.b;
  t.lda = p.ldb;
  t.b = p.a;
  t.ldb = p.lda;
  t.m = p.n;
  t.n = p.m;
  t.gather = MOEKIT_GEMM_GATHER_A;
  t.n_tiles = (t.n + bn - 1) / bn;
  t.c_transposed = true;
  return t;
}

CUtensorMap make_output_tensor_map(const GroupedGemmProblem& p) {
  if (p.mode == MOEKIT_GEMM_VARLEN_M) return matrix_map(p.dtype, p.c, p.n, p.rows, p.ldc, 64);
  const cuuint64_t bytes = p.c_fp32 ? 4 : element_bytes;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(p.n), static_cast<cuuint64_t>(p.m),
                              static_cast<cuuint64_t>(p.groups)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(p.ldc) * bytes,
                                 static_cast<cuuint64_t>(p.c_group_stride) * bytes};
  const CUtensorMapDataType type = p.c_fp32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : operand_type(p.dtype);
  return encode_map(type, p.c, dims, strides, static_cast<int>(128 / bytes), 64);
}

CUtensorMap make_gated_act_tensor_map(const GroupedGemmProblem& p) {
  return matrix_map(p.dtype, p.act, p.act_width, p.rows, p.ld_act, 64);
}

CUtensorMap make_reduction_rows_tensor_map(const GroupedGemmProblem& p) {
  // B [rows, n] unless B is the gathered operand, then A [rows, m]: (columns, rows, 1).
  const bool b = p.gather != MOEKIT_GEMM_GATHER_B;
  return b ? matrix_map(p.dtype, p.b, p.n, p.rows, p.ldb, 64) : matrix_map(p.dtype, p.a, p.m, p.rows, p.lda, 64);
}

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
