// The expert activations of docs/math.md section 3 in fp32 on the device, forward and backward, chosen at run time
// (the activation is an epilogue switch, never a template parameter). The math is the
// reference's (src/reference/activation.cpp) in fp32, the exponential and reciprocal approximate (sigmoid below).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/activation_kind.h"
#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

struct DeviceActivation {
  int32_t kind;  // moekit_activation_t
  float limit;   // SWIGLU_OAI's L
};

namespace activation_math {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
constexpr float kOaiAlpha = 1.702f;  // gpt-oss: gate * sigmoid(1.702 gate)

constexpr float kLog2E = 1.4426950408889634f;

// NOTE: sigmoid by ex2.approx and rcp.approx (4 instructions; relative error ~2^-22, far below the bf16 / fp16
// rounding of every output) instead of expf and an IEEE division (~20 instructions and a slow-path branch per
// value): the activation epilogues are instruction-bound (the up-projection's GATED epilogue ran ~2,500
// instructions per warp and tile). Flush-to-zero forms: no denormal fix-ups. Saturates cleanly: sigmoid(z) = 0
// for z below ~-88 (2^126 < 1 + e^-z, whose reciprocal flushes to 0) and 1 for large z.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float reciprocal_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float sigmoid(float z) { return reciprocal_approx(1.0f + exp2_approx(-kLog2E * z)); }
__device__ __forceinline__ float silu(float z) { return z * sigmoid(z); }
__device__ __forceinline__ float silu_grad(float z) {
  const float s = sigmoid(z);
  return s * (1.0f + z * (1.0f - s));
}
// gelu_tanh(z) = 0.5 z (1 + tanh(v)) = z sigmoid(2 v), v = sqrt(2/pi) (z + 0.044715 z^3): one exponential.
__device__ __forceinline__ float gelu_tanh_sigmoid(float z) {
  return sigmoid(2.0f * kSqrt2OverPi * (z + kGeluCubic * z * z * z));
}
__device__ __forceinline__ float gelu_tanh(float z) { return z * gelu_tanh_sigmoid(z); }
// d/dz: 0.5 (1 + t) + 0.5 z (1 - t^2) v' with t = tanh(v) = 2 s - 1: s + 2 z s (1 - s) v'.
__device__ __forceinline__ float gelu_tanh_grad(float z) {
  const float s = gelu_tanh_sigmoid(z);
  return s + 2.0f * z * s * (1.0f - s) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * z * z);
}
__device__ __forceinline__ float relu(float z) { return z > 0.0f ? z : 0.0f; }
__device__ __forceinline__ float relu_grad(float z) { return z > 0.0f ? 1.0f : 0.0f; }  // relu'(0) = 0

}  // namespace activation_math

// An activation kind known at compile time (ActivationKind<K>::value), for loops whose every value has the same
// kind: with_gated_kind / with_plain_kind pick the kind once and run f with it, so the kind's switch is taken once
// per call instead of once per value.
template <int32_t K>
using ActivationKind = std::integral_constant<int32_t, K>;

template <class F>
__device__ __forceinline__ void with_gated_kind(int32_t kind, F&& f) {
  switch (kind) {
    case MOEKIT_ACT_SWIGLU: f(ActivationKind<MOEKIT_ACT_SWIGLU>{}); return;
    case MOEKIT_ACT_GEGLU: f(ActivationKind<MOEKIT_ACT_GEGLU>{}); return;
    case MOEKIT_ACT_REGLU: f(ActivationKind<MOEKIT_ACT_REGLU>{}); return;
    default: f(ActivationKind<MOEKIT_ACT_SWIGLU_OAI>{}); return;
  }
}

template <class F>
__device__ __forceinline__ void with_plain_kind(int32_t kind, F&& f) {
  switch (kind) {
    case MOEKIT_ACT_GELU: f(ActivationKind<MOEKIT_ACT_GELU>{}); return;
    case MOEKIT_ACT_RELU: f(ActivationKind<MOEKIT_ACT_RELU>{}); return;
    case MOEKIT_ACT_SILU: f(ActivationKind<MOEKIT_ACT_SILU>{}); return;
    default: f(ActivationKind<MOEKIT_ACT_RELU2>{}); return;
  }
}

// a = act(gate, up) for gated kind K (limit: SWIGLU_OAI's L).
template <int32_t K>
__device__ __forceinline__ float gated_forward(float limit, float g, float u) {
  using namespace activation_math;
  if constexpr (K == MOEKIT_ACT_SWIGLU) return silu(g) * u;
  if constexpr (K == MOEKIT_ACT_GEGLU) return gelu_tanh(g) * u;
  if constexpr (K == MOEKIT_ACT_REGLU) return relu(g) * u;
  if constexpr (K == MOEKIT_ACT_SWIGLU_OAI) {
    const float gc = fminf(g, limit);
    const float uc = fminf(fmaxf(u, -limit), limit);
    return gc * sigmoid(kOaiAlpha * gc) * (uc + 1.0f);
  }
}

// (dgate, dup) for gated kind K at (g, u) applied to da. SWIGLU_OAI's clamps pass the gradient at exactly the
// limit and none strictly beyond it.
template <int32_t K>
__device__ __forceinline__ void gated_backward(float limit, float g, float u, float da, float& dg, float& du) {
  using namespace activation_math;
  if constexpr (K == MOEKIT_ACT_SWIGLU) {
    dg = da * u * silu_grad(g);
    du = da * silu(g);
  } else if constexpr (K == MOEKIT_ACT_GEGLU) {
    dg = da * u * gelu_tanh_grad(g);
    du = da * gelu_tanh(g);
  } else if constexpr (K == MOEKIT_ACT_REGLU) {
    dg = da * u * relu_grad(g);
    du = da * relu(g);
  } else {
    const float gc = fminf(g, limit);
    const float uc = fminf(fmaxf(u, -limit), limit);
    const float s = sigmoid(kOaiAlpha * gc);
    const float gate_part = g <= limit ? s * (1.0f + kOaiAlpha * gc * (1.0f - s)) : 0.0f;
    const bool up_passes = u >= -limit && u <= limit;
    dg = da * (uc + 1.0f) * gate_part;
    du = up_passes ? da * gc * s : 0.0f;
  }
}

// a = act(z) for non-gated kind K.
template <int32_t K>
__device__ __forceinline__ float plain_forward(float z) {
  using namespace activation_math;
  if constexpr (K == MOEKIT_ACT_GELU) return gelu_tanh(z);
  if constexpr (K == MOEKIT_ACT_RELU) return relu(z);
  if constexpr (K == MOEKIT_ACT_SILU) return silu(z);
  if constexpr (K == MOEKIT_ACT_RELU2) return relu(z) * relu(z);
}

// act'(z) for non-gated kind K.
template <int32_t K>
__device__ __forceinline__ float plain_grad(float z) {
  using namespace activation_math;
  if constexpr (K == MOEKIT_ACT_GELU) return gelu_tanh_grad(z);
  if constexpr (K == MOEKIT_ACT_RELU) return relu_grad(z);
  if constexpr (K == MOEKIT_ACT_SILU) return silu_grad(z);
  if constexpr (K == MOEKIT_ACT_RELU2) return 2.0f * relu(z);
}

// The same for a kind known at run time only (one value at a time: the tests' oracle kernels).
__device__ __forceinline__ float gated_forward(const DeviceActivation& act, float g, float u) {
  float a = 0.0f;
  with_gated_kind(act.kind, [&](auto kind) { a = gated_forward<decltype(kind)::value>(act.limit, g, u); });
  return a;
}

__device__ __forceinline__ void gated_backward(const DeviceActivation& act, float g, float u, float da, float& dg,
                                               float& du) {
  with_gated_kind(act.kind,
                  [&](auto kind) { gated_backward<decltype(kind)::value>(act.limit, g, u, da, dg, du); });
}

__device__ __forceinline__ float plain_forward(const DeviceActivation& act, float z) {
  float a = 0.0f;
  with_plain_kind(act.kind, [&](auto kind) { a = plain_forward<decltype(kind)::value>(z); });
  return a;
}

__device__ __forceinline__ float plain_grad(const DeviceActivation& act, float z) {
  float d = 0.0f;
  with_plain_kind(act.kind, [&](auto kind) { d = plain_grad<decltype(kind)::value>(z); });
  return d;
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
