// The sparse SwiGLU FFN (docs/math.md section 7): group selection, the load-balance update, subsample rows, the layer.
#include <limits>

#include "capi/call.h"
#include "capi/desc.h"
#include "capi/plan_create.h"
#include "src/subsample_rows.h"

namespace moekit {
inline namespace v0 {
namespace capi {
namespace {

void resolve_sparse_ffn(const moekit_handle& handle, moekit_sparse_ffn_desc_t& d) {
  require_positive("max_tokens", d.max_tokens);
  require_int32_count("max_tokens", d.max_tokens, "max_tokens");
  require_positive("d_model", d.d_model);
  const int64_t g = d.group_size;
  if (g != 16 && g != 32 && g != 64 && g != 128)
    throw_invalid("group_size: must be 16, 32, 64 or 128, got " + std::to_string(g));
  require_positive("d_ff", d.d_ff);
  require_int32_count("d_ff", d.d_ff, "d_ff neurons");
  if (d.d_ff % d.group_size != 0)
    throw_invalid("d_ff: " + std::to_string(d.d_ff) +
                  " is not a multiple of group_size = " + std::to_string(d.group_size));
  require_in_range("top_groups", d.top_groups, 1, d.d_ff / d.group_size, "1 <= top_groups <= d_ff / group_size");
  require_tensor_size("x", {{"max_tokens", d.max_tokens}, {"d_model", d.d_model}});
  require_tensor_size("w_gate", {{"d_ff", d.d_ff}, {"d_model", d.d_model}});
  require_in_range("subsample", d.subsample, 0, d.group_size, "0 <= subsample <= group_size; 0 = all rows");
  require_float_dtype(handle, "dtype", d.dtype);
  require_flag("inference", d.inference);
  d.weight_grad_dtype = resolve_out_dtype("weight_grad_dtype", d.weight_grad_dtype, d.dtype);
}

struct FfnExtents {
  Extent t, d, f, ng;
};

FfnExtents ffn_extents(const moekit_sparse_ffn_desc_t& d, int64_t tokens) {
  return FfnExtents{{tokens, "T"}, {d.d_model, "D"}, {d.d_ff, "F"}, {d.d_ff / d.group_size, "F/G"}};
}

// x, w_gate, subsample_rows and lb_bias: what group selection reads, in the selection and the layer alike.
FfnExtents check_selection_inputs(const moekit_plan& plan, const moekit_tensor_t& x, const moekit_tensor_t& w_gate,
                                  const moekit_tensor_t& subsample_rows, const moekit_tensor_t& lb_bias) {
  const moekit_sparse_ffn_desc_t& d = plan.sparse_ffn;
  const TensorRules r = tensor_rules(plan);
  const FfnExtents ext = ffn_extents(d, leading_extent("x", x, "T", d.max_tokens, "max_tokens"));
  TensorCheck(r, "x", x).dtype(d.dtype).shape({ext.t, ext.d}).check();
  TensorCheck(r, "w_gate", w_gate).dtype(d.dtype).shape({ext.f, ext.d}).check();
  TensorCheck(r, "subsample_rows", subsample_rows)
      .dtype(MOEKIT_DTYPE_INT32)
      .shape({ext.ng, {d.subsample, "spg"}})
      .required_iff(d.subsample > 0, "the plan has subsample = 0 (energies from all rows)")
      .check();
  TensorCheck(r, "lb_bias", lb_bias).dtype(MOEKIT_DTYPE_FP32).shape({ext.ng}).optional().check();
  return ext;
}

void check_group_select(const moekit_plan& plan, const moekit_group_select_args_t& a) {
  const moekit_sparse_ffn_desc_t& d = plan.sparse_ffn;
  const TensorRules r = tensor_rules(plan);
  const FfnExtents ext = check_selection_inputs(plan, a.x, a.w_gate, a.subsample_rows, a.lb_bias);
  TensorCheck(r, "groups", a.groups).dtype(MOEKIT_DTYPE_INT32).shape({ext.t, {d.top_groups, "kg"}}).check();
  TensorCheck(r, "counts", a.counts).dtype(MOEKIT_DTYPE_INT32).shape({ext.ng}).optional().check();
}

void check_layer_forward(const moekit_plan& plan, const moekit_sparse_ffn_fwd_args_t& a) {
  const moekit_sparse_ffn_desc_t& d = plan.sparse_ffn;
  const TensorRules r = tensor_rules(plan);
  const FfnExtents ext = check_selection_inputs(plan, a.x, a.w_gate, a.subsample_rows, a.lb_bias);
  TensorCheck(r, "w_up", a.w_up).dtype(d.dtype).shape({ext.f, ext.d}).check();
  TensorCheck(r, "w_down", a.w_down).dtype(d.dtype).shape({ext.d, ext.f}).check();
  TensorCheck(r, "out", a.out).dtype(d.dtype).shape({ext.t, ext.d}).check();
  TensorCheck(r, "groups", a.groups).dtype(MOEKIT_DTYPE_INT32).shape({ext.t, {d.top_groups, "kg"}}).optional().check();
  TensorCheck(r, "counts", a.counts).dtype(MOEKIT_DTYPE_INT32).shape({ext.ng}).optional().check();
  require_finite("beta_out", a.beta_out);
}

void check_layer_backward(const moekit_plan& plan, const moekit_sparse_ffn_bwd_args_t& a) {
  const moekit_sparse_ffn_desc_t& d = plan.sparse_ffn;
  const TensorRules r = tensor_rules(plan);
  const FfnExtents ext = ffn_extents(d, leading_extent("x", a.x, "T", d.max_tokens, "max_tokens"));
  require_flag("compute_input_grad", a.compute_input_grad);
  require_flag("compute_weight_grad", a.compute_weight_grad);
  TensorCheck(r, "x", a.x).dtype(d.dtype).shape({ext.t, ext.d}).check();
  TensorCheck(r, "w_gate", a.w_gate).dtype(d.dtype).shape({ext.f, ext.d}).check();
  TensorCheck(r, "w_up", a.w_up).dtype(d.dtype).shape({ext.f, ext.d}).check();
  TensorCheck(r, "w_down", a.w_down).dtype(d.dtype).shape({ext.d, ext.f}).check();
  TensorCheck(r, "dout", a.dout).dtype(d.dtype).shape({ext.t, ext.d}).check();
  TensorCheck(r, "dx", a.dx).dtype(d.dtype).shape({ext.t, ext.d}).used_if(a.compute_input_grad).check();
  const bool weights = a.compute_weight_grad != 0;
  const int32_t wg = d.weight_grad_dtype;
  TensorCheck(r, "dw_gate", a.dw_gate).dtype(wg).shape({ext.f, ext.d}).used_if(weights).check();
  TensorCheck(r, "dw_up", a.dw_up).dtype(wg).shape({ext.f, ext.d}).used_if(weights).check();
  TensorCheck(r, "dw_down", a.dw_down).dtype(wg).shape({ext.d, ext.f}).used_if(weights).check();
  require_finite("beta_dx", a.beta_dx);
  require_finite("beta_dw_gate", a.beta_dw_gate);
  require_finite("beta_dw_up", a.beta_dw_up);
  require_finite("beta_dw_down", a.beta_dw_down);
}

// subsample_rows of group g hold neuron ids of that group: [g*G, (g+1)*G).
void add_selection_values(std::vector<ValueCheck>& list, const moekit_sparse_ffn_desc_t& d, const moekit_tensor_t& x,
                          const moekit_tensor_t& w_gate, const moekit_tensor_t& subsample_rows,
                          const moekit_tensor_t& lb_bias) {
  add_finite(list, "x", x);
  add_finite(list, "w_gate", w_gate);
  add_index_range(list, "subsample_rows", subsample_rows, 0, d.group_size, {}, d.group_size);
  add_finite(list, "lb_bias", lb_bias);
}

CallChecks group_select_values(const moekit_plan& plan, const moekit_group_select_args_t& a) {
  CallChecks c;
  add_selection_values(c.inputs, plan.sparse_ffn, a.x, a.w_gate, a.subsample_rows, a.lb_bias);
  return c;
}

CallChecks layer_forward_values(const moekit_plan& plan, const moekit_sparse_ffn_fwd_args_t& a) {
  CallChecks c;
  add_selection_values(c.inputs, plan.sparse_ffn, a.x, a.w_gate, a.subsample_rows, a.lb_bias);
  add_finite(c.inputs, "w_up", a.w_up);
  add_finite(c.inputs, "w_down", a.w_down);
  add_gradient(c, "out", a.out, true, a.beta_out);
  return c;
}

CallChecks layer_backward_values(const moekit_plan&, const moekit_sparse_ffn_bwd_args_t& a) {
  CallChecks c;
  add_finite(c.inputs, "x", a.x);
  add_finite(c.inputs, "w_gate", a.w_gate);
  add_finite(c.inputs, "w_up", a.w_up);
  add_finite(c.inputs, "w_down", a.w_down);
  add_finite(c.inputs, "dout", a.dout);
  const bool weights = a.compute_weight_grad != 0;
  add_gradient(c, "dx", a.dx, a.compute_input_grad != 0, a.beta_dx);
  add_gradient(c, "dw_gate", a.dw_gate, weights, a.beta_dw_gate);
  add_gradient(c, "dw_up", a.dw_up, weights, a.beta_dw_up);
  add_gradient(c, "dw_down", a.dw_down, weights, a.beta_dw_down);
  return c;
}

CallChecks load_balance_values(const moekit_load_balance_args_t& a) {
  CallChecks c;
  if (a.counts.dtype == MOEKIT_DTYPE_FP32)
    add_finite(c.inputs, "counts", a.counts);
  else
    add_index_range(c.inputs, "counts", a.counts, 0, std::numeric_limits<int64_t>::max());
  add_finite(c.inputs, "ema", a.ema);
  add_finite(c.inputs, "bias", a.bias);
  add_finite(c.outputs, "ema", a.ema);
  add_finite(c.outputs, "bias", a.bias);
  return c;
}

void check_load_balance(const moekit_handle& handle, const moekit_load_balance_args_t& a) {
  const TensorRules r = tensor_rules(handle);
  const Extent ng{leading_extent("counts", a.counts, "NG", std::numeric_limits<int32_t>::max(), "int32 range"), "NG"};
  require_positive("counts", ng.value);
  TensorCheck(r, "counts", a.counts)
      .dtype_in({MOEKIT_DTYPE_INT32, MOEKIT_DTYPE_INT64, MOEKIT_DTYPE_FP32})
      .shape({ng})
      .check();
  TensorCheck(r, "ema", a.ema).dtype(MOEKIT_DTYPE_FP32).shape({ng}).check();
  TensorCheck(r, "bias", a.bias).dtype(MOEKIT_DTYPE_FP32).shape({ng}).check();
  require_finite("tokens", a.tokens);
  if (!(a.tokens > 0)) throw_invalid("tokens: must be > 0, got " + std::to_string(a.tokens));
  require_in_range("top_groups", a.top_groups, 1, ng.value, "1 <= top_groups <= NG");
  require_real_in("momentum", a.momentum, 0.0, 1.0, "0 <= momentum <= 1");
  require_real_in("gamma", a.gamma, 0.0, std::numeric_limits<double>::max(), "gamma >= 0");
  require_real_in("bias_max", a.bias_max, 0.0, std::numeric_limits<double>::max(), "bias_max >= 0");
}

}  // namespace
}  // namespace capi
}  // namespace v0
}  // namespace moekit

using namespace moekit::capi;

extern "C" {

MOEKIT_API moekit_status_t moekit_sparse_ffn_desc_init(moekit_sparse_ffn_desc_t* desc) {
  return translate([&] {
    moekit_sparse_ffn_desc_t& d = init_struct("desc", desc);
    d.dtype = MOEKIT_DTYPE_BF16;
    d.weight_grad_dtype = MOEKIT_DTYPE_INVALID;
  });
}

MOEKIT_API moekit_status_t moekit_group_select_plan_create(moekit_handle_t handle, const moekit_sparse_ffn_desc_t* desc,
                                                           moekit_plan_t* plan) {
  return create_plan(handle, desc, plan, moekit::OpKind::group_select, &moekit_plan::sparse_ffn,
                     "moekit_sparse_ffn_desc_init", resolve_sparse_ffn);
}

MOEKIT_API moekit_status_t moekit_group_select_args_init(moekit_group_select_args_t* args) {
  return translate([&] { init_struct("args", args); });
}

MOEKIT_API moekit_status_t moekit_group_select(moekit_plan_t plan, const moekit_group_select_args_t* args,
                                               void* workspace, size_t workspace_bytes, void* stream) {
  return run_checked(plan, moekit::OpKind::group_select, args, "moekit_group_select_args_init", workspace,
                     workspace_bytes, stream, check_group_select, group_select_values,
                     [&](const moekit_plan& p, const moekit_group_select_args_t& a, moekit::Workspace ws) {
                       backend_of(p).group_select(p, a, ws, stream);
                     });
}

MOEKIT_API moekit_status_t moekit_load_balance_args_init(moekit_load_balance_args_t* args) {
  return translate([&] {
    moekit_load_balance_args_t& a = init_struct("args", args);
    a.momentum = 0.99;
    a.gamma = 1e-3;
    a.bias_max = 0.5;
  });
}

MOEKIT_API moekit_status_t moekit_load_balance_update(moekit_handle_t handle, const moekit_load_balance_args_t* args,
                                                      void* stream) {
  return translate([&] {
    const moekit_handle& h = checked_handle(handle);
    const moekit_load_balance_args_t& a = checked_struct("args", args, "moekit_load_balance_args_init");
    check_load_balance(h, a);
    if (!validating(h)) {
      h.backend->load_balance_update(a, stream);
      return;
    }
    run_validated(*h.backend, load_balance_values(a), stream, [&] { h.backend->load_balance_update(a, stream); });
  });
}

MOEKIT_API moekit_status_t moekit_subsample_rows(uint64_t seed, int64_t num_groups, int64_t group_size,
                                                 int64_t rows_per_group, int32_t* out) {
  return translate([&] {
    require_non_negative("num_groups", num_groups);
    require_positive("group_size", group_size);
    require_int32_count("group_size", group_size, "group_size");
    // NOTE: divided rather than multiplied, so that a huge num_groups cannot wrap around the check.
    if (num_groups > std::numeric_limits<int32_t>::max() / group_size)
      moekit::throw_invalid("num_groups: " + std::to_string(num_groups) + " groups of " + std::to_string(group_size) +
                            " neuron ids exceed the int32 range of the ids");
    require_in_range("rows_per_group", rows_per_group, 1, group_size, "1 <= rows_per_group <= group_size");
    if (out == nullptr && num_groups > 0) moekit::throw_invalid("out: is NULL");
    moekit::subsample_rows(seed, num_groups, group_size, rows_per_group, out);
  });
}

MOEKIT_API moekit_status_t moekit_sparse_ffn_plan_create(moekit_handle_t handle, const moekit_sparse_ffn_desc_t* desc,
                                                         moekit_plan_t* plan) {
  return create_plan(handle, desc, plan, moekit::OpKind::sparse_ffn_layer, &moekit_plan::sparse_ffn,
                     "moekit_sparse_ffn_desc_init", resolve_sparse_ffn);
}

MOEKIT_API moekit_status_t moekit_sparse_ffn_fwd_args_init(moekit_sparse_ffn_fwd_args_t* args) {
  return translate([&] { init_struct("args", args); });
}

MOEKIT_API moekit_status_t moekit_sparse_ffn_bwd_args_init(moekit_sparse_ffn_bwd_args_t* args) {
  return translate([&] { init_backward_args(args); });
}

MOEKIT_API moekit_status_t moekit_sparse_ffn_forward(moekit_plan_t plan, const moekit_sparse_ffn_fwd_args_t* args,
                                                     void* saved, size_t saved_bytes, void* workspace,
                                                     size_t workspace_bytes, void* stream) {
  return run_layer_checked(plan, moekit::OpKind::sparse_ffn_layer, args, "moekit_sparse_ffn_fwd_args_init",
                           SavedUse::forward, saved, saved_bytes, workspace, workspace_bytes, stream, check_layer_forward, layer_forward_values,
                           [&](const moekit_plan& p, const moekit_sparse_ffn_fwd_args_t& a, moekit::Workspace ws) {
                             backend_of(p).sparse_ffn_forward(p, a, saved, ws, stream);
                           });
}

MOEKIT_API moekit_status_t moekit_sparse_ffn_backward(moekit_plan_t plan, const moekit_sparse_ffn_bwd_args_t* args,
                                                      const void* saved, size_t saved_bytes, void* workspace,
                                                      size_t workspace_bytes, void* stream) {
  return run_layer_checked(plan, moekit::OpKind::sparse_ffn_layer, args, "moekit_sparse_ffn_bwd_args_init",
                           SavedUse::backward, saved, saved_bytes, workspace, workspace_bytes, stream, check_layer_backward, layer_backward_values,
                           [&](const moekit_plan& p, const moekit_sparse_ffn_bwd_args_t& a, moekit::Workspace ws) {
                             backend_of(p).sparse_ffn_backward(p, a, saved, ws, stream);
                           });
}

}  // extern "C"
