// The TMA descriptor of the grouped GEMM's weight operand for the wgmma path (grouped_gemm_wgmma.h).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/gemm/grouped_gemm_wgmma.h"
#include "error.h"
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

}  // namespace

CUtensorMap make_weight_tensor_map(const GroupedGemmProblem& p, int box_rows) {
  constexpr cuuint32_t element_bytes = 2;
  // NK: (k, n, E), rows of k; KN: (n, k, E), rows of n. The innermost dimension is contiguous.
  const bool kn = p.b_layout == MOEKIT_GEMM_B_KN;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kn ? p.n : p.k), static_cast<cuuint64_t>(kn ? p.k : p.n),
                              static_cast<cuuint64_t>(p.groups)};
  // Bytes between consecutive rows and between experts (the innermost stride is the element).
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(p.ldb) * element_bytes,
                                 static_cast<cuuint64_t>(p.b_group_stride) * element_bytes};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUtensorMapDataType type =
      p.dtype == MOEKIT_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMap map{};
  const CUresult status = encode_tiled()(&map, type, 3, const_cast<void*>(p.b), dims, strides, box, element_strides,
                                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS)
    throw_internal("grouped GEMM (wgmma): cuTensorMapEncodeTiled failed with CUresult " + std::to_string(status));
  return map;
}

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
