#include "capi/expert_weights.h"

#include "capi/desc.h"
#include "cuda/common/status_error.h"

namespace moekit {
inline namespace v0 {
namespace capi {

ExpertExtents expert_extents(const moekit_moe_desc_t& d) {
  const bool gated = is_gated_activation(d.activation);
  return ExpertExtents{{d.experts, "E"},
                       {gated ? 2 * d.intermediate : d.intermediate, gated ? "2I" : "I"},
                       {d.hidden, "H"},
                       {d.intermediate, "I"}};
}

void resolve_expert_fields(const moekit_handle& handle, moekit_moe_desc_t& d) {
  require_positive("max_tokens", d.max_tokens);
  require_int32_count("max_tokens", d.max_tokens, "max_tokens");
  require_positive("hidden", d.hidden);
  require_positive("intermediate", d.intermediate);
  require_positive("experts", d.experts);
  require_activation_options(d.activation, d.glu_layout, d.glu_limit);
  const TensorDim h_width{"intermediate", d.intermediate, is_gated_activation(d.activation) ? 2 : 1};
  require_tensor_size("x", {{"max_tokens", d.max_tokens}, {"hidden", d.hidden}});
  require_tensor_size("w1", {{"experts", d.experts}, h_width, {"hidden", d.hidden}});
  // The saved h: [rows, h width] (the MoE layer adds its top-k, below).
  require_tensor_size("h", {{"max_tokens", d.max_tokens}, h_width});
  require_flag("has_b1", d.has_b1);
  require_flag("has_b2", d.has_b2);
  require_flag("inference", d.inference);
  require_flag("backward_overwrites_saved", d.backward_overwrites_saved);
  require_flag("backward_scratch_in_dw1", d.backward_scratch_in_dw1);
  require_float_dtype(handle, "dtype", d.dtype);
  d.weight_grad_dtype = resolve_out_dtype("weight_grad_dtype", d.weight_grad_dtype, d.dtype);
}

void check_expert_weights(const TensorRules& r, const moekit_moe_desc_t& d, const moekit_tensor_t& w1,
                          const moekit_tensor_t* b1, const moekit_tensor_t& w2, const moekit_tensor_t* b2) {
  const ExpertExtents x = expert_extents(d);
  TensorCheck(r, "w1", w1).dtype(d.dtype).shape({x.e, x.w, x.h}).check();
  if (b1)
    TensorCheck(r, "b1", *b1)
        .dtype(d.dtype)
        .shape({x.e, x.w})
        .required_iff(d.has_b1, "the plan has has_b1 = 0")
        .check();
  TensorCheck(r, "w2", w2).dtype(d.dtype).shape({x.e, x.h, x.i}).check();
  if (b2)
    TensorCheck(r, "b2", *b2)
        .dtype(d.dtype)
        .shape({x.e, x.h})
        .required_iff(d.has_b2, "the plan has has_b2 = 0")
        .check();
}

void check_expert_backward(const TensorRules& r, const moekit_moe_desc_t& d, const Extent& rows,
                           const moekit_tensor_t& x, const moekit_tensor_t& w1, const moekit_tensor_t& w2,
                           const ExpertGradients& g) {
  require_flag("compute_input_grad", g.compute_input_grad);
  require_flag("compute_weight_grad", g.compute_weight_grad);
  const ExpertExtents ext = expert_extents(d);
  TensorCheck(r, "x", x).dtype(d.dtype).shape({rows, ext.h}).check();
  check_expert_weights(r, d, w1, nullptr, w2, nullptr);
  TensorCheck(r, "dx", g.dx).dtype(d.dtype).shape({rows, ext.h}).used_if(g.compute_input_grad).check();
  const bool weights = g.compute_weight_grad != 0;
  const int32_t wg = d.weight_grad_dtype;
  // backward_scratch_in_dw1: the backward may use dw1 as flat scratch before it writes dW1 there (beta 0).
  const bool scratch = d.backward_scratch_in_dw1 != 0;
  const char* why_scratch = "the plan has backward_scratch_in_dw1 = 1: dw1 holds the backward's scratch first";
  if (scratch && !weights) throw_invalid(std::string("compute_weight_grad: must be 1 where ") + why_scratch);
  if (scratch && g.beta_dw1 != 0.0) throw_invalid(std::string("beta_dw1: must be 0 where ") + why_scratch);
  TensorCheck(r, "dw1", g.dw1)
      .dtype(wg)
      .shape({ext.e, ext.w, ext.h})
      .contiguous_if(scratch, why_scratch)
      .used_if(weights)
      .check();
  TensorCheck(r, "db1", g.db1)
      .dtype(wg)
      .shape({ext.e, ext.w})
      .required_iff(d.has_b1, "the plan has has_b1 = 0")
      .used_if(weights)
      .check();
  TensorCheck(r, "dw2", g.dw2).dtype(wg).shape({ext.e, ext.h, ext.i}).used_if(weights).check();
  TensorCheck(r, "db2", g.db2)
      .dtype(wg)
      .shape({ext.e, ext.h})
      .required_iff(d.has_b2, "the plan has has_b2 = 0")
      .used_if(weights)
      .check();
  require_finite("beta_dx", g.beta_dx);
  require_finite("beta_dw1", g.beta_dw1);
  require_finite("beta_db1", g.beta_db1);
  require_finite("beta_dw2", g.beta_dw2);
  require_finite("beta_db2", g.beta_db2);
}

void add_expert_weight_values(std::vector<ValueCheck>& list, const moekit_tensor_t& w1, const moekit_tensor_t& b1,
                              const moekit_tensor_t& w2, const moekit_tensor_t& b2) {
  add_finite(list, "w1", w1);
  add_finite(list, "b1", b1);
  add_finite(list, "w2", w2);
  add_finite(list, "b2", b2);
}

void add_expert_gradient_values(CallChecks& checks, const ExpertGradients& g, RowBound rows) {
  const bool input = g.compute_input_grad != 0, weight = g.compute_weight_grad != 0;
  add_gradient(checks, "dx", g.dx, input, g.beta_dx, rows);
  add_gradient(checks, "dw1", g.dw1, weight, g.beta_dw1);
  add_gradient(checks, "db1", g.db1, weight && is_present(g.db1), g.beta_db1);
  add_gradient(checks, "dw2", g.dw2, weight, g.beta_dw2);
  add_gradient(checks, "db2", g.db2, weight && is_present(g.db2), g.beta_db2);
}

}  // namespace capi
}  // namespace v0
}  // namespace moekit
