// Device tensors for the GPU tests whose shapes are too large for host copies (the [large] oracle tests): an owning
// device array that hands out moekit_tensor_t views, int32 uploads, downloads, and docs/math.md section 9's metrics
// taken on the device (per-row sums by gemm_oracle's device_row_errors, only the sums come back to the host).
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <utility>
#include <vector>

#include "gpu/gemm_oracle.h"
#include "gpu/gpu_util.h"

namespace moekit_test {

struct DeviceArray {
  DeviceBuffer buffer;
  moekit_dtype_t dtype = MOEKIT_DTYPE_INVALID;
  std::vector<int64_t> shape;
  DeviceArray() = default;
  DeviceArray(moekit_dtype_t t, std::vector<int64_t> s) : dtype(t), shape(std::move(s)) {
    buffer = DeviceBuffer(static_cast<size_t>(numel()) * dtype_size(t));
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  void* data() const { return buffer.data(); }
  moekit_tensor_t view() const {
    return moekit_tensor_make(buffer.data(), dtype, static_cast<int32_t>(shape.size()), shape.data(),
                              moekit_device_t{MOEKIT_DEVICE_CUDA, 0});
  }
  void fill(double scale, uint64_t seed) { device_fill_uniform(data(), dtype, numel(), scale, seed); }
  void poison() { CUDA_REQUIRE(cudaMemset(data(), 0xff, static_cast<size_t>(numel()) * dtype_size(dtype))); }
};

template <class T>
std::vector<T> download_vector(const DeviceBuffer& buffer, int64_t count) {
  std::vector<T> v(static_cast<size_t>(count));
  if (count > 0)
    CUDA_REQUIRE(cudaMemcpy(v.data(), buffer.data(), static_cast<size_t>(count) * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

inline DeviceArray upload_int32(const std::vector<int32_t>& values) {
  DeviceArray a(MOEKIT_DTYPE_INT32, {static_cast<int64_t>(values.size())});
  CUDA_REQUIRE(cudaMemcpy(a.data(), values.data(), values.size() * 4, cudaMemcpyHostToDevice));
  return a;
}

// docs/math.md section 9 metrics of the first `rows` rows of two dense device tensors of `width` values.
inline void require_close_device(const void* out, moekit_dtype_t out_dtype, const void* ref, moekit_dtype_t ref_dtype,
                                 int64_t rows, int64_t width, const std::vector<int64_t>& segments,
                                 moekit_dtype_t bounds, const char* what) {
  DeviceBuffer err2(static_cast<size_t>(rows) * 8 + 8), ref2(static_cast<size_t>(rows) * 8 + 8),
      nan(static_cast<size_t>(rows) * 4 + 4);
  device_row_errors(out, out_dtype, ref, ref_dtype, rows, width, static_cast<double*>(err2.data()),
                    static_cast<double*>(ref2.data()), static_cast<int32_t*>(nan.data()));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const std::vector<int32_t> nans = download_vector<int32_t>(nan, rows);
  const bool any_nan = std::any_of(nans.begin(), nans.end(), [](int32_t v) { return v != 0; });
  const ErrorMetrics m = metrics_from_row_sums(download_vector<double>(err2, rows), download_vector<double>(ref2, rows),
                                               width, segments, any_nan);
  INFO(what << ": " << describe(m));
  REQUIRE_FALSE(m.any_nan);
  REQUIRE(within(m, bounds_for(bounds)));
}

}  // namespace moekit_test
