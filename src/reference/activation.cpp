#include "src/reference/activation.h"

#include <algorithm>
#include <cmath>

#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace ref {

namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
constexpr double kOaiAlpha = 1.702;  // gpt-oss: gate * sigmoid(1.702 gate)

double gelu_tanh(double z) { return 0.5 * z * (1.0 + std::tanh(kSqrt2OverPi * (z + kGeluCubic * z * z * z))); }

double gelu_tanh_grad(double z) {
  double t = std::tanh(kSqrt2OverPi * (z + kGeluCubic * z * z * z));
  return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * z * z);
}

double relu(double z) { return z > 0.0 ? z : 0.0; }
double relu_grad(double z) { return z > 0.0 ? 1.0 : 0.0; }  // relu'(0) = 0

// The gate function of a gated activation (not SWIGLU_OAI, which also transforms up).
double gate_value(int32_t activation, double g) {
  switch (activation) {
    case MOEKIT_ACT_SWIGLU: return silu(g);
    case MOEKIT_ACT_GEGLU: return gelu_tanh(g);
    default: return relu(g);  // REGLU
  }
}
double gate_grad(int32_t activation, double g) {
  switch (activation) {
    case MOEKIT_ACT_SWIGLU: return silu_grad(g);
    case MOEKIT_ACT_GEGLU: return gelu_tanh_grad(g);
    default: return relu_grad(g);
  }
}

double plain_value(int32_t activation, double z) {
  switch (activation) {
    case MOEKIT_ACT_GELU: return gelu_tanh(z);
    case MOEKIT_ACT_RELU: return relu(z);
    case MOEKIT_ACT_SILU: return silu(z);
    default: return relu(z) * relu(z);  // RELU2
  }
}
double plain_grad(int32_t activation, double z) {
  switch (activation) {
    case MOEKIT_ACT_GELU: return gelu_tanh_grad(z);
    case MOEKIT_ACT_RELU: return relu_grad(z);
    case MOEKIT_ACT_SILU: return silu_grad(z);
    default: return 2.0 * relu(z);  // RELU2
  }
}

// Positions of gate j and up j inside an h row.
struct GluIndex {
  int64_t gate, up;
};
GluIndex glu_index(const ActivationSpec& spec, int64_t j) {
  if (spec.glu_layout == MOEKIT_GLU_INTERLEAVED) return GluIndex{2 * j, 2 * j + 1};
  return GluIndex{j, spec.width + j};
}

}  // namespace

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }
double silu(double z) { return z * sigmoid(z); }
double silu_grad(double z) {
  double s = sigmoid(z);
  return s * (1.0 + z * (1.0 - s));
}

bool is_gated(int32_t activation) {
  return activation == MOEKIT_ACT_SWIGLU || activation == MOEKIT_ACT_GEGLU || activation == MOEKIT_ACT_REGLU ||
         activation == MOEKIT_ACT_SWIGLU_OAI;
}

int64_t h_width(const ActivationSpec& spec) { return is_gated(spec.activation) ? 2 * spec.width : spec.width; }

void activation_forward(const ActivationSpec& spec, const double* h, double* a) {
  if (!is_gated(spec.activation)) {
    for (int64_t j = 0; j < spec.width; ++j) a[j] = plain_value(spec.activation, h[j]);
    return;
  }
  for (int64_t j = 0; j < spec.width; ++j) {
    GluIndex at = glu_index(spec, j);
    double g = h[at.gate];
    double u = h[at.up];
    if (spec.activation == MOEKIT_ACT_SWIGLU_OAI) {
      double gc = std::min(g, spec.limit);
      double uc = std::clamp(u, -spec.limit, spec.limit);
      a[j] = gc * sigmoid(kOaiAlpha * gc) * (uc + 1.0);
    } else {
      a[j] = gate_value(spec.activation, g) * u;
    }
  }
}

void activation_backward(const ActivationSpec& spec, const double* h, const double* da, double* dh) {
  if (!is_gated(spec.activation)) {
    for (int64_t j = 0; j < spec.width; ++j) dh[j] = da[j] * plain_grad(spec.activation, h[j]);
    return;
  }
  for (int64_t j = 0; j < spec.width; ++j) {
    GluIndex at = glu_index(spec, j);
    double g = h[at.gate];
    double u = h[at.up];
    if (spec.activation == MOEKIT_ACT_SWIGLU_OAI) {
      // NOTE: min and clamp pass the gradient at exactly the limit (as torch.clamp does), none strictly beyond.
      double gc = std::min(g, spec.limit);
      double uc = std::clamp(u, -spec.limit, spec.limit);
      double s = sigmoid(kOaiAlpha * gc);
      double gate_part = g <= spec.limit ? s * (1.0 + kOaiAlpha * gc * (1.0 - s)) : 0.0;
      bool up_passes = u >= -spec.limit && u <= spec.limit;
      dh[at.gate] = da[j] * (uc + 1.0) * gate_part;
      dh[at.up] = up_passes ? da[j] * gc * s : 0.0;
    } else {
      dh[at.gate] = da[j] * u * gate_grad(spec.activation, g);
      dh[at.up] = da[j] * gate_value(spec.activation, g);
    }
  }
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
