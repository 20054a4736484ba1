// The router's auxiliary losses (docs/math.md section 1.1) in float64: their values and their gradients w.r.t. the
// logits. Shared by the reference router operation and the reference MoE layer.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace ref {

struct AuxLossSpec {
  int64_t experts;
  int64_t top_k;
  double load_balance_coeff;  // 0 = off
  double z_loss_coeff;        // 0 = off
};

struct AuxLosses {
  double load_balance;
  double z;
};

AuxLossSpec aux_loss_spec(const moekit_router_desc_t& d);
AuxLossSpec aux_loss_spec(const moekit_moe_desc_t& d);

// The values of both losses (0 for a loss that is off, and for T = 0), from logits [T, E] and indices [T, K].
AuxLosses aux_losses(const AuxLossSpec& spec, int64_t tokens, const double* logits, const int64_t* indices);

// dlogits [T, E] += d_load_balance * dLB/dlogits + d_z * dZ/dlogits (f_e held constant, as section 1.1 says).
void add_aux_loss_gradient(const AuxLossSpec& spec, int64_t tokens, const double* logits, const int64_t* indices,
                           double d_load_balance, double d_z, double* dlogits);

// A loss's upstream gradient from its optional one-element tensor: 1 when absent.
double upstream_gradient(const moekit_tensor_t& t);
// Writes a loss value into its optional one-element tensor.
void write_loss(const moekit_tensor_t& t, double value);

}  // namespace ref
}  // namespace v0
}  // namespace moekit
