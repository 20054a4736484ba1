// The router operation (docs/math.md section 1): descriptor, argument checks, forward and backward.
#include "capi/aux_losses.h"
#include "capi/call.h"
#include "capi/desc.h"
#include "capi/plan_create.h"

namespace moekit {
inline namespace v0 {
namespace capi {
namespace {

void resolve_router(const moekit_handle& handle, moekit_router_desc_t& d) {
  require_positive("max_tokens", d.max_tokens);
  require_positive("experts", d.experts);
  require_top_k("top_k", d.top_k, d.experts);
  require_tensor_size("logits", {{"max_tokens", d.max_tokens}, {"experts", d.experts}});
  require_router_kind("kind", d.kind);
  require_flag("renormalize", d.renormalize);
  require_finite("scale", d.scale);
  require_float_dtype(handle, "dtype", d.dtype);
  require_aux_losses(d.kind, d.load_balance_coeff, d.z_loss_coeff);
}


void check_forward(const moekit_plan& plan, const moekit_router_fwd_args_t& a) {
  const moekit_router_desc_t& d = plan.router;
  const TensorRules r = tensor_rules(plan);
  const Extent t{leading_extent("logits", a.logits, "T", d.max_tokens, "max_tokens"), "T"};
  const Extent e{d.experts, "E"}, k{d.top_k, "K"};
  TensorCheck(r, "logits", a.logits).dtype(d.dtype).shape({t, e}).check();
  TensorCheck(r, "bias", a.bias)
      .dtype(MOEKIT_DTYPE_FP32)
      .shape({e})
      .optional_iff(d.kind == MOEKIT_ROUTER_SIGMOID, "only the SIGMOID router kind takes a selection bias")
      .check();
  TensorCheck(r, "scores", a.scores).score_dtype(d.dtype).shape({t, k}).check();
  TensorCheck(r, "indices", a.indices).index_dtype().shape({t, k}).check();
  TensorCheck(r, "counts", a.counts).dtype(MOEKIT_DTYPE_INT32).shape({e}).optional().check();
  check_loss_tensors(r, LossSide::forward, a.load_balance_loss, a.z_loss, d.dtype, d.load_balance_coeff,
                     d.z_loss_coeff);
}

void check_backward(const moekit_plan& plan, const moekit_router_bwd_args_t& a) {
  const moekit_router_desc_t& d = plan.router;
  const TensorRules r = tensor_rules(plan);
  const Extent t{leading_extent("logits", a.logits, "T", d.max_tokens, "max_tokens"), "T"};
  const Extent e{d.experts, "E"}, k{d.top_k, "K"};
  TensorCheck(r, "logits", a.logits).dtype(d.dtype).shape({t, e}).check();
  TensorCheck(r, "indices", a.indices).index_dtype().shape({t, k}).check();
  TensorCheck(r, "dscores", a.dscores).score_dtype(d.dtype).shape({t, k}).check();
  TensorCheck(r, "dlogits", a.dlogits).dtype_in({MOEKIT_DTYPE_FP32, d.dtype}).shape({t, e}).check();
  require_flag("accumulate", a.accumulate);
  check_loss_tensors(r, LossSide::backward, a.dload_balance_loss, a.dz_loss, d.dtype, d.load_balance_coeff,
                     d.z_loss_coeff);
}

CallChecks forward_values(const moekit_plan&, const moekit_router_fwd_args_t& a) {
  CallChecks c;
  add_finite_or_masked(c.inputs, "logits", a.logits);
  add_finite(c.inputs, "bias", a.bias);
  add_finite(c.outputs, "scores", a.scores);
  add_loss_values(c, LossSide::forward, a.load_balance_loss, a.z_loss);
  return c;
}

CallChecks backward_values(const moekit_plan& plan, const moekit_router_bwd_args_t& a) {
  CallChecks c;
  add_finite_or_masked(c.inputs, "logits", a.logits);
  add_index_range(c.inputs, "indices", a.indices, 0, plan.router.experts);
  add_finite(c.inputs, "dscores", a.dscores);
  if (a.accumulate) add_finite(c.inputs, "dlogits", a.dlogits);
  add_loss_values(c, LossSide::backward, a.dload_balance_loss, a.dz_loss);
  add_finite(c.outputs, "dlogits", a.dlogits);
  return c;
}

}  // namespace
}  // namespace capi
}  // namespace v0
}  // namespace moekit

using namespace moekit::capi;

extern "C" {

MOEKIT_API moekit_status_t moekit_router_desc_init(moekit_router_desc_t* desc) {
  return translate([&] {
    moekit_router_desc_t& d = init_struct("desc", desc);
    d.kind = MOEKIT_ROUTER_SOFTMAX_TOPK;
    d.scale = 1.0;
    d.dtype = MOEKIT_DTYPE_BF16;
  });
}

MOEKIT_API moekit_status_t moekit_router_plan_create(moekit_handle_t handle, const moekit_router_desc_t* desc,
                                                     moekit_plan_t* plan) {
  return create_plan(handle, desc, plan, moekit::OpKind::router, &moekit_plan::router, "moekit_router_desc_init",
                     resolve_router);
}

MOEKIT_API moekit_status_t moekit_router_fwd_args_init(moekit_router_fwd_args_t* args) {
  return translate([&] { init_struct("args", args); });
}

MOEKIT_API moekit_status_t moekit_router_bwd_args_init(moekit_router_bwd_args_t* args) {
  return translate([&] { init_struct("args", args); });
}

MOEKIT_API moekit_status_t moekit_router_forward(moekit_plan_t plan, const moekit_router_fwd_args_t* args,
                                                 void* workspace, size_t workspace_bytes, void* stream) {
  return run_checked(plan, moekit::OpKind::router, args, "moekit_router_fwd_args_init", workspace, workspace_bytes,
                     stream, check_forward, forward_values, [&](const moekit_plan& p, const moekit_router_fwd_args_t& a, moekit::Workspace ws) {
                       backend_of(p).router_forward(p, a, ws, stream);
                     });
}

MOEKIT_API moekit_status_t moekit_router_backward(moekit_plan_t plan, const moekit_router_bwd_args_t* args,
                                                  void* workspace, size_t workspace_bytes, void* stream) {
  return run_checked(plan, moekit::OpKind::router, args, "moekit_router_bwd_args_init", workspace, workspace_bytes,
                     stream, check_backward, backward_values,
                     [&](const moekit_plan& p, const moekit_router_bwd_args_t& a, moekit::Workspace ws) {
                       backend_of(p).router_backward(p, a, ws, stream);
                     });
}

}  // extern "C"
