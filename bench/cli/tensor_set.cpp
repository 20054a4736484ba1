#include "tensor_set.h"

#include "capi/validate.h"
#include "random_fill.h"

namespace moekit_bench {

size_t dtype_bytes(moekit_dtype_t dtype) {
  return dtype == MOEKIT_DTYPE_INVALID ? 1 : moekit::capi::dtype_bytes(dtype);
}

int64_t TensorSpec::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t TensorSpec::bytes() const { return static_cast<size_t>(elements()) * dtype_bytes(dtype); }

TensorSet::TensorSet(Platform& platform, const std::vector<TensorSpec>& specs, uint64_t seed)
    : platform_(platform), specs_(specs) {
  buffers_.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& s = specs[i];
    buffers_.emplace_back(platform, s.bytes());
    if (s.bytes() == 0) continue;
    if (s.data) {
      platform.upload(buffers_.back().data(), s.data->data(), s.bytes());
    } else if (s.scale > 0.0f && s.dtype != MOEKIT_DTYPE_INVALID) {
      fill_random(platform, buffers_.back().data(), s.dtype, s.elements(), s.scale, seed * 1000003u + i);
    } else {
      platform.zero(buffers_.back().data(), s.bytes());
    }
  }
}

moekit_tensor_t TensorSet::view(size_t index) const {
  const TensorSpec& s = specs_[index];
  return moekit_tensor_make(buffers_[index].data(), s.dtype, static_cast<int32_t>(s.shape.size()), s.shape.data(),
                            platform_.device());
}

std::vector<unsigned char> TensorSet::download(size_t index) const {
  std::vector<unsigned char> host(specs_[index].bytes());
  if (!host.empty()) platform_.download(host.data(), buffers_[index].data(), host.size());
  return host;
}

}  // namespace moekit_bench
