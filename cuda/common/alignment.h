// The alignment of every section the library carves out of a caller's workspace or saved buffer, and of the buffers
// themselves on a CUDA handle: 256 bytes, cudaMalloc's alignment, more than any kernel's vector or TMA access needs.
// Plain C++.
#pragma once

#include <cstddef>

namespace moekit {
inline namespace v0 {

constexpr size_t kSectionAlignment = 256;

// `bytes` rounded up to a whole number of sections' alignment.
constexpr size_t align_to_sections(size_t bytes) {
  return (bytes + kSectionAlignment - 1) / kSectionAlignment * kSectionAlignment;
}

}  // namespace v0
}  // namespace moekit
