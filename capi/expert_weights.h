// What the MoE layer and the experts-alone layer share: the descriptor fields of the experts, and the checks of
// the expert weights and of their gradients in the backward.
#pragma once

#include "capi/validate.h"
#include "capi/value_checks.h"
#include "moekit/moekit.h"
#include "src/plan.h"

namespace moekit {
inline namespace v0 {
namespace capi {

// E, the width of h ("2I", or "I" for a non-gated activation), H and I.
struct ExpertExtents {
  Extent e, w, h, i;
};
ExpertExtents expert_extents(const moekit_moe_desc_t& d);

// The fields moekit_experts_plan_create uses: max_tokens (the row bound), hidden, intermediate, experts,
// activation, glu_layout, glu_limit, has_b1, has_b2, inference, backward_overwrites_saved, dtype,
// weight_grad_dtype (resolved).
void resolve_expert_fields(const moekit_handle& handle, moekit_moe_desc_t& d);

// w1 [E, 2I, H], w2 [E, H, I], and b1 [E, 2I] / b2 [E, H] when the args struct has them (nullptr otherwise):
// present iff has_b1 / has_b2.
void check_expert_weights(const TensorRules& r, const moekit_moe_desc_t& d, const moekit_tensor_t& w1,
                          const moekit_tensor_t* b1, const moekit_tensor_t& w2, const moekit_tensor_t* b2);

struct ExpertGradients {
  const moekit_tensor_t& dx;
  const moekit_tensor_t& dw1;
  const moekit_tensor_t& db1;
  const moekit_tensor_t& dw2;
  const moekit_tensor_t& db2;
  int32_t compute_input_grad, compute_weight_grad;
  double beta_dx, beta_dw1, beta_db1, beta_dw2, beta_db2;
};

// The flags, x [rows, H], w1, w2, and the gradients of a backward: dx [rows, H] when the input gradient is
// computed; dw1, db1 (iff has_b1), dw2, db2 (iff has_b2) in weight_grad_dtype when the weight gradients are.
void check_expert_backward(const TensorRules& r, const moekit_moe_desc_t& d, const Extent& rows,
                           const moekit_tensor_t& x, const moekit_tensor_t& w1, const moekit_tensor_t& w2,
                           const ExpertGradients& g);

template <class BwdArgs>
ExpertGradients gradients_of(const BwdArgs& a) {
  return ExpertGradients{
      a.dx,      a.dw1,      a.db1,      a.dw2,      a.db2,     a.compute_input_grad, a.compute_weight_grad,
      a.beta_dx, a.beta_dw1, a.beta_db1, a.beta_dw2, a.beta_db2};
}

// Value checks (MOEKIT_HANDLE_VALIDATE): the weights (and biases, absent ones skipped) are finite inputs; each
// requested gradient is a finite output (and an input when its beta is not 0); dx only in the rows `rows`.
void add_expert_weight_values(std::vector<ValueCheck>& list, const moekit_tensor_t& w1, const moekit_tensor_t& b1,
                              const moekit_tensor_t& w2, const moekit_tensor_t& b2);
void add_expert_gradient_values(CallChecks& checks, const ExpertGradients& g, RowBound rows = {});

}  // namespace capi
}  // namespace v0
}  // namespace moekit
