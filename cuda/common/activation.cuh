// The expert activations of SPEC section 3 in fp32 on the device, forward and backward, chosen at run time
// (DESIGN.md "Build budget": the activation is an epilogue switch, never a template parameter). The math is the
// reference's (src/reference/activation.cpp) with fp32 library functions (expf, tanhf: a few ulp).
#pragma once

#include <cstdint>

#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

struct DeviceActivation {
  int32_t kind;  // moekit_activation_t
  float limit;   // SWIGLU_OAI's L
};

__host__ __device__ constexpr bool is_gated_activation(int32_t kind) {
  return kind == MOEKIT_ACT_SWIGLU || kind == MOEKIT_ACT_GEGLU || kind == MOEKIT_ACT_REGLU ||
         kind == MOEKIT_ACT_SWIGLU_OAI;
}

namespace activation_math {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
constexpr float kOaiAlpha = 1.702f;  // gpt-oss: gate * sigmoid(1.702 gate)

__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }
__device__ __forceinline__ float silu(float z) { return z * sigmoid(z); }
__device__ __forceinline__ float silu_grad(float z) {
  const float s = sigmoid(z);
  return s * (1.0f + z * (1.0f - s));
}
__device__ __forceinline__ float gelu_tanh(float z) {
  return 0.5f * z * (1.0f + tanhf(kSqrt2OverPi * (z + kGeluCubic * z * z * z)));
}
__device__ __forceinline__ float gelu_tanh_grad(float z) {
  const float t = tanhf(kSqrt2OverPi * (z + kGeluCubic * z * z * z));
  return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * z * z);
}
__device__ __forceinline__ float relu(float z) { return z > 0.0f ? z : 0.0f; }
__device__ __forceinline__ float relu_grad(float z) { return z > 0.0f ? 1.0f : 0.0f; }  // relu'(0) = 0

}  // namespace activation_math

// a = act(gate, up) for a gated kind.
__device__ __forceinline__ float gated_forward(const DeviceActivation& act, float g, float u) {
  using namespace activation_math;
  switch (act.kind) {
    case MOEKIT_ACT_SWIGLU: return silu(g) * u;
    case MOEKIT_ACT_GEGLU: return gelu_tanh(g) * u;
    case MOEKIT_ACT_REGLU: return relu(g) * u;
    default: {  // SWIGLU_OAI
      const float gc = fminf(g, act.limit);
      const float uc = fminf(fmaxf(u, -act.limit), act.limit);
      return gc * sigmoid(kOaiAlpha * gc) * (uc + 1.0f);
    }
  }
}

// (dgate, dup) for a gated kind at (g, u) applied to da. SWIGLU_OAI's clamps pass the gradient at exactly the
// limit and none strictly beyond it.
__device__ __forceinline__ void gated_backward(const DeviceActivation& act, float g, float u, float da, float& dg,
                                               float& du) {
  using namespace activation_math;
  switch (act.kind) {
    case MOEKIT_ACT_SWIGLU:
      dg = da * u * silu_grad(g);
      du = da * silu(g);
      return;
    case MOEKIT_ACT_GEGLU:
      dg = da * u * gelu_tanh_grad(g);
      du = da * gelu_tanh(g);
      return;
    case MOEKIT_ACT_REGLU:
      dg = da * u * relu_grad(g);
      du = da * relu(g);
      return;
    default: {  // SWIGLU_OAI
      const float gc = fminf(g, act.limit);
      const float uc = fminf(fmaxf(u, -act.limit), act.limit);
      const float s = sigmoid(kOaiAlpha * gc);
      const float gate_part = g <= act.limit ? s * (1.0f + kOaiAlpha * gc * (1.0f - s)) : 0.0f;
      const bool up_passes = u >= -act.limit && u <= act.limit;
      dg = da * (uc + 1.0f) * gate_part;
      du = up_passes ? da * gc * s : 0.0f;
      return;
    }
  }
}

// a = act(z) for a non-gated kind.
__device__ __forceinline__ float plain_forward(const DeviceActivation& act, float z) {
  using namespace activation_math;
  switch (act.kind) {
    case MOEKIT_ACT_GELU: return gelu_tanh(z);
    case MOEKIT_ACT_RELU: return relu(z);
    case MOEKIT_ACT_SILU: return silu(z);
    default: return relu(z) * relu(z);  // RELU2
  }
}

// act'(z) for a non-gated kind.
__device__ __forceinline__ float plain_grad(const DeviceActivation& act, float z) {
  using namespace activation_math;
  switch (act.kind) {
    case MOEKIT_ACT_GELU: return gelu_tanh_grad(z);
    case MOEKIT_ACT_RELU: return relu_grad(z);
    case MOEKIT_ACT_SILU: return silu_grad(z);
    default: return 2.0f * relu(z);  // RELU2
  }
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
