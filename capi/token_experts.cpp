// The experts on token-major rows (expert parallelism): descriptor, argument checks, forward and backward.
#include <string>

#include "capi/call.h"
#include "capi/desc.h"
#include "capi/expert_weights.h"
#include "capi/plan_create.h"

namespace moekit {
inline namespace v0 {
namespace capi {
namespace {

void resolve_token_experts(const moekit_handle& handle, moekit_moe_desc_t& d) {
  resolve_expert_fields(handle, d);
  require_positive("top_k", d.top_k);
  require_int32_count("top_k", d.max_tokens * d.top_k, "max_tokens * top_k pairs");
  if (d.expert_begin != 0)
    throw_invalid("expert_begin: must be 0, got " + std::to_string(d.expert_begin) +
                  " (topk_idx holds local expert ids, 0 .. experts-1)");
}

// N: the tokens of this call, read from x.
Extent tokens(const moekit_moe_desc_t& d, const moekit_tensor_t& x) {
  return Extent{leading_extent("x", x, "N", d.max_tokens, "max_tokens"), "N"};
}

void check_routing(const TensorRules& r, const moekit_moe_desc_t& d, const Extent& n, const moekit_tensor_t& topk_idx,
                   const moekit_tensor_t& topk_weights) {
  const Extent k{d.top_k, "K"};
  TensorCheck(r, "topk_idx", topk_idx).index_dtype().shape({n, k}).check();
  TensorCheck(r, "topk_weights", topk_weights).score_dtype(d.dtype).shape({n, k}).check();
}

void check_forward(const moekit_plan& plan, const moekit_token_experts_fwd_args_t& a) {
  const moekit_moe_desc_t& d = plan.moe;
  const TensorRules r = tensor_rules(plan);
  const Extent n = tokens(d, a.x), h{d.hidden, "H"};
  TensorCheck(r, "x", a.x).dtype(d.dtype).shape({n, h}).check();
  check_routing(r, d, n, a.topk_idx, a.topk_weights);
  check_expert_weights(r, d, a.w1, &a.b1, a.w2, &a.b2);
  TensorCheck(r, "out", a.out).dtype(d.dtype).shape({n, h}).check();
  require_finite("beta_out", a.beta_out);
}

void check_backward(const moekit_plan& plan, const moekit_token_experts_bwd_args_t& a) {
  const moekit_moe_desc_t& d = plan.moe;
  const TensorRules r = tensor_rules(plan);
  const Extent n = tokens(d, a.x), h{d.hidden, "H"};
  check_expert_backward(r, d, n, a.x, a.w1, a.w2, gradients_of(a));
  check_routing(r, d, n, a.topk_idx, a.topk_weights);
  TensorCheck(r, "dout", a.dout).dtype(d.dtype).shape({n, h}).check();
  TensorCheck(r, "b2", a.b2)
      .dtype(d.dtype)
      .shape({{d.experts, "E"}, h})
      .required_iff(d.has_b2, "the plan has has_b2 = 0")
      .check();
  TensorCheck(r, "dtopk_weights", a.dtopk_weights)
      .score_dtype(d.dtype)
      .shape({n, {d.top_k, "K"}})
      .optional()
      .used_if(a.compute_input_grad)
      .check();
}

// NOTE: topk_weights is not checked: the weight of a dropped pair is never read, and a bad weight of a valid pair
// shows in out.
CallChecks forward_values(const moekit_plan& plan, const moekit_token_experts_fwd_args_t& a) {
  CallChecks c;
  add_finite(c.inputs, "x", a.x);
  add_index_range(c.inputs, "topk_idx", a.topk_idx, -1, plan.moe.experts);
  add_expert_weight_values(c.inputs, a.w1, a.b1, a.w2, a.b2);
  add_gradient(c, "out", a.out, true, a.beta_out);
  return c;
}

CallChecks backward_values(const moekit_plan& plan, const moekit_token_experts_bwd_args_t& a) {
  CallChecks c;
  add_finite(c.inputs, "x", a.x);
  add_index_range(c.inputs, "topk_idx", a.topk_idx, -1, plan.moe.experts);
  add_expert_weight_values(c.inputs, a.w1, moekit_tensor_t{}, a.w2, a.b2);
  add_finite(c.inputs, "dout", a.dout);
  add_expert_gradient_values(c, gradients_of(a));
  add_gradient(c, "dtopk_weights", a.dtopk_weights, a.compute_input_grad != 0 && is_present(a.dtopk_weights), 0);
  return c;
}

}  // namespace
}  // namespace capi
}  // namespace v0
}  // namespace moekit

using namespace moekit::capi;

extern "C" {

MOEKIT_API moekit_status_t moekit_token_experts_plan_create(moekit_handle_t handle, const moekit_moe_desc_t* desc,
                                                            moekit_plan_t* plan) {
  return create_plan(handle, desc, plan, moekit::OpKind::token_experts, &moekit_plan::moe, "moekit_moe_desc_init",
                     resolve_token_experts);
}

MOEKIT_API moekit_status_t moekit_token_experts_fwd_args_init(moekit_token_experts_fwd_args_t* args) {
  return translate([&] { init_struct("args", args); });
}

MOEKIT_API moekit_status_t moekit_token_experts_bwd_args_init(moekit_token_experts_bwd_args_t* args) {
  return translate([&] { init_backward_args(args); });
}

MOEKIT_API moekit_status_t moekit_token_experts_forward(moekit_plan_t plan,
                                                        const moekit_token_experts_fwd_args_t* args, void* saved,
                                                        size_t saved_bytes, void* workspace, size_t workspace_bytes,
                                                        void* stream) {
  return run_layer_checked(plan, moekit::OpKind::token_experts, args, "moekit_token_experts_fwd_args_init",
                           SavedUse::forward, saved, saved_bytes, workspace, workspace_bytes, stream, check_forward, forward_values,
                           [&](const moekit_plan& p, const moekit_token_experts_fwd_args_t& a, moekit::Workspace ws) {
                             backend_of(p).token_experts_forward(p, a, saved, ws, stream);
                           });
}

MOEKIT_API moekit_status_t moekit_token_experts_backward(moekit_plan_t plan,
                                                         const moekit_token_experts_bwd_args_t* args,
                                                         const void* saved, size_t saved_bytes, void* workspace,
                                                         size_t workspace_bytes, void* stream) {
  return run_layer_checked(plan, moekit::OpKind::token_experts, args, "moekit_token_experts_bwd_args_init",
                           SavedUse::backward, saved, saved_bytes, workspace, workspace_bytes, stream, check_backward, backward_values,
                           [&](const moekit_plan& p, const moekit_token_experts_bwd_args_t& a, moekit::Workspace ws) {
                             backend_of(p).token_experts_backward(p, a, saved, ws, stream);
                           });
}

}  // extern "C"
