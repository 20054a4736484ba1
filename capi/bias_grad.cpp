// Bias gradients (docs/math.md sections 4 and 6): db1, and db2 with the dout . b2 part of the score gradient.
#include "capi/call.h"
#include "capi/desc.h"
#include "capi/plan_create.h"

namespace moekit {
inline namespace v0 {
namespace capi {
namespace {

void resolve_bias_grad(const moekit_handle& handle, moekit_bias_grad_desc_t& d) {
  require_positive("experts", d.experts);
  require_positive("max_rows", d.max_rows);
  require_int32_count("max_rows", d.max_rows, "max_rows");
  require_positive("width", d.width);
  require_non_negative("max_tokens", d.max_tokens);
  require_int32_count("max_tokens", d.max_tokens, "max_tokens");
  require_tensor_size("offsets", {{"experts", d.experts}});
  require_tensor_size("the grouped rows", {{"max_rows", d.max_rows}, {"width", d.width}});
  require_tensor_size("the bias gradient", {{"experts", d.experts}, {"width", d.width}});
  require_tensor_size("dout", {{"max_tokens", d.max_tokens}, {"width", d.width}});
  require_float_dtype(handle, "dtype", d.dtype);
  d.out_dtype = resolve_out_dtype("out_dtype", d.out_dtype, d.dtype);
}

Extent offsets_extent(const moekit_bias_grad_desc_t& d) { return Extent{d.experts + 1, "E+1"}; }

void check_db1(const moekit_plan& plan, const moekit_db1_args_t& a) {
  const moekit_bias_grad_desc_t& d = plan.bias_grad;
  const TensorRules r = tensor_rules(plan);
  const Extent p{leading_extent("dh", a.dh, "P", d.max_rows, "max_rows"), "P"};
  const Extent w{d.width, "width"};
  TensorCheck(r, "dh", a.dh).dtype(d.dtype).shape({p, w}).check();
  TensorCheck(r, "offsets", a.offsets).dtype(MOEKIT_DTYPE_INT32).shape({offsets_extent(d)}).check();
  TensorCheck(r, "db1", a.db1).dtype(d.out_dtype).shape({{d.experts, "E"}, w}).check();
  require_finite("beta", a.beta);
}

void check_db2_ds(const moekit_plan& plan, const moekit_db2_ds_args_t& a) {
  const moekit_bias_grad_desc_t& d = plan.bias_grad;
  const TensorRules r = tensor_rules(plan);
  const Extent t{leading_extent("dout", a.dout, "T", d.max_tokens, "max_tokens"), "T"};
  const Extent p{leading_extent("gather_idx", a.gather_idx, "P", d.max_rows, "max_rows"), "P"};
  const Extent e{d.experts, "E"}, h{d.width, "H"};
  TensorCheck(r, "dout", a.dout).dtype(d.dtype).shape({t, h}).check();
  TensorCheck(r, "scores", a.scores).score_dtype(d.dtype).flat(p).check();
  const bool has_b2 = TensorCheck(r, "b2", a.b2).dtype(d.dtype).shape({e, h}).optional().check();
  TensorCheck(r, "offsets", a.offsets).dtype(MOEKIT_DTYPE_INT32).shape({offsets_extent(d)}).check();
  TensorCheck(r, "gather_idx", a.gather_idx).dtype(MOEKIT_DTYPE_INT32).shape({p}).check();
  TensorCheck(r, "pair_idx", a.pair_idx).dtype(MOEKIT_DTYPE_INT32).shape({p}).check();
  TensorCheck(r, "db2", a.db2).dtype(d.out_dtype).shape({e, h}).optional().check();
  TensorCheck(r, "dscores", a.dscores).score_dtype(d.dtype).flat(p).optional().required_if(has_b2).check();
  require_finite("beta", a.beta);
}

CallChecks db1_values(const moekit_plan&, const moekit_db1_args_t& a) {
  CallChecks c;
  add_offsets(c.inputs, "offsets", a.offsets, a.dh.shape[0]);
  add_finite(c.inputs, "dh", a.dh, last_entry(a.offsets));
  add_gradient(c, "db1", a.db1, true, a.beta);
  return c;
}

CallChecks db2_ds_values(const moekit_plan&, const moekit_db2_ds_args_t& a) {
  CallChecks c;
  const RowBound valid = last_entry(a.offsets);
  const moekit_tensor_t scores = flat_tensor(a.scores);
  add_offsets(c.inputs, "offsets", a.offsets, a.gather_idx.shape[0]);
  add_index_range(c.inputs, "gather_idx", a.gather_idx, 0, a.dout.shape[0], valid);
  add_index_range(c.inputs, "pair_idx", a.pair_idx, 0, scores.shape[0], valid);
  add_finite(c.inputs, "dout", a.dout);
  add_finite(c.inputs, "scores", scores);
  add_finite(c.inputs, "b2", a.b2);
  if (is_present(a.dscores)) {
    const moekit_tensor_t dscores = flat_tensor(a.dscores);
    if (is_present(a.b2)) add_finite_via(c.inputs, "dscores", dscores, a.pair_idx, valid);
    add_finite_via(c.outputs, "dscores", dscores, a.pair_idx, valid);
  }
  add_gradient(c, "db2", a.db2, is_present(a.db2), a.beta);
  return c;
}

}  // namespace
}  // namespace capi
}  // namespace v0
}  // namespace moekit

using namespace moekit::capi;

extern "C" {

MOEKIT_API moekit_status_t moekit_bias_grad_desc_init(moekit_bias_grad_desc_t* desc) {
  return translate([&] {
    moekit_bias_grad_desc_t& d = init_struct("desc", desc);
    d.dtype = MOEKIT_DTYPE_BF16;
    d.out_dtype = MOEKIT_DTYPE_INVALID;
  });
}

MOEKIT_API moekit_status_t moekit_bias_grad_plan_create(moekit_handle_t handle, const moekit_bias_grad_desc_t* desc,
                                                        moekit_plan_t* plan) {
  return create_plan(handle, desc, plan, moekit::OpKind::bias_grad, &moekit_plan::bias_grad,
                     "moekit_bias_grad_desc_init", resolve_bias_grad);
}

MOEKIT_API moekit_status_t moekit_db1_args_init(moekit_db1_args_t* args) {
  return translate([&] { init_struct("args", args); });
}

MOEKIT_API moekit_status_t moekit_db2_ds_args_init(moekit_db2_ds_args_t* args) {
  return translate([&] { init_struct("args", args); });
}

MOEKIT_API moekit_status_t moekit_db1(moekit_plan_t plan, const moekit_db1_args_t* args, void* workspace,
                                      size_t workspace_bytes, void* stream) {
  return run_checked(plan, moekit::OpKind::bias_grad, args, "moekit_db1_args_init", workspace, workspace_bytes, stream,
                     check_db1, db1_values, [&](const moekit_plan& p, const moekit_db1_args_t& a, moekit::Workspace ws) {
                       backend_of(p).db1(p, a, ws, stream);
                     });
}

MOEKIT_API moekit_status_t moekit_db2_ds(moekit_plan_t plan, const moekit_db2_ds_args_t* args, void* workspace,
                                         size_t workspace_bytes, void* stream) {
  return run_checked(plan, moekit::OpKind::bias_grad, args, "moekit_db2_ds_args_init", workspace, workspace_bytes, stream,
                     check_db2_ds, db2_ds_values, [&](const moekit_plan& p, const moekit_db2_ds_args_t& a, moekit::Workspace ws) {
                       backend_of(p).db2_ds(p, a, ws, stream);
                     });
}

}  // extern "C"
