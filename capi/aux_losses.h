// The checks of the router's auxiliary losses (docs/math.md section 1.1), shared by the router and the MoE layer:
// their coefficients in a descriptor, and the one-element tensors of their values and upstream gradients.
#pragma once

#include <cstdint>

#include "capi/validate.h"
#include "capi/value_checks.h"
#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace capi {

// Both coefficients finite and >= 0 (0 = off); a load-balancing loss on a router kind without a softmax over every
// expert is NOT_SUPPORTED.
void require_aux_losses(int32_t kind, double load_balance_coeff, double z_loss_coeff);

// Which tensors of the two losses a call passes: the values a forward writes (load_balance_loss, z_loss) or the
// upstream gradients a backward reads (dload_balance_loss, dz_loss).
enum class LossSide { forward, backward };

// Each one score-dtype element read flat, optional, and allowed only when its loss is on (coeff != 0).
void check_loss_tensors(const TensorRules& rules, LossSide side, const moekit_tensor_t& load_balance,
                        const moekit_tensor_t& z_loss, int32_t plan_dtype, double load_balance_coeff,
                        double z_loss_coeff);

// Both finite: outputs of a forward, inputs of a backward.
void add_loss_values(CallChecks& checks, LossSide side, const moekit_tensor_t& load_balance,
                     const moekit_tensor_t& z_loss);

}  // namespace capi
}  // namespace v0
}  // namespace moekit
