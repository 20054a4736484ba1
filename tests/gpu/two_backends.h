// What the GPU layer tests share as they run one layer on both backends: the call's tensors placed for a backend
// (host tensors as they are for the reference, device copies for CUDA, fetched back after the calls), and
// docs/math.md section 9's comparison of a CUDA result with the reference's.
#pragma once

#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "gpu/gpu_util.h"

namespace moekit_test {

// Tensors for one backend: host tensors as they are, or device copies (poisoned outputs uploaded poisoned).
class Placement {
 public:
  explicit Placement(bool device) : device_(device) {}
  moekit_tensor_t put(HostTensor& t) {
    if (!device_) return t.view();
    device_tensors_.push_back(std::make_unique<DeviceTensor>(t));
    hosts_.push_back(&t);
    return device_tensors_.back()->view();
  }
  void* buffer(size_t bytes) {
    if (!device_) {
      host_buffers_.push_back(std::make_unique<AlignedBuffer>(bytes));
      return host_buffers_.back()->data();
    }
    device_buffers_.push_back(std::make_unique<DeviceBuffer>(bytes));
    return device_buffers_.back()->data();
  }
  // Waits for the device (every stream's work) and copies every device tensor back into its host tensor.
  void fetch() {
    if (!device_) return;
    CUDA_REQUIRE(cudaDeviceSynchronize());
    for (size_t i = 0; i < hosts_.size(); ++i) *hosts_[i] = device_tensors_[i]->download();
  }

 private:
  bool device_;
  std::vector<std::unique_ptr<DeviceTensor>> device_tensors_;
  std::vector<HostTensor*> hosts_;
  std::vector<std::unique_ptr<DeviceBuffer>> device_buffers_;
  std::vector<std::unique_ptr<AlignedBuffer>> host_buffers_;
};

// Segment boundaries of `blocks` blocks of `rows` rows each (one expert's slice of a weight gradient).
inline std::vector<int64_t> blocks_of(int64_t blocks, int64_t rows) {
  std::vector<int64_t> s;
  for (int64_t e = 0; e <= blocks; ++e) s.push_back(e * rows);
  return s;
}

// REQUIRE that `cuda` is within docs/math.md section 9's bounds of `ref` (rows of `width` values;
// `segments` as in compare()).
inline void require_close(const char* name, const std::vector<double>& cuda, const std::vector<double>& ref,
                          int64_t width, moekit_dtype_t dtype, const std::vector<int64_t>& segments = {}) {
  const ErrorMetrics m = compare(cuda, ref, width, segments);
  INFO(name << ": " << describe(m));
  REQUIRE(within(m, bounds_for(dtype)));
}

// The same for whole tensors, whose rows are the last dimension (docs/math.md section 9): an [E, M, N] weight gradient
// is E*M rows of N, and blocks_of(E, M) gives its per-expert segments.
inline void require_close(const char* name, const HostTensor& cuda, const HostTensor& ref, moekit_dtype_t dtype,
                          const std::vector<int64_t>& segments = {}) {
  const int64_t width = ref.shape().empty() ? 1 : ref.shape().back();
  require_close(name, cuda.values(), ref.values(), width, dtype, segments);
}

}  // namespace moekit_test
