// Dense row-major GEMMs through cuBLASLt, for the work around the grouped GEMM that is one plain matrix product:
// the router linear and its two gradients in the MoE layer, the gate pre-activation of group selection.
//
//   d [m, n] = alpha * A B + beta * d,   A [m, k] (or stored transposed as [k, m]), B [k, n] (or stored [n, k])
//
// fp32 accumulation and one rounding to d's type. Bitwise reproducible: the algorithm is asked of cuBLASLt's
// heuristic once per shape, stride and type and reused, and split-K reductions (if any) are limited to fp32 ones
// (a reduction in bf16/fp16 would round partial sums, a second rounding point). Nothing is allocated on the call
// path, nothing waits for the device.
#pragma once

#include <cuda_runtime.h>
#include <library_types.h>

#include <cstddef>
#include <cstdint>

#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

// The cuBLASLt element type of a moekit storage dtype (bf16, fp16, otherwise fp32).
inline cudaDataType_t cuda_type(int32_t dtype) {
  return dtype == MOEKIT_DTYPE_BF16 ? CUDA_R_16BF : dtype == MOEKIT_DTYPE_FP16 ? CUDA_R_16F : CUDA_R_32F;
}

// cuBLASLt's scratch for one dense GEMM; callers reserve it in their workspace, 16-byte aligned.
constexpr size_t kDenseGemmWorkspaceBytes = size_t{4} << 20;

struct DenseGemm {
  cudaDataType_t ab_type;  // A and B: CUDA_R_16BF or CUDA_R_16F (CUDA_R_32F for fp32 storage)
  cudaDataType_t d_type;   // d: ab_type or CUDA_R_32F
  int64_t m, n, k;
  bool a_transposed;  // A stored row-major as [k, m]
  bool b_transposed;  // B stored row-major as [n, k]
  int64_t lda, ldb, ldd;  // row strides in elements of the matrices as stored
  float alpha, beta;      // beta == 0: d is never read
};

// Enqueues d = alpha A B + beta d on `stream` on CUDA device `device`. With k == 0 the product is zero: d becomes
// beta * d (zero when beta == 0). `what` names the operation in error messages (EXECUTION_FAILED on a cuBLASLt
// error, NOT_SUPPORTED when cuBLASLt has no algorithm for the shape and strides).
void run_dense_gemm(int device, const DenseGemm& g, const void* a, const void* b, void* d, void* workspace,
                    cudaStream_t stream, const char* what);

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
