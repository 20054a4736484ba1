// GPU test helpers: device copies of HostTensor, one reference and one CUDA handle per test, and streams.
// A GPU test builds its inputs as HostTensor (tests/common/test_util.h), runs the reference backend on them and
// the CUDA backend on device copies, and compares the results with docs/math.md section 9's metrics.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "common/test_util.h"
#include "moekit/moekit.h"

namespace moekit_test {

// REQUIRE that a CUDA runtime call succeeded.
#define CUDA_REQUIRE(call)                                                                      \
  do {                                                                                          \
    cudaError_t cuda_require_status_ = (call);                                                  \
    INFO(#call << " -> " << cudaGetErrorString(cuda_require_status_));                          \
    REQUIRE(cuda_require_status_ == cudaSuccess);                                               \
  } while (0)

// Owning device memory (cudaMalloc, 256-byte aligned).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A device copy of a HostTensor with the same dtype and shape.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  explicit DeviceTensor(const HostTensor& host);  // uploads the host values (upload's guarantee)
  moekit_tensor_t view();                          // a view on CUDA device 0
  void upload(const HostTensor& host);             // complete on return: any stream may read the tensor
  HostTensor download() const;                     // a new HostTensor holding the device bytes
  void* data() const { return buffer_.data(); }

 private:
  moekit_dtype_t dtype_ = MOEKIT_DTYPE_INVALID;
  std::vector<int64_t> shape_;
  DeviceBuffer buffer_;
};

// Handles for the two backends (destroyed at scope exit).
struct Handles {
  Handles();
  ~Handles();
  moekit_handle_t reference = nullptr;
  moekit_handle_t cuda = nullptr;
};

// Size of the L2 cache of device 0 (for timing loops that rotate buffers past it).
size_t l2_cache_bytes();

}  // namespace moekit_test
