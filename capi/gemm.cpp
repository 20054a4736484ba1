// The grouped GEMM (docs/math.md section 5): descriptor, argument checks, run.
#include "capi/call.h"
#include "capi/desc.h"
#include "capi/plan_create.h"

namespace moekit {
inline namespace v0 {
namespace capi {
namespace {

bool has_gated_epilogue(const moekit_gemm_desc_t& d) {
  return d.epilogue == MOEKIT_EPILOGUE_GATED || d.epilogue == MOEKIT_EPILOGUE_DGATED;
}

void resolve_gemm(const moekit_handle& handle, moekit_gemm_desc_t& d) {
  require_one_of("mode", d.mode, {MOEKIT_GEMM_VARLEN_M, MOEKIT_GEMM_VARLEN_K}, "VARLEN_M (0), VARLEN_K (1)");
  require_one_of("b_layout", d.b_layout, {MOEKIT_GEMM_B_NK, MOEKIT_GEMM_B_KN}, "NK (0), KN (1)");
  require_one_of("gather", d.gather, {MOEKIT_GEMM_GATHER_NONE, MOEKIT_GEMM_GATHER_A, MOEKIT_GEMM_GATHER_B},
                 "NONE (0), A (1), B (2)");
  require_one_of("epilogue", d.epilogue,
                 {MOEKIT_EPILOGUE_STORE, MOEKIT_EPILOGUE_BIAS, MOEKIT_EPILOGUE_GATED, MOEKIT_EPILOGUE_DGATED},
                 "STORE (0), BIAS (1), GATED (2), DGATED (3)");
  if (d.mode == MOEKIT_GEMM_VARLEN_K && d.epilogue != MOEKIT_EPILOGUE_STORE)
    throw_invalid("epilogue: varlen K supports the STORE epilogue only");
  if (d.mode == MOEKIT_GEMM_VARLEN_M && d.gather == MOEKIT_GEMM_GATHER_B)
    throw_invalid("gather: GATHER_B is for varlen K only");
  require_positive("groups", d.groups);
  require_positive("max_rows", d.max_rows);
  require_int32_count("max_rows", d.max_rows, "max_rows");
  if (d.gather == MOEKIT_GEMM_GATHER_NONE) {
    d.gather_rows = d.max_rows;
  } else {
    require_positive("gather_rows", d.gather_rows);
    require_int32_count("gather_rows", d.gather_rows, "gather_rows");
  }
  require_positive("n", d.n);
  require_positive("k", d.k);
  require_tensor_size("offsets", {{"groups", d.groups}});
  const bool gather_a = d.gather == MOEKIT_GEMM_GATHER_A, gather_b = d.gather == MOEKIT_GEMM_GATHER_B;
  require_tensor_size("a", {gather_a ? TensorDim{"gather_rows", d.gather_rows} : TensorDim{"max_rows", d.max_rows},
                            {"k", d.k}});
  if (d.mode == MOEKIT_GEMM_VARLEN_K) {
    require_tensor_size("b", {gather_b ? TensorDim{"gather_rows", d.gather_rows} : TensorDim{"max_rows", d.max_rows},
                              {"n", d.n}});
    require_tensor_size("c", {{"groups", d.groups}, {"k", d.k}, {"n", d.n}});
  } else {
    require_tensor_size("b", {{"groups", d.groups}, {"n", d.n}, {"k", d.k}});
    require_tensor_size("c", {{"max_rows", d.max_rows}, {"n", d.n}});
  }
  require_float_dtype(handle, "dtype", d.dtype);
  d.out_dtype = resolve_out_dtype("out_dtype", d.out_dtype, d.dtype);
  if (has_gated_epilogue(d)) {
    require_activation_options(d.activation, d.glu_layout, d.glu_limit);
    if (is_gated_activation(d.activation) && d.n % 2 != 0)
      throw_invalid("n: a gated activation needs an even h width (gate and up halves), got " + std::to_string(d.n));
    if (d.out_dtype != d.dtype)
      throw_invalid("out_dtype: the GATED and DGATED epilogues store h / dh in the operand dtype");
  }
}

void check_gemm(const moekit_plan& plan, const moekit_gemm_args_t& a) {
  const moekit_gemm_desc_t& d = plan.gemm;
  const TensorRules r = tensor_rules(plan);
  const bool gathered = d.gather != MOEKIT_GEMM_GATHER_NONE;
  // M: rows of the grouped operand; S: rows of the gathered source (M without gather).
  const Extent m{gathered ? leading_extent("gather_idx", a.gather_idx, "M", d.max_rows, "max_rows")
                          : leading_extent("a", a.a, "M", d.max_rows, "max_rows"),
                 "M"};
  const moekit_tensor_t& source = d.gather == MOEKIT_GEMM_GATHER_B ? a.b : a.a;
  const char* source_name = d.gather == MOEKIT_GEMM_GATHER_B ? "b" : "a";
  const Extent s = gathered ? Extent{leading_extent(source_name, source, "S", d.gather_rows, "gather_rows"), "S"} : m;
  const Extent a_rows = d.gather == MOEKIT_GEMM_GATHER_A ? s : m;
  const Extent e{d.groups, "E"}, n{d.n, "n"}, k{d.k, "k"};
  const Extent act_width = is_gated_activation(d.activation) ? Extent{d.n / 2, "n/2"} : n;
  // NOTE: DGATED multiplies into dA, as wide as a (n/2 for a gated activation; e.g. W2 [E, H, I] with n = 2I).
  const Extent b_width = d.epilogue == MOEKIT_EPILOGUE_DGATED ? act_width : n;

  TensorCheck(r, "gather_idx", a.gather_idx)
      .index_dtype()
      .shape({m})
      .required_iff(gathered, "the plan has gather = NONE")
      .check();
  TensorCheck(r, "offsets", a.offsets).dtype(MOEKIT_DTYPE_INT32).shape({{d.groups + 1, "E+1"}}).check();
  TensorCheck(r, "a", a.a).dtype(d.dtype).shape({a_rows, k}).check();
  if (d.mode == MOEKIT_GEMM_VARLEN_K) {
    TensorCheck(r, "b", a.b).dtype(d.dtype).shape({d.gather == MOEKIT_GEMM_GATHER_B ? s : m, n}).check();
    TensorCheck(r, "c", a.c).dtype(d.out_dtype).shape({e, k, n}).check();
  } else if (d.b_layout == MOEKIT_GEMM_B_NK) {
    TensorCheck(r, "b", a.b).dtype(d.dtype).shape({e, b_width, k}).check();
  } else {
    TensorCheck(r, "b", a.b).dtype(d.dtype).shape({e, k, b_width}).check();
  }
  // The epilogue's tensors (varlen K has the STORE epilogue only, so they are all absent there).
  const bool varlen_m = d.mode == MOEKIT_GEMM_VARLEN_M;
  const bool bias = d.epilogue == MOEKIT_EPILOGUE_BIAS, gated = d.epilogue == MOEKIT_EPILOGUE_GATED;
  const bool dgated = d.epilogue == MOEKIT_EPILOGUE_DGATED;
  if (varlen_m) TensorCheck(r, "c", a.c).dtype(d.out_dtype).shape({m, n}).check();
  TensorCheck(r, "bias", a.bias)
      .dtype(d.dtype)
      .shape({e, n})
      .optional_iff(bias || gated, "only the BIAS and GATED epilogues add a bias")
      .required_if(bias)
      .check();
  TensorCheck(r, "h", a.h)
      .dtype(d.dtype)
      .shape({m, n})
      .required_iff(dgated, "only the DGATED epilogue reads h")
      .check();
  TensorCheck(r, "act", a.act)
      .dtype(d.dtype)
      .shape({m, act_width})
      .required_iff(gated || dgated, "only the GATED and DGATED epilogues write act")
      .check();
  const std::string dgated_only = "only the DGATED epilogue takes it";
  TensorCheck(r, "row_scale", a.row_scale).score_dtype(d.dtype).flat(m).required_iff(dgated, dgated_only).check();
  TensorCheck(r, "pair_idx", a.pair_idx).dtype(MOEKIT_DTYPE_INT32).shape({m}).required_iff(dgated, dgated_only).check();
  TensorCheck(r, "dscores", a.dscores).score_dtype(d.dtype).flat(m).required_iff(dgated, dgated_only).check();
  require_finite("alpha", a.alpha);
  require_finite("beta", a.beta);
  if ((gated || dgated) && a.beta != 0)
    throw_invalid("beta: the GATED and DGATED epilogues take no C input, so beta must be 0");
}

CallChecks gemm_values(const moekit_plan& plan, const moekit_gemm_args_t& a) {
  const moekit_gemm_desc_t& d = plan.gemm;
  CallChecks c;
  const bool gathered = d.gather != MOEKIT_GEMM_GATHER_NONE;
  const int64_t m = gathered ? a.gather_idx.shape[0] : a.a.shape[0];
  const RowBound valid = last_entry(a.offsets);
  add_offsets(c.inputs, "offsets", a.offsets, m);
  const moekit_tensor_t& source = d.gather == MOEKIT_GEMM_GATHER_B ? a.b : a.a;
  if (gathered) add_index_range(c.inputs, "gather_idx", a.gather_idx, 0, source.shape[0], valid);
  const bool dgated = d.epilogue == MOEKIT_EPILOGUE_DGATED;
  const moekit_tensor_t row_scale = dgated ? flat_tensor(a.row_scale) : moekit_tensor_t{};
  const moekit_tensor_t dscores = dgated ? flat_tensor(a.dscores) : moekit_tensor_t{};
  if (dgated) add_index_range(c.inputs, "pair_idx", a.pair_idx, 0, row_scale.shape[0], valid);
  if (d.gather == MOEKIT_GEMM_GATHER_A)
    add_finite_via(c.inputs, "a", a.a, a.gather_idx, valid);
  else
    add_finite(c.inputs, "a", a.a, valid);
  if (d.mode == MOEKIT_GEMM_VARLEN_M)
    add_finite(c.inputs, "b", a.b);
  else if (d.gather == MOEKIT_GEMM_GATHER_B)
    add_finite_via(c.inputs, "b", a.b, a.gather_idx, valid);
  else
    add_finite(c.inputs, "b", a.b, valid);
  add_finite(c.inputs, "bias", a.bias);
  add_finite(c.inputs, "h", a.h, valid);
  add_finite_via(c.inputs, "row_scale", row_scale, a.pair_idx, valid);
  add_gradient(c, "c", a.c, true, a.beta, d.mode == MOEKIT_GEMM_VARLEN_M ? valid : RowBound{});
  add_finite(c.outputs, "act", a.act, valid);
  add_finite_via(c.outputs, "dscores", dscores, a.pair_idx, valid);
  return c;
}

}  // namespace
}  // namespace capi
}  // namespace v0
}  // namespace moekit

using namespace moekit::capi;

extern "C" {

MOEKIT_API moekit_status_t moekit_gemm_desc_init(moekit_gemm_desc_t* desc) {
  return translate([&] {
    moekit_gemm_desc_t& d = init_struct("desc", desc);
    d.glu_limit = 7.0;
    d.dtype = MOEKIT_DTYPE_BF16;
    d.out_dtype = MOEKIT_DTYPE_INVALID;
  });
}

MOEKIT_API moekit_status_t moekit_gemm_plan_create(moekit_handle_t handle, const moekit_gemm_desc_t* desc,
                                                   moekit_plan_t* plan) {
  return create_plan(handle, desc, plan, moekit::OpKind::gemm, &moekit_plan::gemm, "moekit_gemm_desc_init",
                     resolve_gemm);
}

MOEKIT_API moekit_status_t moekit_gemm_args_init(moekit_gemm_args_t* args) {
  return translate([&] { init_struct("args", args).alpha = 1.0; });
}

MOEKIT_API moekit_status_t moekit_gemm(moekit_plan_t plan, const moekit_gemm_args_t* args, void* workspace,
                                       size_t workspace_bytes, void* stream) {
  return run_checked(plan, moekit::OpKind::gemm, args, "moekit_gemm_args_init", workspace, workspace_bytes, stream, check_gemm, gemm_values,
                     [&](const moekit_plan& p, const moekit_gemm_args_t& a, moekit::Workspace ws) {
                       backend_of(p).gemm(p, a, ws, stream);
                     });
}

}  // extern "C"
