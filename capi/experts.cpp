// The experts alone on pre-grouped rows (expert parallelism): descriptor, argument checks, forward and backward.
#include "capi/call.h"
#include "capi/desc.h"
#include "capi/expert_weights.h"
#include "capi/plan_create.h"

namespace moekit {
inline namespace v0 {
namespace capi {
namespace {

// P: the grouped rows of this call, read from x.
Extent grouped_rows(const moekit_moe_desc_t& d, const moekit_tensor_t& x) {
  return Extent{leading_extent("x", x, "P", d.max_tokens, "max_tokens"), "P"};
}

void check_offsets(const TensorRules& r, const moekit_moe_desc_t& d, const moekit_tensor_t& offsets) {
  TensorCheck(r, "offsets", offsets).dtype(MOEKIT_DTYPE_INT32).shape({{d.experts + 1, "E+1"}}).check();
}

void check_forward(const moekit_plan& plan, const moekit_experts_fwd_args_t& a) {
  const moekit_moe_desc_t& d = plan.moe;
  const TensorRules r = tensor_rules(plan);
  const Extent p = grouped_rows(d, a.x), h{d.hidden, "H"};
  TensorCheck(r, "x", a.x).dtype(d.dtype).shape({p, h}).check();
  check_offsets(r, d, a.offsets);
  check_expert_weights(r, d, a.w1, &a.b1, a.w2, &a.b2);
  TensorCheck(r, "y", a.y).dtype(d.dtype).shape({p, h}).check();
}

void check_backward(const moekit_plan& plan, const moekit_experts_bwd_args_t& a) {
  const moekit_moe_desc_t& d = plan.moe;
  const TensorRules r = tensor_rules(plan);
  const Extent p = grouped_rows(d, a.x);
  check_expert_backward(r, d, p, a.x, a.w1, a.w2, gradients_of(a));
  check_offsets(r, d, a.offsets);
  TensorCheck(r, "dy", a.dy).dtype(d.dtype).shape({p, {d.hidden, "H"}}).check();
}

CallChecks forward_values(const moekit_plan&, const moekit_experts_fwd_args_t& a) {
  CallChecks c;
  const RowBound valid = last_entry(a.offsets);
  add_offsets(c.inputs, "offsets", a.offsets, a.x.shape[0]);
  add_finite(c.inputs, "x", a.x, valid);
  add_expert_weight_values(c.inputs, a.w1, a.b1, a.w2, a.b2);
  add_finite(c.outputs, "y", a.y, valid);
  return c;
}

CallChecks backward_values(const moekit_plan&, const moekit_experts_bwd_args_t& a) {
  CallChecks c;
  const RowBound valid = last_entry(a.offsets);
  add_offsets(c.inputs, "offsets", a.offsets, a.x.shape[0]);
  add_finite(c.inputs, "x", a.x, valid);
  add_finite(c.inputs, "dy", a.dy, valid);
  add_expert_weight_values(c.inputs, a.w1, moekit_tensor_t{}, a.w2, moekit_tensor_t{});
  add_expert_gradient_values(c, gradients_of(a), valid);
  return c;
}

}  // namespace
}  // namespace capi
}  // namespace v0
}  // namespace moekit

using namespace moekit::capi;

extern "C" {

MOEKIT_API moekit_status_t moekit_experts_plan_create(moekit_handle_t handle, const moekit_moe_desc_t* desc,
                                                      moekit_plan_t* plan) {
  return create_plan(handle, desc, plan, moekit::OpKind::experts, &moekit_plan::moe, "moekit_moe_desc_init",
                     resolve_expert_fields);
}

MOEKIT_API moekit_status_t moekit_experts_fwd_args_init(moekit_experts_fwd_args_t* args) {
  return translate([&] { init_struct("args", args); });
}

MOEKIT_API moekit_status_t moekit_experts_bwd_args_init(moekit_experts_bwd_args_t* args) {
  return translate([&] { init_backward_args(args); });
}

MOEKIT_API moekit_status_t moekit_experts_forward(moekit_plan_t plan, const moekit_experts_fwd_args_t* args,
                                                  void* saved, size_t saved_bytes, void* workspace,
                                                  size_t workspace_bytes, void* stream) {
  return run_layer_checked(plan, moekit::OpKind::experts, args, "moekit_experts_fwd_args_init", SavedUse::forward,
                           saved, saved_bytes, workspace, workspace_bytes, stream, check_forward, forward_values,
                           [&](const moekit_plan& p, const moekit_experts_fwd_args_t& a, moekit::Workspace ws) {
                             backend_of(p).experts_forward(p, a, saved, ws, stream);
                           });
}

MOEKIT_API moekit_status_t moekit_experts_backward(moekit_plan_t plan, const moekit_experts_bwd_args_t* args,
                                                   const void* saved, size_t saved_bytes, void* workspace,
                                                   size_t workspace_bytes, void* stream) {
  return run_layer_checked(plan, moekit::OpKind::experts, args, "moekit_experts_bwd_args_init", SavedUse::backward,
                           saved, saved_bytes, workspace, workspace_bytes, stream, check_backward, backward_values,
                           [&](const moekit_plan& p, const moekit_experts_bwd_args_t& a, moekit::Workspace ws) {
                             backend_of(p).experts_backward(p, a, saved, ws, stream);
                           });
}

}  // extern "C"
