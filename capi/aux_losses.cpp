#include "capi/aux_losses.h"

#include <string>
#include <utility>

#include "capi/desc.h"
#include "cuda/common/status_error.h"

namespace moekit {
inline namespace v0 {
namespace capi {
namespace {

void check_loss_scalar(const TensorRules& rules, const char* name, const moekit_tensor_t& t, int32_t plan_dtype,
                       double coeff, const char* coeff_name) {
  TensorCheck(rules, name, t)
      .score_dtype(plan_dtype)
      .flat({1, "1"})
      .optional_iff(coeff != 0, std::string("the plan has ") + coeff_name + " = 0")
      .check();
}

}  // namespace

void require_aux_losses(int32_t kind, double load_balance_coeff, double z_loss_coeff) {
  for (auto [name, coeff] : {std::pair{"load_balance_coeff", load_balance_coeff}, std::pair{"z_loss_coeff", z_loss_coeff}}) {
    require_finite(name, coeff);
    if (coeff < 0) throw_invalid(std::string(name) + ": must be >= 0 (0 = off), got " + std::to_string(coeff));
  }
  // NOTE: P_e is a mean of softmax probabilities over all E; TOPK and SIGMOID have no such softmax, and a
  // normalisation made up for them would be another loss than the one a training recipe expects.
  if (load_balance_coeff != 0 && kind != MOEKIT_ROUTER_SOFTMAX_TOPK && kind != MOEKIT_ROUTER_TOPK_SOFTMAX)
    throw_not_supported("load_balance_coeff: the load-balancing loss needs a softmax router kind (SOFTMAX_TOPK or "
                        "TOPK_SOFTMAX), got kind " + std::to_string(kind));
}

void check_loss_tensors(const TensorRules& rules, LossSide side, const moekit_tensor_t& load_balance,
                        const moekit_tensor_t& z_loss, int32_t plan_dtype, double load_balance_coeff,
                        double z_loss_coeff) {
  const bool backward = side == LossSide::backward;
  check_loss_scalar(rules, backward ? "dload_balance_loss" : "load_balance_loss", load_balance, plan_dtype,
                    load_balance_coeff, "load_balance_coeff");
  check_loss_scalar(rules, backward ? "dz_loss" : "z_loss", z_loss, plan_dtype, z_loss_coeff, "z_loss_coeff");
}

void add_loss_values(CallChecks& checks, LossSide side, const moekit_tensor_t& load_balance,
                     const moekit_tensor_t& z_loss) {
  if (side == LossSide::backward) {
    add_finite(checks.inputs, "dload_balance_loss", load_balance);
    add_finite(checks.inputs, "dz_loss", z_loss);
  } else {
    add_finite(checks.outputs, "load_balance_loss", load_balance);
    add_finite(checks.outputs, "z_loss", z_loss);
  }
}

}  // namespace capi
}  // namespace v0
}  // namespace moekit
