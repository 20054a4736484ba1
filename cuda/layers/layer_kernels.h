// Small kernels the layers chain between their building blocks: the saved buffer's header (written by a kernel,
// not a host copy, so a captured CUDA graph replays it), int32 indices widened into a caller's int64 tensor, and
// the constant per-row inputs the experts-only and sparse FFN layers give the grouped GEMM (scores of 1, the
// identity pair order).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/layers/saved_header.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace layers {

void write_saved_header(void* saved, const SavedHeader& header, cudaStream_t stream);

// dst[r * dst_stride + c] = src[r * cols + c] for r < rows, c < cols.
void widen_indices(const int32_t* src, int64_t rows, int64_t cols, int64_t* dst, int64_t dst_stride,
                   cudaStream_t stream);

// ones[i] = 1.0f and iota[i] = i for i < count; iota may be null (the sparse FFN layer's scores of 1 alone).
void fill_ones_and_iota(float* ones, int32_t* iota, int64_t count, cudaStream_t stream);

}  // namespace layers
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
