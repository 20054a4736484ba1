// The checks of the router's auxiliary losses (docs/math.md section 1.1), shared by the router and the MoE layer:
// their coefficients in a descriptor, and the one-element tensors of their values and upstream gradients.
#pragma once

#include <cstdint>

#include "capi/validate.h"
#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace capi {

// Both coefficients finite and >= 0 (0 = off); a load-balancing loss on a router kind without a softmax over every
// expert is NOT_SUPPORTED.
void require_aux_losses(int32_t kind, double load_balance_coeff, double z_loss_coeff);

// A loss value or its upstream gradient: one score-dtype element read flat, optional, and allowed only when the
// loss is on (coeff != 0).
void check_loss_scalar(const TensorRules& rules, const char* name, const moekit_tensor_t& t, int32_t plan_dtype,
                       double coeff, const char* coeff_name);

}  // namespace capi
}  // namespace v0
}  // namespace moekit
