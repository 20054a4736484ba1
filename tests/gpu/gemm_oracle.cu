#include "gpu/gemm_oracle.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "cuda/common/activation.cuh"
#include "cuda/common/storage.cuh"

namespace moekit_test {

namespace {

using moekit::cuda::DeviceActivation;
using moekit::cuda::from_float;
using moekit::cuda::to_float;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": " + cublasLtGetStatusString(status));
}

unsigned blocks_for(int64_t items, int64_t per_block) {
  const int64_t blocks = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 65536 * 16 ? (blocks > 0 ? blocks : 1) : 65536 * 16);
}

__device__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <class T>
__global__ void fill_kernel(T* data, int64_t count, float scale, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t bits = splitmix64(seed * 0x632be59bd9b4e019ull + static_cast<uint64_t>(i));
    const float unit = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    data[i] = from_float<T>(scale * (2.0f * unit - 1.0f));
  }
}

__global__ void gather_kernel(const uint4* src, int64_t vectors_per_row, const int32_t* idx, int64_t rows,
                              uint4* dst) {
  const int64_t total = rows * vectors_per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / vectors_per_row, v = i % vectors_per_row;
    dst[i] = src[static_cast<int64_t>(idx[r]) * vectors_per_row + v];
  }
}

// Positions of gate j and up j in an h row.
__device__ void glu_columns(int32_t layout, int64_t act_width, int64_t j, int64_t& gate, int64_t& up) {
  gate = layout == MOEKIT_GLU_INTERLEAVED ? 2 * j : j;
  up = layout == MOEKIT_GLU_INTERLEAVED ? 2 * j + 1 : act_width + j;
}

template <class T>
__global__ void gated_kernel(const float* product, int64_t rows, int64_t act_width, DeviceActivation act,
                             int32_t layout, T* h, T* a) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (r >= rows) return;
  const bool gated = moekit::is_gated_activation(act.kind);
  const int64_t h_width = gated ? 2 * act_width : act_width;
  const float* p = product + r * h_width;
  T* h_row = h + r * h_width;
  for (int64_t j = threadIdx.x % 32; j < act_width; j += 32) {
    if (gated) {
      int64_t gc, uc;
      glu_columns(layout, act_width, j, gc, uc);
      h_row[gc] = from_float<T>(p[gc]);
      h_row[uc] = from_float<T>(p[uc]);
      a[r * act_width + j] = from_float<T>(moekit::cuda::gated_forward(act, to_float(h_row[gc]), to_float(h_row[uc])));
    } else {
      h_row[j] = from_float<T>(p[j]);
      a[r * act_width + j] = from_float<T>(moekit::cuda::plain_forward(act, to_float(h_row[j])));
    }
  }
}

template <class T>
__global__ void dgated_kernel(const float* product, const T* h, const float* row_scale, const int32_t* pair_idx,
                              int64_t rows, int64_t act_width, DeviceActivation act, int32_t layout, T* dh,
                              T* a_scaled, float* ds) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (r >= rows) return;
  const bool gated = moekit::is_gated_activation(act.kind);
  const int64_t h_width = gated ? 2 * act_width : act_width;
  const float s = row_scale[pair_idx[r]];
  const T* h_row = h + r * h_width;
  T* dh_row = dh + r * h_width;
  double dot = 0.0;
  for (int64_t j = threadIdx.x % 32; j < act_width; j += 32) {
    const float da = product[r * act_width + j];
    float a;
    if (gated) {
      int64_t gc, uc;
      glu_columns(layout, act_width, j, gc, uc);
      const float g = to_float(h_row[gc]), u = to_float(h_row[uc]);
      a = moekit::cuda::gated_forward(act, g, u);
      float dg, du;
      moekit::cuda::gated_backward(act, g, u, s * da, dg, du);
      dh_row[gc] = from_float<T>(dg);
      dh_row[uc] = from_float<T>(du);
    } else {
      const float z = to_float(h_row[j]);
      a = moekit::cuda::plain_forward(act, z);
      dh_row[j] = from_float<T>(s * da * moekit::cuda::plain_grad(act, z));
    }
    dot += static_cast<double>(da) * a;
    a_scaled[r * act_width + j] = from_float<T>(s * a);
  }
  for (int offset = 16; offset >= 1; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
  if (threadIdx.x % 32 == 0) ds[pair_idx[r]] = static_cast<float>(dot);
}

__device__ float load_as_float(const void* p, moekit_dtype_t dtype, int64_t i) {
  switch (dtype) {
    case MOEKIT_DTYPE_BF16: return to_float(static_cast<const __nv_bfloat16*>(p)[i]);
    case MOEKIT_DTYPE_FP16: return to_float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__global__ void row_errors_kernel(const void* out, moekit_dtype_t out_dtype, const void* ref,
                                  moekit_dtype_t ref_dtype, int64_t rows, int64_t width, double* err2, double* ref2,
                                  int32_t* nan) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (r >= rows) return;
  double e = 0.0, q = 0.0;
  int any_nan = 0;
  for (int64_t j = threadIdx.x % 32; j < width; j += 32) {
    const double o = load_as_float(out, out_dtype, r * width + j);
    const double f = load_as_float(ref, ref_dtype, r * width + j);
    if (o != o) any_nan = 1;
    e += (o - f) * (o - f);
    q += f * f;
  }
  for (int offset = 16; offset >= 1; offset /= 2) {
    e += __shfl_xor_sync(0xffffffffu, e, offset);
    q += __shfl_xor_sync(0xffffffffu, q, offset);
    any_nan |= __shfl_xor_sync(0xffffffffu, any_nan, offset);
  }
  if (threadIdx.x % 32 == 0) {
    err2[r] = e;
    ref2[r] = q;
    nan[r] = any_nan;
  }
}

cudaDataType_t cuda_type(moekit_dtype_t dtype) { return dtype == MOEKIT_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F; }

// cuBLASLt's scratch memory, kept for the process.
void* cublaslt_workspace(size_t bytes) {
  static void* workspace = nullptr;
  if (workspace == nullptr) check(cudaMalloc(&workspace, bytes), "cuBLASLt workspace");
  return workspace;
}

}  // namespace

void device_fill_uniform(void* data, moekit_dtype_t dtype, int64_t count, double scale, uint64_t seed) {
  const unsigned blocks = blocks_for(count, kThreads);
  const float s = static_cast<float>(scale);
  if (dtype == MOEKIT_DTYPE_BF16)
    fill_kernel<<<blocks, kThreads>>>(static_cast<__nv_bfloat16*>(data), count, s, seed);
  else if (dtype == MOEKIT_DTYPE_FP16)
    fill_kernel<<<blocks, kThreads>>>(static_cast<__half*>(data), count, s, seed);
  else
    fill_kernel<<<blocks, kThreads>>>(static_cast<float*>(data), count, s, seed);
  check(cudaGetLastError(), "fill kernel");
}

void device_gather_rows(const void* src, int64_t width, const int32_t* idx, int64_t rows, void* dst) {
  const int64_t vectors = width / 8;
  gather_kernel<<<blocks_for(rows * vectors, kThreads), kThreads>>>(static_cast<const uint4*>(src), vectors, idx,
                                                                     rows, static_cast<uint4*>(dst));
  check(cudaGetLastError(), "gather kernel");
}

void cublaslt_product(cublasLtHandle_t handle, moekit_dtype_t dtype, int64_t m, int64_t n, int64_t k, const void* a,
                      int64_t lda, bool a_trans, const void* b, int64_t ldb, bool b_trans, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    check(cudaMemset2D(c, static_cast<size_t>(ldc) * 4, 0, static_cast<size_t>(n) * 4, static_cast<size_t>(m)),
          "zero product");
    return;
  }
  // Row-major C [m, n] is column-major C^T [n, m] = op(B)^T op(A)^T: cuBLASLt's A is our B, its B our A.
  const cudaDataType_t type = cuda_type(dtype);
  cublasLtMatmulDesc_t op = nullptr;
  check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
  const cublasOperation_t trans_a = b_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_b = a_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a), "TRANSA");
  check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b), "TRANSB");
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  check(cublasLtMatrixLayoutCreate(&la, type, b_trans ? k : n, b_trans ? n : k, ldb), "A layout");
  check(cublasLtMatrixLayoutCreate(&lb, type, a_trans ? m : k, a_trans ? k : m, lda), "B layout");
  check(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, m, ldc), "C layout");
  const float one = 1.0f, zero = 0.0f;
  constexpr size_t workspace_bytes = size_t{32} << 20;
  check(cublasLtMatmul(handle, op, &one, b, la, a, lb, &zero, c, lc, c, lc, nullptr,
                       cublaslt_workspace(workspace_bytes), workspace_bytes, nullptr),
        "cublasLtMatmul");
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
}

void device_gated_reference(const float* product, int64_t rows, int64_t act_width, int32_t activation,
                            int32_t glu_layout, float limit, moekit_dtype_t dtype, void* h, void* a) {
  if (rows == 0) return;
  const DeviceActivation act{activation, limit};
  const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  if (dtype == MOEKIT_DTYPE_BF16)
    gated_kernel<<<blocks, kThreads>>>(product, rows, act_width, act, glu_layout, static_cast<__nv_bfloat16*>(h),
                                       static_cast<__nv_bfloat16*>(a));
  else
    gated_kernel<<<blocks, kThreads>>>(product, rows, act_width, act, glu_layout, static_cast<__half*>(h),
                                       static_cast<__half*>(a));
  check(cudaGetLastError(), "gated reference kernel");
}

void device_dgated_reference(const float* product, const void* h, const float* row_scale, const int32_t* pair_idx,
                             int64_t rows, int64_t act_width, int32_t activation, int32_t glu_layout, float limit,
                             moekit_dtype_t dtype, void* dh, void* a_scaled, float* ds) {
  if (rows == 0) return;
  const DeviceActivation act{activation, limit};
  const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  if (dtype == MOEKIT_DTYPE_BF16)
    dgated_kernel<<<blocks, kThreads>>>(product, static_cast<const __nv_bfloat16*>(h), row_scale, pair_idx, rows,
                                        act_width, act, glu_layout, static_cast<__nv_bfloat16*>(dh),
                                        static_cast<__nv_bfloat16*>(a_scaled), ds);
  else
    dgated_kernel<<<blocks, kThreads>>>(product, static_cast<const __half*>(h), row_scale, pair_idx, rows, act_width,
                                        act, glu_layout, static_cast<__half*>(dh), static_cast<__half*>(a_scaled), ds);
  check(cudaGetLastError(), "dgated reference kernel");
}

void device_row_errors(const void* out, moekit_dtype_t out_dtype, const void* ref, moekit_dtype_t ref_dtype,
                       int64_t rows, int64_t width, double* err2, double* ref2, int32_t* nan) {
  if (rows == 0) return;
  const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  row_errors_kernel<<<blocks, kThreads>>>(out, out_dtype, ref, ref_dtype, rows, width, err2, ref2, nan);
  check(cudaGetLastError(), "row error kernel");
}

}  // namespace moekit_test
