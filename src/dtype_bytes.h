// The bytes of one element of a moekit dtype, for the library and the expert-parallel layer built over it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {

// 0 for an unknown dtype.
inline size_t dtype_bytes(int32_t dtype) {
  switch (dtype) {
    case MOEKIT_DTYPE_FP8_E4M3:
    case MOEKIT_DTYPE_FP8_E5M2: return 1;
    case MOEKIT_DTYPE_BF16:
    case MOEKIT_DTYPE_FP16: return 2;
    case MOEKIT_DTYPE_FP32:
    case MOEKIT_DTYPE_INT32: return 4;
    case MOEKIT_DTYPE_FP64:
    case MOEKIT_DTYPE_INT64: return 8;
    default: return 0;
  }
}

}  // namespace v0
}  // namespace moekit
