// Token combine and its transpose, the broadcast backward (docs/math.md section 6): descriptor, argument checks, runs.
#include "capi/call.h"
#include "capi/desc.h"
#include "capi/plan_create.h"

namespace moekit {
inline namespace v0 {
namespace capi {
namespace {

void resolve_combine(const moekit_handle& handle, moekit_combine_desc_t& d) {
  d.max_pairs = resolve_max_pairs(d.max_tokens, d.top_k, d.max_pairs);
  require_positive("hidden", d.hidden);
  require_tensor_size("grouped", {{"max_pairs", d.max_pairs}, {"hidden", d.hidden}});
  require_tensor_size("out", {{"max_tokens", d.max_tokens}, {"hidden", d.hidden}});
  require_float_dtype(handle, "dtype", d.dtype);
}

// weighted: combine (scores required); otherwise the broadcast backward (scores absent: weights of 1).
void check_combine(const moekit_plan& plan, const moekit_combine_args_t& a, bool weighted) {
  const moekit_combine_desc_t& d = plan.combine;
  const TensorRules r = tensor_rules(plan);
  const char* why_no_scores = "moekit_broadcast_backward sums with weights of 1 and takes no scores";
  Extent t{0, "T"}, p{0, "P"};
  if (d.top_k == 0) {
    t.value = leading_extent("tok_offsets", a.tok_offsets, "T", d.max_tokens, "max_tokens", 1);
    TensorCheck(r, "tok_offsets", a.tok_offsets).dtype(MOEKIT_DTYPE_INT32).shape({{t.value + 1, "T+1"}}).check();
    p.value = leading_extent("grouped_pos", a.grouped_pos, "P", d.max_pairs, "max_pairs");
    TensorCheck(r, "scores", a.scores).score_dtype(d.dtype).shape({p}).required_iff(weighted, why_no_scores).check();
  } else {
    t.value = leading_extent("out", a.out, "T", d.max_tokens, "max_tokens");
    TensorCheck(r, "tok_offsets", a.tok_offsets)
        .required_iff(false, "fixed top-k (top_k >= 1) takes no tok_offsets")
        .check();
    p = Extent{t.value * d.top_k, "P = T*K"};
    TensorCheck(r, "scores", a.scores)
        .score_dtype(d.dtype)
        .shape({t, {d.top_k, "K"}})
        .required_iff(weighted, why_no_scores)
        .check();
  }
  const Extent h{d.hidden, "H"};
  TensorCheck(r, "grouped", a.grouped).dtype(d.dtype).shape({p, h}).check();
  TensorCheck(r, "grouped_pos", a.grouped_pos).dtype(MOEKIT_DTYPE_INT32).shape({p}).check();
  TensorCheck(r, "out", a.out).dtype(d.dtype).shape({t, h}).check();
  require_finite("beta", a.beta);
}

void check_weighted(const moekit_plan& plan, const moekit_combine_args_t& a) { check_combine(plan, a, true); }
void check_unweighted(const moekit_plan& plan, const moekit_combine_args_t& a) { check_combine(plan, a, false); }

CallChecks combine_values(const moekit_plan& plan, const moekit_combine_args_t& a) {
  CallChecks c;
  const bool variable = plan.combine.top_k == 0;
  const RowBound pairs = variable ? last_entry(a.tok_offsets) : RowBound{};
  if (variable) add_offsets(c.inputs, "tok_offsets", a.tok_offsets, a.grouped_pos.shape[0]);
  add_index_range(c.inputs, "grouped_pos", a.grouped_pos, -1, a.grouped.shape[0], pairs);
  add_finite_via(c.inputs, "grouped", a.grouped, a.grouped_pos, pairs);
  add_finite(c.inputs, "scores", a.scores, pairs);
  add_gradient(c, "out", a.out, true, a.beta);
  return c;
}

}  // namespace
}  // namespace capi
}  // namespace v0
}  // namespace moekit

using namespace moekit::capi;

extern "C" {

MOEKIT_API moekit_status_t moekit_combine_desc_init(moekit_combine_desc_t* desc) {
  return translate([&] { init_struct("desc", desc).dtype = MOEKIT_DTYPE_BF16; });
}

MOEKIT_API moekit_status_t moekit_combine_plan_create(moekit_handle_t handle, const moekit_combine_desc_t* desc,
                                                      moekit_plan_t* plan) {
  return create_plan(handle, desc, plan, moekit::OpKind::combine, &moekit_plan::combine, "moekit_combine_desc_init",
                     resolve_combine);
}

MOEKIT_API moekit_status_t moekit_combine_args_init(moekit_combine_args_t* args) {
  return translate([&] { init_struct("args", args); });
}

MOEKIT_API moekit_status_t moekit_combine(moekit_plan_t plan, const moekit_combine_args_t* args, void* workspace,
                                          size_t workspace_bytes, void* stream) {
  return run_checked(plan, moekit::OpKind::combine, args, "moekit_combine_args_init", workspace, workspace_bytes, stream,
                     check_weighted, combine_values, [&](const moekit_plan& p, const moekit_combine_args_t& a, moekit::Workspace ws) {
                       backend_of(p).combine(p, a, ws, stream);
                     });
}

MOEKIT_API moekit_status_t moekit_broadcast_backward(moekit_plan_t plan, const moekit_combine_args_t* args,
                                                     void* workspace, size_t workspace_bytes, void* stream) {
  return run_checked(plan, moekit::OpKind::combine, args, "moekit_combine_args_init", workspace, workspace_bytes, stream,
                     check_unweighted, combine_values, [&](const moekit_plan& p, const moekit_combine_args_t& a, moekit::Workspace ws) {
                       backend_of(p).combine(p, a, ws, stream);
                     });
}

}  // extern "C"
