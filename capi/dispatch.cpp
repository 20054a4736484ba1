// Dispatch metadata, the deterministic CSR (docs/math.md section 2): descriptor, argument checks, run.
#include <limits>

#include "capi/call.h"
#include "capi/desc.h"
#include "capi/plan_create.h"

namespace moekit {
inline namespace v0 {
namespace capi {
namespace {

void resolve_dispatch(const moekit_handle&, moekit_dispatch_desc_t& d) {
  d.max_pairs = resolve_max_pairs(d.max_tokens, d.top_k, d.max_pairs);
  require_positive("experts", d.experts);
  require_tensor_size("expert_offsets", {{"experts", d.experts}});
  require_non_negative("expert_begin", d.expert_begin);
}

void check_dispatch(const moekit_plan& plan, const moekit_dispatch_args_t& a) {
  const moekit_dispatch_desc_t& d = plan.dispatch;
  const TensorRules r = tensor_rules(plan);
  const bool general = d.top_k == 0;
  Extent p{0, "P"};
  if (general) {
    const Extent t{leading_extent("tok_offsets", a.tok_offsets, "T", d.max_tokens, "max_tokens", 1), "T"};
    TensorCheck(r, "tok_offsets", a.tok_offsets).dtype(MOEKIT_DTYPE_INT32).shape({{t.value + 1, "T+1"}}).check();
    p.value = leading_extent("indices", a.indices, "P", d.max_pairs, "max_pairs");
    TensorCheck(r, "indices", a.indices).index_dtype().shape({p}).check();
  } else {
    const Extent t{leading_extent("indices", a.indices, "T", d.max_tokens, "max_tokens"), "T"};
    TensorCheck(r, "indices", a.indices).index_dtype().shape({t, {d.top_k, "K"}}).check();
    TensorCheck(r, "tok_offsets", a.tok_offsets)
        .required_iff(false, "fixed routing (top_k >= 1) takes no tok_offsets")
        .check();
    p = Extent{t.value * d.top_k, "P = T*K"};
  }
  TensorCheck(r, "expert_offsets", a.expert_offsets).dtype(MOEKIT_DTYPE_INT32).shape({{d.experts + 1, "E+1"}}).check();
  TensorCheck(r, "gather_idx", a.gather_idx).dtype(MOEKIT_DTYPE_INT32).shape({p}).check();
  TensorCheck(r, "pair_idx", a.pair_idx).dtype(MOEKIT_DTYPE_INT32).shape({p}).check();
  TensorCheck(r, "grouped_pos", a.grouped_pos).dtype(MOEKIT_DTYPE_INT32).shape({p}).check();
}

CallChecks dispatch_values(const moekit_plan& plan, const moekit_dispatch_args_t& a) {
  CallChecks c;
  // NOTE: any id >= 0 may be another rank's expert, so only ids below -1 fail.
  const int64_t any_id = std::numeric_limits<int64_t>::max();
  if (plan.dispatch.top_k == 0) {
    add_offsets(c.inputs, "tok_offsets", a.tok_offsets, a.indices.shape[0]);
    add_index_range(c.inputs, "indices", a.indices, -1, any_id, last_entry(a.tok_offsets));
  } else {
    add_index_range(c.inputs, "indices", a.indices, -1, any_id);
  }
  return c;
}

}  // namespace
}  // namespace capi
}  // namespace v0
}  // namespace moekit

using namespace moekit::capi;

extern "C" {

MOEKIT_API moekit_status_t moekit_dispatch_desc_init(moekit_dispatch_desc_t* desc) {
  return translate([&] { init_struct("desc", desc); });
}

MOEKIT_API moekit_status_t moekit_dispatch_plan_create(moekit_handle_t handle, const moekit_dispatch_desc_t* desc,
                                                       moekit_plan_t* plan) {
  return create_plan(handle, desc, plan, moekit::OpKind::dispatch, &moekit_plan::dispatch, "moekit_dispatch_desc_init",
                     resolve_dispatch);
}

MOEKIT_API moekit_status_t moekit_dispatch_args_init(moekit_dispatch_args_t* args) {
  return translate([&] { init_struct("args", args); });
}

MOEKIT_API moekit_status_t moekit_dispatch(moekit_plan_t plan, const moekit_dispatch_args_t* args, void* workspace,
                                           size_t workspace_bytes, void* stream) {
  return run_checked(plan, moekit::OpKind::dispatch, args, "moekit_dispatch_args_init", workspace, workspace_bytes, stream,
                     check_dispatch, dispatch_values, [&](const moekit_plan& p, const moekit_dispatch_args_t& a, moekit::Workspace ws) {
                       backend_of(p).dispatch(p, a, ws, stream);
                     });
}

}  // extern "C"
