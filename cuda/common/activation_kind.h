// Which activations are gated (GLU: act(gate) * up over the two halves of h, so h is 2I wide): the one definition
// the host planners, the C ABI's checks, the bench and the device epilogues share. Plain C++, includable from g++
// and nvcc alike.
#pragma once

#include <cstdint>

#include "moekit/moekit.h"

#if defined(__CUDACC__)
#define MOEKIT_HOST_DEVICE __host__ __device__
#else
#define MOEKIT_HOST_DEVICE
#endif

namespace moekit {
inline namespace v0 {

MOEKIT_HOST_DEVICE constexpr bool is_gated_activation(int32_t kind) {
  return kind == MOEKIT_ACT_SWIGLU || kind == MOEKIT_ACT_GEGLU || kind == MOEKIT_ACT_REGLU ||
         kind == MOEKIT_ACT_SWIGLU_OAI;
}

// The width of h for an activation of `intermediate` output columns: 2I when gated, I otherwise.
MOEKIT_HOST_DEVICE constexpr int64_t gated_input_width(int32_t kind, int64_t intermediate) {
  return is_gated_activation(kind) ? 2 * intermediate : intermediate;
}

}  // namespace v0
}  // namespace moekit
