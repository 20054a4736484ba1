// The layers' small kernels (layer_kernels.h), in the launch shape of grid_stride.cuh.
#include "cuda/layers/layer_kernels.h"

#include "cuda/common/cuda_check.h"
#include "cuda/layers/grid_stride.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace layers {

namespace {

__global__ void write_header_kernel(SavedHeader* saved, SavedHeader header) { *saved = header; }

__global__ void widen_kernel(const int32_t* src, int64_t rows, int64_t cols, int64_t* dst, int64_t dst_stride) {
  const int64_t count = rows * cols;
  for (int64_t i = first_item(); i < count; i += item_step())
    dst[(i / cols) * dst_stride + i % cols] = src[i];
}

__global__ void ones_iota_kernel(float* ones, int32_t* iota, int64_t count) {
  for (int64_t i = first_item(); i < count; i += item_step()) {
    ones[i] = 1.0f;
    if (iota != nullptr) iota[i] = static_cast<int32_t>(i);
  }
}

}  // namespace

void write_saved_header(void* saved, const SavedHeader& header, cudaStream_t stream) {
  write_header_kernel<<<1, 1, 0, stream>>>(static_cast<SavedHeader*>(saved), header);
  check_launch("saved header kernel");
}

void widen_indices(const int32_t* src, int64_t rows, int64_t cols, int64_t* dst, int64_t dst_stride,
                   cudaStream_t stream) {
  if (rows * cols == 0) return;
  widen_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(src, rows, cols, dst, dst_stride);
  check_launch("index widening kernel");
}

void fill_ones_and_iota(float* ones, int32_t* iota, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  ones_iota_kernel<<<blocks_for(count), kThreads, 0, stream>>>(ones, iota, count);
  check_launch("ones and iota kernel");
}

}  // namespace layers
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
