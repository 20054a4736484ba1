#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cuda/common/storage.cuh"
#include "gpu/layer_oracle.h"

namespace moekit_test {

namespace {

using moekit::cuda::from_float;
using moekit::cuda::to_float;

constexpr int kThreads = 256;

void check_launch(const char* what) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

unsigned grid_for(int64_t items) {
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 * 16 ? (blocks > 0 ? blocks : 1) : 65536 * 16);
}

// One thread per output element: the K loads of one column are the pairs of its token, in ascending k.
template <class S, class T>
__global__ void combine_kernel(const S* rows, const int32_t* grouped_pos, const float* weights, int64_t tokens,
                               int64_t top_k, int64_t width, T* out) {
  const int64_t total = tokens * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / width, j = i % width;
    float sum = 0.0f;
    for (int64_t k = 0; k < top_k; ++k) {
      const int32_t pos = grouped_pos[t * top_k + k];
      if (pos < 0) continue;
      const float rounded = to_float(from_float<T>(to_float(rows[static_cast<int64_t>(pos) * width + j])));
      sum += (weights != nullptr ? weights[t * top_k + k] : 1.0f) * rounded;
    }
    out[i] = from_float<T>(sum);
  }
}

template <class T>
__global__ void add_rounded_kernel(T* out, const float* addend, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(to_float(out[i]) + addend[i]);
}

template <class T>
__global__ void scaled_gather_kernel(const T* src, int64_t width, const int32_t* gather_idx, const float* scale,
                                     const int32_t* pair_idx, int64_t rows, T* dst) {
  const int64_t total = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, j = i % width;
    dst[i] = from_float<T>(scale[pair_idx[r]] * to_float(src[static_cast<int64_t>(gather_idx[r]) * width + j]));
  }
}

template <class T>
void combine_into(const void* rows, moekit_dtype_t rows_dtype, const int32_t* grouped_pos, const float* weights,
                  int64_t tokens, int64_t top_k, int64_t width, T* out) {
  const unsigned grid = grid_for(tokens * width);
  if (rows_dtype == MOEKIT_DTYPE_FP32)
    combine_kernel<<<grid, kThreads>>>(static_cast<const float*>(rows), grouped_pos, weights, tokens, top_k, width,
                                       out);
  else
    combine_kernel<<<grid, kThreads>>>(static_cast<const T*>(rows), grouped_pos, weights, tokens, top_k, width, out);
}

}  // namespace

void device_combine_pairs(const void* rows, moekit_dtype_t rows_dtype, const int32_t* grouped_pos, const float* weights,
                          int64_t tokens, int64_t top_k, int64_t width, moekit_dtype_t dtype, void* out) {
  if (tokens == 0) return;
  if (dtype == MOEKIT_DTYPE_BF16)
    combine_into(rows, rows_dtype, grouped_pos, weights, tokens, top_k, width, static_cast<__nv_bfloat16*>(out));
  else
    combine_into(rows, rows_dtype, grouped_pos, weights, tokens, top_k, width, static_cast<__half*>(out));
  check_launch("combine kernel");
}

void device_add_rounded(void* out, moekit_dtype_t dtype, const float* addend, int64_t count) {
  if (count == 0) return;
  if (dtype == MOEKIT_DTYPE_BF16)
    add_rounded_kernel<<<grid_for(count), kThreads>>>(static_cast<__nv_bfloat16*>(out), addend, count);
  else
    add_rounded_kernel<<<grid_for(count), kThreads>>>(static_cast<__half*>(out), addend, count);
  check_launch("add kernel");
}

void device_scaled_gather_rows(const void* src, int64_t width, const int32_t* gather_idx, const float* scale,
                               const int32_t* pair_idx, int64_t rows, moekit_dtype_t dtype, void* dst) {
  if (rows == 0) return;
  if (dtype == MOEKIT_DTYPE_BF16)
    scaled_gather_kernel<<<grid_for(rows * width), kThreads>>>(static_cast<const __nv_bfloat16*>(src), width,
                                                               gather_idx, scale, pair_idx, rows,
                                                               static_cast<__nv_bfloat16*>(dst));
  else
    scaled_gather_kernel<<<grid_for(rows * width), kThreads>>>(static_cast<const __half*>(src), width, gather_idx,
                                                               scale, pair_idx, rows, static_cast<__half*>(dst));
  check_launch("scaled gather kernel");
}

}  // namespace moekit_test
