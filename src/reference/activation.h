// The expert activations of docs/math.md section 3, forward and backward, in float64, one row of h at a time.
// Gated activations read gate and up from one h row of width 2I (layout concat or interleaved) and produce an
// a row of width I; non-gated ones map an I-wide h row to an I-wide a row.
#pragma once

#include <cstdint>

namespace moekit {
inline namespace v0 {
namespace ref {

struct ActivationSpec {
  int32_t activation;  // moekit_activation_t
  int32_t glu_layout;  // moekit_glu_layout_t (gated activations)
  double limit;        // SWIGLU_OAI's L
  int64_t width;       // I: the width of a (one GLU half)
};

bool is_gated(int32_t activation);
// Width of an h row: 2I gated, I otherwise.
int64_t h_width(const ActivationSpec& spec);

// a [I] = act(h) for one row h [h_width].
void activation_forward(const ActivationSpec& spec, const double* h, double* a);
// dh [h_width] = the gradient of act at h, applied to da [I] (relu'(0) = 0; clamps pass no gradient strictly
// beyond L).
void activation_backward(const ActivationSpec& spec, const double* h, const double* da, double* dh);

// The scalar functions, shared with the sparse FFN.
double sigmoid(double z);
double silu(double z);
double silu_grad(double z);

}  // namespace ref
}  // namespace v0
}  // namespace moekit
