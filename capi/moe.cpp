// The MoE layer (docs/math.md sections 3 and 4): descriptor, argument checks, forward and backward.
#include "capi/aux_losses.h"
#include "capi/call.h"
#include "capi/desc.h"
#include "capi/expert_weights.h"
#include "capi/plan_create.h"

namespace moekit {
inline namespace v0 {
namespace capi {
namespace {

void resolve_moe(const moekit_handle& handle, moekit_moe_desc_t& d) {
  resolve_expert_fields(handle, d);
  require_positive("router_experts", d.router_experts);
  require_in_range("experts", d.experts, 1, d.router_experts, "1 <= experts <= router_experts");
  require_in_range("expert_begin", d.expert_begin, 0, d.router_experts - d.experts,
                   "expert_begin + experts <= router_experts");
  require_top_k("top_k", d.top_k, d.router_experts);
  require_int32_count("top_k", d.max_tokens * d.top_k, "max_tokens * top_k pairs");
  require_tensor_size("w_router", {{"router_experts", d.router_experts}, {"hidden", d.hidden}});
  // Saved for the backward: the router's logits [T, router_experts] and h [T*K, h width].
  require_tensor_size("logits", {{"max_tokens", d.max_tokens}, {"router_experts", d.router_experts}});
  require_tensor_size("h", {{"max_tokens", d.max_tokens},
                            {"top_k", d.top_k},
                            {"intermediate", d.intermediate, is_gated_activation(d.activation) ? 2 : 1}});
  require_router_kind("router", d.router);
  require_flag("renormalize", d.renormalize);
  require_finite("router_scale", d.router_scale);
  require_aux_losses(d.router, d.load_balance_coeff, d.z_loss_coeff);
}

Extent router_experts(const moekit_moe_desc_t& d) { return Extent{d.router_experts, "router_experts"}; }

void check_forward(const moekit_plan& plan, const moekit_moe_fwd_args_t& a) {
  const moekit_moe_desc_t& d = plan.moe;
  const TensorRules r = tensor_rules(plan);
  const Extent t{leading_extent("x", a.x, "T", d.max_tokens, "max_tokens"), "T"};
  const Extent h{d.hidden, "H"}, k{d.top_k, "K"};
  TensorCheck(r, "x", a.x).dtype(d.dtype).shape({t, h}).check();
  TensorCheck(r, "w_router", a.w_router).dtype(d.dtype).shape({router_experts(d), h}).check();
  TensorCheck(r, "router_bias", a.router_bias)
      .dtype(MOEKIT_DTYPE_FP32)
      .shape({router_experts(d)})
      .optional_iff(d.router == MOEKIT_ROUTER_SIGMOID, "only the SIGMOID router kind takes a selection bias")
      .check();
  check_expert_weights(r, d, a.w1, &a.b1, a.w2, &a.b2);
  TensorCheck(r, "out", a.out).dtype(d.dtype).shape({t, h}).check();
  TensorCheck(r, "scores", a.scores).score_dtype(d.dtype).shape({t, k}).optional().check();
  TensorCheck(r, "indices", a.indices).index_dtype().shape({t, k}).optional().check();
  TensorCheck(r, "counts", a.counts).dtype(MOEKIT_DTYPE_INT32).shape({router_experts(d)}).optional().check();
  require_finite("beta_out", a.beta_out);
  check_loss_tensors(r, LossSide::forward, a.load_balance_loss, a.z_loss, d.dtype, d.load_balance_coeff,
                     d.z_loss_coeff);
}

void check_backward(const moekit_plan& plan, const moekit_moe_bwd_args_t& a) {
  const moekit_moe_desc_t& d = plan.moe;
  const TensorRules r = tensor_rules(plan);
  const Extent t{leading_extent("x", a.x, "T", d.max_tokens, "max_tokens"), "T"};
  const Extent h{d.hidden, "H"};
  check_expert_backward(r, d, t, a.x, a.w1, a.w2, gradients_of(a));
  TensorCheck(r, "dout", a.dout).dtype(d.dtype).shape({t, h}).check();
  TensorCheck(r, "w_router", a.w_router).dtype(d.dtype).shape({router_experts(d), h}).check();
  TensorCheck(r, "b2", a.b2)
      .dtype(d.dtype)
      .shape({{d.experts, "E"}, h})
      .required_iff(d.has_b2, "the plan has has_b2 = 0")
      .check();
  TensorCheck(r, "dw_router", a.dw_router)
      .dtype(d.weight_grad_dtype)
      .shape({router_experts(d), h})
      .used_if(a.compute_weight_grad)
      .check();
  require_finite("beta_dw_router", a.beta_dw_router);
  check_loss_tensors(r, LossSide::backward, a.dload_balance_loss, a.dz_loss, d.dtype, d.load_balance_coeff,
                     d.z_loss_coeff);
}

CallChecks forward_values(const moekit_plan&, const moekit_moe_fwd_args_t& a) {
  CallChecks c;
  add_finite(c.inputs, "x", a.x);
  add_finite(c.inputs, "w_router", a.w_router);
  add_finite(c.inputs, "router_bias", a.router_bias);
  add_expert_weight_values(c.inputs, a.w1, a.b1, a.w2, a.b2);
  add_gradient(c, "out", a.out, true, a.beta_out);
  add_finite(c.outputs, "scores", a.scores);
  add_loss_values(c, LossSide::forward, a.load_balance_loss, a.z_loss);
  return c;
}

CallChecks backward_values(const moekit_plan&, const moekit_moe_bwd_args_t& a) {
  CallChecks c;
  add_finite(c.inputs, "x", a.x);
  add_finite(c.inputs, "dout", a.dout);
  add_finite(c.inputs, "w_router", a.w_router);
  add_expert_weight_values(c.inputs, a.w1, moekit_tensor_t{}, a.w2, a.b2);
  add_expert_gradient_values(c, gradients_of(a));
  add_gradient(c, "dw_router", a.dw_router, a.compute_weight_grad != 0, a.beta_dw_router);
  add_loss_values(c, LossSide::backward, a.dload_balance_loss, a.dz_loss);
  return c;
}

}  // namespace
}  // namespace capi
}  // namespace v0
}  // namespace moekit

using namespace moekit::capi;

extern "C" {

MOEKIT_API moekit_status_t moekit_moe_desc_init(moekit_moe_desc_t* desc) {
  return translate([&] {
    moekit_moe_desc_t& d = init_struct("desc", desc);
    d.activation = MOEKIT_ACT_SWIGLU;
    d.glu_layout = MOEKIT_GLU_CONCAT;
    d.glu_limit = 7.0;
    d.router = MOEKIT_ROUTER_SOFTMAX_TOPK;
    d.router_scale = 1.0;
    d.dtype = MOEKIT_DTYPE_BF16;
    d.weight_grad_dtype = MOEKIT_DTYPE_INVALID;
  });
}

MOEKIT_API moekit_status_t moekit_moe_plan_create(moekit_handle_t handle, const moekit_moe_desc_t* desc,
                                                  moekit_plan_t* plan) {
  return create_plan(handle, desc, plan, moekit::OpKind::moe_layer, &moekit_plan::moe, "moekit_moe_desc_init",
                     resolve_moe);
}

MOEKIT_API moekit_status_t moekit_moe_fwd_args_init(moekit_moe_fwd_args_t* args) {
  return translate([&] { init_struct("args", args); });
}

MOEKIT_API moekit_status_t moekit_moe_bwd_args_init(moekit_moe_bwd_args_t* args) {
  return translate([&] { init_backward_args(args); });
}

MOEKIT_API moekit_status_t moekit_moe_forward(moekit_plan_t plan, const moekit_moe_fwd_args_t* args, void* saved,
                                              size_t saved_bytes, void* workspace, size_t workspace_bytes,
                                              void* stream) {
  return run_layer_checked(plan, moekit::OpKind::moe_layer, args, "moekit_moe_fwd_args_init", SavedUse::forward, saved,
                           saved_bytes, workspace, workspace_bytes, stream, check_forward, forward_values,
                           [&](const moekit_plan& p, const moekit_moe_fwd_args_t& a, moekit::Workspace ws) {
                             backend_of(p).moe_forward(p, a, saved, ws, stream);
                           });
}

MOEKIT_API moekit_status_t moekit_moe_backward(moekit_plan_t plan, const moekit_moe_bwd_args_t* args, const void* saved,
                                               size_t saved_bytes, void* workspace, size_t workspace_bytes,
                                               void* stream) {
  return run_layer_checked(plan, moekit::OpKind::moe_layer, args, "moekit_moe_bwd_args_init", SavedUse::backward, saved,
                           saved_bytes, workspace, workspace_bytes, stream, check_backward, backward_values,
                           [&](const moekit_plan& p, const moekit_moe_bwd_args_t& a, moekit::Workspace ws) {
                             backend_of(p).moe_backward(p, a, saved, ws, stream);
                           });
}

}  // extern "C"
