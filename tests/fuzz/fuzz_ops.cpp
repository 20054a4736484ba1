#include "fuzz_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_check.h"

namespace moekit_fuzz {

namespace {

constexpr int32_t kBf16 = MOEKIT_DTYPE_BF16, kFp32 = MOEKIT_DTYPE_FP32, kFp64 = MOEKIT_DTYPE_FP64,
                  kI32 = MOEKIT_DTYPE_INT32, kI64 = MOEKIT_DTYPE_INT64;

const int32_t kActivations[] = {MOEKIT_ACT_SWIGLU, MOEKIT_ACT_GEGLU, MOEKIT_ACT_REGLU, MOEKIT_ACT_SWIGLU_OAI,
                                MOEKIT_ACT_GELU,   MOEKIT_ACT_RELU,  MOEKIT_ACT_SILU,  MOEKIT_ACT_RELU2};

bool gated(int32_t activation) { return activation < MOEKIT_ACT_GELU; }

bool finite(double v) { return std::isfinite(v); }
bool flag(double v) { return v == 0 || v == 1; }

struct Dims {
  int32_t dtype, index_dtype, score_dtype;
  int64_t t, e, k, h, i, extra;
  Config cfg;
};

Dims dims_of(const Config& c) {
  Dims d;
  d.cfg = c;
  d.dtype = kBf16 + static_cast<int32_t>(c.bytes[0] & 3);
  d.index_dtype = c.bit(0, 2) ? kI64 : kI32;
  d.score_dtype = d.dtype == kFp64 && c.bit(0, 3) ? kFp64 : kFp32;
  d.extra = (c.bytes[0] >> 4) & 3;
  d.t = c.dim(1, 5, 0, 8);
  d.e = c.dim(2, 4, 1, 6);
  d.k = std::min(c.dim(3, 2, 1, 4), d.e);
  d.h = c.dim(4, 16, 1, 24);
  d.i = c.dim(5, 8, 1, 12);
  return d;
}

// Builds a Call: the plan, the argument struct, its slots and scalars.
class Builder {
 public:
  explicit Builder(Call& call) : c(call) {}

  template <class Args, class Init>
  Args& args(Init init) {
    auto a = std::make_shared<Args>();
    init(a.get());
    c.args = a;
    c.struct_size = &a->struct_size;
    c.struct_bytes = sizeof(Args);
    return *a;
  }

  template <class Desc>
  void plan(moekit_status_t (*create)(moekit_handle_t, const Desc*, moekit_plan_t*), const Desc& desc) {
    c.handle = fuzz_handle(c.validating);
    c.plan = made(create, desc);
    c.other_plan = made(create, desc);
  }

  Slot& tensor(const char* name, moekit_tensor_t& field, int32_t dtype, std::vector<int64_t> shape,
               Role role = Role::input, Content content = {}) {
    c.slots.push_back(Slot{name, &field, dtype, std::move(shape), role, content});
    return c.slots.back();
  }
  Slot& out(const char* name, moekit_tensor_t& field, int32_t dtype, std::vector<int64_t> shape) {
    return tensor(name, field, dtype, std::move(shape), Role::output);
  }
  Slot& ids(const char* name, moekit_tensor_t& field, int32_t dtype, std::vector<int64_t> shape, int64_t lo,
            int64_t hi) {
    Content content{Content::indices, lo, hi};
    return tensor(name, field, dtype, std::move(shape), Role::input, content);
  }
  Slot& offsets(const char* name, moekit_tensor_t& field, int64_t count, int64_t last) {
    Content content{Content::offsets, 0, last};
    return tensor(name, field, kI32, {count}, Role::input, content);
  }

  void scalar(const char* name, double& v, bool (*valid)(double) = finite) {
    c.scalars.push_back({name, &v, nullptr, nullptr, valid});
  }
  void scalar(const char* name, int32_t& v, bool (*valid)(double) = flag) {
    c.scalars.push_back({name, nullptr, &v, nullptr, valid});
  }
  void scalar(const char* name, int64_t& v, std::function<bool(double)> valid) {
    c.scalars.push_back({name, nullptr, nullptr, &v, std::move(valid)});
  }

  Call& c;

 private:
  template <class Desc>
  PlanRef made(moekit_status_t (*create)(moekit_handle_t, const Desc*, moekit_plan_t*), const Desc& desc) {
    moekit_plan_t p = nullptr;
    if (create(c.handle, &desc, &p) != MOEKIT_SUCCESS)
      violation(c.op, "the harness's plan was rejected: " + last_error(c.op));
    return own_plan(p);
  }
};

// Presence of an optional tensor: passed or absent as the variant bit says.
void optional(Slot& s, bool passed) {
  s.presence = Presence::optional;
  s.passed = passed;
}
// Present iff `needed`; otherwise it must be absent.
void required_iff(Slot& s, bool needed) {
  s.presence = needed ? Presence::required : Presence::forbidden;
  s.passed = needed;
}
// A tensor of a gradient group the call may skip: passed either way, ignored when not computed.
void used_if(Slot& s, bool used) {
  if (!used) s.presence = Presence::ignored;
}

// ---- Level 1 -----------------------------------------------------------------------------------------------

bool softmax_router(int32_t kind) { return kind == MOEKIT_ROUTER_SOFTMAX_TOPK || kind == MOEKIT_ROUTER_TOPK_SOFTMAX; }

// The auxiliary losses' value slots (out) or upstream-gradient slots (in): one element each, allowed only when the
// loss is on, then passed or not as `passed` says.
void loss_slots(Builder& b, const Dims& d, double lb_coeff, double z_coeff, bool gradients, moekit_tensor_t& lb,
                moekit_tensor_t& z, bool lb_passed, bool z_passed) {
  const char* lb_name = gradients ? "dload_balance_loss" : "load_balance_loss";
  const char* z_name = gradients ? "dz_loss" : "z_loss";
  Slot& lb_slot = gradients ? b.tensor(lb_name, lb, d.score_dtype, {1}) : b.out(lb_name, lb, d.score_dtype, {1});
  Slot& z_slot = gradients ? b.tensor(z_name, z, d.score_dtype, {1}) : b.out(z_name, z, d.score_dtype, {1});
  if (lb_coeff != 0)
    optional(lb_slot, lb_passed);
  else
    required_iff(lb_slot, false);
  if (z_coeff != 0)
    optional(z_slot, z_passed);
  else
    required_iff(z_slot, false);
}

moekit_router_desc_t router_desc(const Dims& d) {
  moekit_router_desc_t desc;
  moekit_router_desc_init(&desc);
  desc.max_tokens = std::max<int64_t>(d.t + d.extra, 1);
  desc.experts = d.e;
  desc.top_k = d.k;
  desc.kind = static_cast<int32_t>(d.cfg.choose(6, 4));
  desc.renormalize = d.cfg.bit(6, 2);
  desc.scale = d.cfg.bit(6, 3) ? 2.5 : 1.0;
  desc.dtype = d.dtype;
  desc.load_balance_coeff = d.cfg.bit(7, 0) && softmax_router(desc.kind) ? 0.01 : 0.0;
  desc.z_loss_coeff = d.cfg.bit(7, 1) ? 0.001 : 0.0;
  return desc;
}

void router_forward(Builder& b, const Dims& d) {
  const moekit_router_desc_t desc = router_desc(d);
  b.plan(moekit_router_plan_create, desc);
  auto& a = b.args<moekit_router_fwd_args_t>(moekit_router_fwd_args_init);
  b.tensor("logits", a.logits, d.dtype, {d.t, d.e}).checked = Checked::masked;
  Slot& bias = b.tensor("bias", a.bias, kFp32, {d.e});
  if (desc.kind == MOEKIT_ROUTER_SIGMOID)
    optional(bias, d.cfg.bit(6, 4));
  else
    required_iff(bias, false);
  b.out("scores", a.scores, d.score_dtype, {d.t, d.k});
  b.out("indices", a.indices, d.index_dtype, {d.t, d.k});
  optional(b.out("counts", a.counts, kI32, {d.e}), d.cfg.bit(6, 5));
  loss_slots(b, d, desc.load_balance_coeff, desc.z_loss_coeff, false, a.load_balance_loss, a.z_loss,
             d.cfg.bit(7, 2), d.cfg.bit(7, 3));
  b.c.run = [&a](const RunArgs& r) {
    return moekit_router_forward(r.plan, r.null_args ? nullptr : &a, r.workspace, r.workspace_bytes, nullptr);
  };
}

void router_backward(Builder& b, const Dims& d) {
  const moekit_router_desc_t desc = router_desc(d);
  b.plan(moekit_router_plan_create, desc);
  auto& a = b.args<moekit_router_bwd_args_t>(moekit_router_bwd_args_init);
  b.tensor("logits", a.logits, d.dtype, {d.t, d.e}).checked = Checked::masked;
  b.ids("indices", a.indices, d.index_dtype, {d.t, d.k}, 0, d.e);
  b.tensor("dscores", a.dscores, d.score_dtype, {d.t, d.k});
  b.out("dlogits", a.dlogits, d.cfg.bit(6, 5) ? kFp32 : d.dtype, {d.t, d.e});
  a.accumulate = d.cfg.bit(6, 4);
  b.scalar("accumulate", a.accumulate);
  loss_slots(b, d, desc.load_balance_coeff, desc.z_loss_coeff, true, a.dload_balance_loss, a.dz_loss,
             d.cfg.bit(7, 2), d.cfg.bit(7, 3));
  b.c.run = [&a](const RunArgs& r) {
    return moekit_router_backward(r.plan, r.null_args ? nullptr : &a, r.workspace, r.workspace_bytes, nullptr);
  };
}

void dispatch(Builder& b, const Dims& d) {
  const bool general = d.cfg.bit(6, 0);
  moekit_dispatch_desc_t desc;
  moekit_dispatch_desc_init(&desc);
  desc.max_tokens = std::max<int64_t>(d.t + d.extra, 1);
  desc.top_k = general ? 0 : d.k;
  desc.experts = d.e;
  desc.expert_begin = d.cfg.choose(7, 3);
  const int64_t p = d.t * d.k;
  desc.max_pairs = std::max<int64_t>(p + d.extra, 1);
  b.plan(moekit_dispatch_plan_create, desc);
  auto& a = b.args<moekit_dispatch_args_t>(moekit_dispatch_args_init);
  const int64_t lo = desc.expert_begin - 1, hi = desc.expert_begin + d.e + 1;
  if (general) {
    b.offsets("tok_offsets", a.tok_offsets, d.t + 1, p);
    b.ids("indices", a.indices, d.index_dtype, {p}, lo, hi).content.any = true;
  } else {
    b.ids("indices", a.indices, d.index_dtype, {d.t, d.k}, lo, hi).content.any = true;
    required_iff(b.tensor("tok_offsets", a.tok_offsets, kI32, {d.t + 1}), false);
  }
  b.out("expert_offsets", a.expert_offsets, kI32, {d.e + 1});
  b.out("gather_idx", a.gather_idx, kI32, {p});
  b.out("pair_idx", a.pair_idx, kI32, {p});
  b.out("grouped_pos", a.grouped_pos, kI32, {p});
  b.c.run = [&a](const RunArgs& r) {
    return moekit_dispatch(r.plan, r.null_args ? nullptr : &a, r.workspace, r.workspace_bytes, nullptr);
  };
}

void gemm(Builder& b, const Dims& d) {
  const Config& cfg = d.cfg;
  moekit_gemm_desc_t desc;
  moekit_gemm_desc_init(&desc);
  const bool varlen_k = cfg.bit(6, 0);
  desc.mode = varlen_k ? MOEKIT_GEMM_VARLEN_K : MOEKIT_GEMM_VARLEN_M;
  if (varlen_k) {
    desc.gather = static_cast<int32_t>(((cfg.bytes[6] >> 1) & 3) % 3);
  } else {
    desc.epilogue = static_cast<int32_t>((cfg.bytes[6] >> 1) & 3);
    desc.gather = cfg.bit(6, 3) ? MOEKIT_GEMM_GATHER_A : MOEKIT_GEMM_GATHER_NONE;
    desc.b_layout = cfg.bit(6, 4) ? MOEKIT_GEMM_B_KN : MOEKIT_GEMM_B_NK;
  }
  const bool is_gated = desc.epilogue == MOEKIT_EPILOGUE_GATED, is_dgated = desc.epilogue == MOEKIT_EPILOGUE_DGATED;
  desc.activation = kActivations[cfg.choose(7, 8)];
  desc.glu_layout = cfg.bit(7, 3);
  const bool halves = (is_gated || is_dgated) && gated(desc.activation);
  const bool gathered = desc.gather != MOEKIT_GEMM_GATHER_NONE;
  const int64_t m = d.t * d.k, s = d.t, e = d.e;
  const int64_t n = halves ? 2 * d.i : d.i, k = d.h;
  desc.groups = e;
  desc.max_rows = std::max<int64_t>(m + d.extra, 1);
  desc.gather_rows = std::max<int64_t>(s + d.extra, 1);
  desc.n = n;
  desc.k = k;
  desc.dtype = d.dtype;
  if (!is_gated && !is_dgated && cfg.bit(7, 4)) desc.out_dtype = kFp32;
  b.plan(moekit_gemm_plan_create, desc);
  const int32_t out_dtype = desc.out_dtype == MOEKIT_DTYPE_INVALID ? d.dtype : desc.out_dtype;
  auto& a = b.args<moekit_gemm_args_t>(moekit_gemm_args_init);
  const int64_t act_width = halves ? n / 2 : n;
  const int64_t b_width = is_dgated ? act_width : n;

  required_iff(b.ids("gather_idx", a.gather_idx, d.index_dtype, {m}, 0, s), gathered);
  // Without a source row to gather, no group may own a row.
  b.offsets("offsets", a.offsets, e + 1, gathered && s == 0 ? 0 : m);
  b.tensor("a", a.a, d.dtype, {desc.gather == MOEKIT_GEMM_GATHER_A ? s : m, k}).checked = Checked::rows;
  if (varlen_k) {
    b.tensor("b", a.b, d.dtype, {desc.gather == MOEKIT_GEMM_GATHER_B ? s : m, n}).checked = Checked::rows;
    b.out("c", a.c, out_dtype, {e, k, n});
  } else {
    b.tensor(
        "b", a.b, d.dtype,
        desc.b_layout == MOEKIT_GEMM_B_NK ? std::vector<int64_t>{e, b_width, k} : std::vector<int64_t>{e, k, b_width});
    b.out("c", a.c, out_dtype, {m, n});
  }
  Slot& bias = b.tensor("bias", a.bias, d.dtype, {e, n});
  if (desc.epilogue == MOEKIT_EPILOGUE_BIAS)
    required_iff(bias, true);
  else if (is_gated)
    optional(bias, cfg.bit(7, 5));
  else
    required_iff(bias, false);
  Slot& h = b.tensor("h", a.h, d.dtype, {m, n});
  h.checked = Checked::rows;
  required_iff(h, is_dgated);
  required_iff(b.out("act", a.act, d.dtype, {m, act_width}), is_gated || is_dgated);
  Slot& row_scale = b.tensor("row_scale", a.row_scale, d.score_dtype, {m});
  row_scale.checked = Checked::rows;
  required_iff(row_scale, is_dgated);
  required_iff(b.ids("pair_idx", a.pair_idx, kI32, {m}, 0, m), is_dgated);
  Slot& dscores = b.tensor("dscores", a.dscores, d.score_dtype, {m}, Role::inout);
  dscores.checked = Checked::rows;
  required_iff(dscores, is_dgated);
  a.alpha = cfg.bit(7, 6) ? 0.5 : 1.0;
  b.scalar("alpha", a.alpha);
  if (is_gated || is_dgated)
    b.scalar("beta", a.beta, [](double v) { return v == 0; });
  else
    b.scalar("beta", a.beta);
  b.c.run = [&a](const RunArgs& r) {
    return moekit_gemm(r.plan, r.null_args ? nullptr : &a, r.workspace, r.workspace_bytes, nullptr);
  };
}

void combine(Builder& b, const Dims& d, bool weighted) {
  const bool variable = d.cfg.bit(6, 0);
  moekit_combine_desc_t desc;
  moekit_combine_desc_init(&desc);
  desc.max_tokens = std::max<int64_t>(d.t + d.extra, 1);
  desc.top_k = variable ? 0 : d.k;
  const int64_t p = d.t * d.k;
  desc.max_pairs = std::max<int64_t>(p + d.extra, 1);
  desc.hidden = d.h;
  desc.dtype = d.dtype;
  b.plan(moekit_combine_plan_create, desc);
  auto& a = b.args<moekit_combine_args_t>(moekit_combine_args_init);
  if (variable) {
    b.offsets("tok_offsets", a.tok_offsets, d.t + 1, p);
    Slot& scores = b.tensor("scores", a.scores, d.score_dtype, {p});
    scores.checked = Checked::rows;
    required_iff(scores, weighted);
  } else {
    required_iff(b.tensor("tok_offsets", a.tok_offsets, kI32, {d.t + 1}), false);
    required_iff(b.tensor("scores", a.scores, d.score_dtype, {d.t, d.k}), weighted);
  }
  b.tensor("grouped", a.grouped, d.dtype, {p, d.h}).checked = Checked::rows;
  b.ids("grouped_pos", a.grouped_pos, kI32, {p}, -1, p);
  b.out("out", a.out, d.dtype, {d.t, d.h});
  a.beta = d.cfg.bit(6, 1) ? 1.0 : 0.0;
  b.scalar("beta", a.beta);
  if (weighted) {
    b.c.run = [&a](const RunArgs& r) {
      return moekit_combine(r.plan, r.null_args ? nullptr : &a, r.workspace, r.workspace_bytes, nullptr);
    };
  } else {
    b.c.run = [&a](const RunArgs& r) {
      return moekit_broadcast_backward(r.plan, r.null_args ? nullptr : &a, r.workspace, r.workspace_bytes, nullptr);
    };
  }
}

moekit_bias_grad_desc_t bias_grad_desc(const Dims& d, int64_t rows, int64_t width) {
  moekit_bias_grad_desc_t desc;
  moekit_bias_grad_desc_init(&desc);
  desc.experts = d.e;
  desc.max_rows = std::max<int64_t>(rows + d.extra, 1);
  desc.width = width;
  desc.max_tokens = d.t + d.extra;
  desc.dtype = d.dtype;
  if (d.cfg.bit(6, 0)) desc.out_dtype = kFp32;
  return desc;
}

void db1(Builder& b, const Dims& d) {
  const int64_t p = d.t * d.k, w = d.i;
  const moekit_bias_grad_desc_t desc = bias_grad_desc(d, p, w);
  b.plan(moekit_bias_grad_plan_create, desc);
  auto& a = b.args<moekit_db1_args_t>(moekit_db1_args_init);
  b.tensor("dh", a.dh, d.dtype, {p, w}).checked = Checked::rows;
  b.offsets("offsets", a.offsets, d.e + 1, p);
  b.out("db1", a.db1, desc.out_dtype == kFp32 ? kFp32 : d.dtype, {d.e, w});
  a.beta = d.cfg.bit(6, 1) ? 1.0 : 0.0;
  b.scalar("beta", a.beta);
  b.c.run = [&a](const RunArgs& r) {
    return moekit_db1(r.plan, r.null_args ? nullptr : &a, r.workspace, r.workspace_bytes, nullptr);
  };
}

void db2_ds(Builder& b, const Dims& d) {
  const int64_t p = d.t * d.k;
  const moekit_bias_grad_desc_t desc = bias_grad_desc(d, p, d.h);
  b.plan(moekit_bias_grad_plan_create, desc);
  auto& a = b.args<moekit_db2_ds_args_t>(moekit_db2_ds_args_init);
  const bool has_b2 = d.cfg.bit(6, 2);
  b.tensor("dout", a.dout, d.dtype, {d.t, d.h});
  b.tensor("scores", a.scores, d.score_dtype, {p});
  Slot& b2 = b.tensor("b2", a.b2, d.dtype, {d.e, d.h});
  optional(b2, has_b2);
  b2.coupled = true;
  // Without a token to gather, no expert may own a row.
  b.offsets("offsets", a.offsets, d.e + 1, d.t == 0 ? 0 : p);
  b.ids("gather_idx", a.gather_idx, kI32, {p}, 0, d.t);
  b.ids("pair_idx", a.pair_idx, kI32, {p}, 0, p);
  optional(b.out("db2", a.db2, desc.out_dtype == kFp32 ? kFp32 : d.dtype, {d.e, d.h}), d.cfg.bit(6, 3) || !has_b2);
  Slot& dscores = b.tensor("dscores", a.dscores, d.score_dtype, {p}, Role::inout);
  dscores.checked = Checked::rows;
  if (has_b2)
    required_iff(dscores, true);
  else
    optional(dscores, d.cfg.bit(6, 4));
  a.beta = d.cfg.bit(6, 1) ? 1.0 : 0.0;
  b.scalar("beta", a.beta);
  b.c.run = [&a](const RunArgs& r) {
    return moekit_db2_ds(r.plan, r.null_args ? nullptr : &a, r.workspace, r.workspace_bytes, nullptr);
  };
}

// ---- Sparse FFN ---------------------------------------------------------------------------------------------

struct SparseDims {
  int64_t d_model, group_size, groups, d_ff, top_groups, subsample;
};

moekit_sparse_ffn_desc_t sparse_desc(const Dims& d, SparseDims& s) {
  s.d_model = d.h;
  s.group_size = d.cfg.bit(6, 0) ? 32 : 16;
  s.groups = std::min<int64_t>(d.e, 4);
  s.d_ff = s.groups * s.group_size;
  s.top_groups = std::min(d.k, s.groups);
  const int64_t subsample[] = {0, 1, s.group_size / 2, s.group_size};
  s.subsample = subsample[d.cfg.choose(7, 4)];
  moekit_sparse_ffn_desc_t desc;
  moekit_sparse_ffn_desc_init(&desc);
  desc.max_tokens = std::max<int64_t>(d.t + d.extra, 1);
  desc.d_model = s.d_model;
  desc.d_ff = s.d_ff;
  desc.group_size = s.group_size;
  desc.top_groups = s.top_groups;
  desc.subsample = s.subsample;
  desc.dtype = d.dtype;
  desc.inference = d.cfg.bit(6, 1);
  if (d.cfg.bit(6, 2)) desc.weight_grad_dtype = kFp32;
  return desc;
}

void selection_inputs(Builder& b, const Dims& d, const SparseDims& s, moekit_tensor_t& x, moekit_tensor_t& w_gate,
                      moekit_tensor_t& subsample_rows, moekit_tensor_t& lb_bias) {
  b.tensor("x", x, d.dtype, {d.t, s.d_model});
  b.tensor("w_gate", w_gate, d.dtype, {s.d_ff, s.d_model});
  Content ids{Content::subsample, 0, s.group_size};
  required_iff(b.tensor("subsample_rows", subsample_rows, kI32, {s.groups, s.subsample}, Role::input, ids),
               s.subsample > 0);
  optional(b.tensor("lb_bias", lb_bias, kFp32, {s.groups}), d.cfg.bit(6, 3));
}

void group_select(Builder& b, const Dims& d) {
  SparseDims s;
  b.plan(moekit_group_select_plan_create, sparse_desc(d, s));
  auto& a = b.args<moekit_group_select_args_t>(moekit_group_select_args_init);
  selection_inputs(b, d, s, a.x, a.w_gate, a.subsample_rows, a.lb_bias);
  b.out("groups", a.groups, kI32, {d.t, s.top_groups});
  optional(b.out("counts", a.counts, kI32, {s.groups}), d.cfg.bit(6, 4));
  b.c.run = [&a](const RunArgs& r) {
    return moekit_group_select(r.plan, r.null_args ? nullptr : &a, r.workspace, r.workspace_bytes, nullptr);
  };
}

void load_balance_update(Builder& b, const Dims& d) {
  b.c.handle = fuzz_handle(b.c.validating);
  auto& a = b.args<moekit_load_balance_args_t>(moekit_load_balance_args_init);
  const int64_t groups = d.e;
  const int32_t count_dtypes[] = {kI32, kI64, kFp32};
  b.tensor("counts", a.counts, count_dtypes[d.cfg.choose(6, 3)], {groups});
  b.tensor("ema", a.ema, kFp32, {groups}, Role::inout);
  b.tensor("bias", a.bias, kFp32, {groups}, Role::inout);
  a.tokens = std::max<double>(static_cast<double>(d.t), 1.0);
  a.top_groups = std::min(d.k, groups);
  b.scalar("tokens", a.tokens, [](double v) { return std::isfinite(v) && v > 0; });
  b.scalar("top_groups", a.top_groups, [groups](double v) { return v >= 1 && v <= static_cast<double>(groups); });
  b.scalar("momentum", a.momentum, [](double v) { return v >= 0 && v <= 1; });
  b.scalar("gamma", a.gamma, [](double v) { return std::isfinite(v) && v >= 0; });
  b.scalar("bias_max", a.bias_max, [](double v) { return std::isfinite(v) && v >= 0; });
  b.c.run = [&a](const RunArgs& r) {
    return moekit_load_balance_update(r.handle, r.null_args ? nullptr : &a, nullptr);
  };
}

// moekit_subsample_rows: a host function of four numbers and an output array. What it must do with them is simple
// enough to say here, so the harness judges every input itself, and keeps out[] within what it backs.
struct SubsampleCall {
  moekit_tensor_t out{};
  int64_t seed = 1, groups = 4, group_size = 16, rows = 8;
};

void subsample_rows(Builder& b, const Dims& d) {
  auto args = std::make_shared<SubsampleCall>();
  SubsampleCall& a = *args;
  b.c.args = args;
  a.groups = d.e;
  a.rows = std::min<int64_t>(d.i, a.group_size);
  b.out("out", a.out, kI32, {1024});
  b.scalar("seed", a.seed, nullptr);
  b.scalar("num_groups", a.groups, nullptr);
  b.scalar("group_size", a.group_size, nullptr);
  b.scalar("rows_per_group", a.rows, nullptr);
  b.c.judge = [&a](Call&, const std::function<size_t(size_t)>& room) {
    const __int128 ids = static_cast<__int128>(a.groups) * a.group_size;
    const bool null_out = a.out.data == nullptr;
    if (a.groups < 0 || a.group_size < 1 || a.rows < 1 || a.rows > a.group_size ||
        ids > std::numeric_limits<int32_t>::max() || (null_out && a.groups > 0))
      return Call::Verdict::invalid;
    // An int32_t* that is not aligned is the caller's undefined behaviour, not a bad argument.
    if (reinterpret_cast<uintptr_t>(a.out.data) % sizeof(int32_t) != 0) return Call::Verdict::skip;
    // out[] holds groups * rows ids: fewer groups keep them within what the harness backs.
    a.groups = std::min<int64_t>(a.groups, static_cast<int64_t>(room(0) / sizeof(int32_t)) / a.rows);
    const int64_t ids_written = a.groups * a.rows;
    a.out = moekit_tensor_make(a.out.data, MOEKIT_DTYPE_INT32, 1, &ids_written, a.out.device);
    return Call::Verdict::valid;
  };
  b.c.run = [&a](const RunArgs&) {
    return moekit_subsample_rows(static_cast<uint64_t>(a.seed), a.groups, a.group_size, a.rows,
                                 static_cast<int32_t*>(a.out.data));
  };
}

// ---- Layers ---------------------------------------------------------------------------------------------------

moekit_moe_desc_t moe_desc(const Dims& d, int64_t max_rows, bool training) {
  const Config& cfg = d.cfg;
  moekit_moe_desc_t desc;
  moekit_moe_desc_init(&desc);
  desc.max_tokens = std::max<int64_t>(max_rows + d.extra, 1);
  desc.hidden = d.h;
  desc.intermediate = d.i;
  desc.experts = d.e;
  desc.router_experts = d.e + (cfg.bytes[7] & 3) % 3;
  desc.expert_begin = cfg.bit(7, 2) ? desc.router_experts - d.e : 0;
  desc.top_k = d.k;
  desc.activation = kActivations[cfg.choose(6, 8)];
  desc.glu_layout = cfg.bit(6, 3);
  desc.router = static_cast<int32_t>((cfg.bytes[6] >> 4) & 3);
  desc.renormalize = cfg.bit(6, 6);
  desc.has_b1 = cfg.bit(7, 3);
  desc.has_b2 = cfg.bit(7, 4);
  desc.inference = training ? 0 : cfg.bit(7, 5);
  desc.dtype = d.dtype;
  if (cfg.bit(7, 6)) desc.weight_grad_dtype = kFp32;
  // NOTE: every configuration bit is taken; the aux losses follow the two bits of the spare tokens (d.extra).
  desc.load_balance_coeff = cfg.bit(0, 4) && softmax_router(desc.router) ? 0.01 : 0.0;
  desc.z_loss_coeff = cfg.bit(0, 5) ? 0.001 : 0.0;
  return desc;
}

struct ExpertShapes {
  int64_t e, w, h, i;
  int32_t weight_grad;
};

ExpertShapes expert_shapes(const moekit_moe_desc_t& desc) {
  return ExpertShapes{desc.experts, gated(desc.activation) ? 2 * desc.intermediate : desc.intermediate, desc.hidden,
                      desc.intermediate,
                      desc.weight_grad_dtype == MOEKIT_DTYPE_INVALID ? desc.dtype : desc.weight_grad_dtype};
}

void expert_weights(Builder& b, const moekit_moe_desc_t& desc, moekit_tensor_t& w1, moekit_tensor_t* b1,
                    moekit_tensor_t& w2, moekit_tensor_t* b2) {
  const ExpertShapes x = expert_shapes(desc);
  b.tensor("w1", w1, desc.dtype, {x.e, x.w, x.h});
  if (b1) required_iff(b.tensor("b1", *b1, desc.dtype, {x.e, x.w}), desc.has_b1);
  b.tensor("w2", w2, desc.dtype, {x.e, x.h, x.i});
  if (b2) required_iff(b.tensor("b2", *b2, desc.dtype, {x.e, x.h}), desc.has_b2);
}

// The gradients of a layer backward and its flags and betas.
template <class Args>
void expert_gradients(Builder& b, const Dims& d, const moekit_moe_desc_t& desc, int64_t rows, Args& a) {
  const ExpertShapes x = expert_shapes(desc);
  a.compute_input_grad = !d.cfg.bit(0, 6);
  a.compute_weight_grad = !d.cfg.bit(0, 7);
  used_if(b.out("dx", a.dx, desc.dtype, {rows, x.h}), a.compute_input_grad);
  const bool weights = a.compute_weight_grad;
  used_if(b.out("dw1", a.dw1, x.weight_grad, {x.e, x.w, x.h}), weights);
  Slot& db1 = b.out("db1", a.db1, x.weight_grad, {x.e, x.w});
  required_iff(db1, desc.has_b1);
  used_if(db1, weights);
  used_if(b.out("dw2", a.dw2, x.weight_grad, {x.e, x.h, x.i}), weights);
  Slot& db2 = b.out("db2", a.db2, x.weight_grad, {x.e, x.h});
  required_iff(db2, desc.has_b2);
  used_if(db2, weights);
  // The flags decide which gradients must be there: any change may make the call invalid.
  b.scalar("compute_input_grad", a.compute_input_grad, nullptr);
  b.scalar("compute_weight_grad", a.compute_weight_grad, nullptr);
  b.scalar("beta_dx", a.beta_dx);
  b.scalar("beta_dw1", a.beta_dw1);
  b.scalar("beta_db1", a.beta_db1);
  b.scalar("beta_dw2", a.beta_dw2);
  b.scalar("beta_db2", a.beta_db2);
}

void layer_plan(Builder& b, moekit_status_t (*create)(moekit_handle_t, const moekit_moe_desc_t*, moekit_plan_t*),
                const moekit_moe_desc_t& desc) {
  b.plan(create, desc);
  size_t saved = 0;
  moekit_plan_saved_size(b.c.plan.get(), &saved);
  b.c.saved_bytes = saved;
}

void moe_forward(Builder& b, const Dims& d, bool training) {
  const moekit_moe_desc_t desc = moe_desc(d, d.t, training);
  layer_plan(b, moekit_moe_plan_create, desc);
  b.c.saved_use = Call::Saved::forward;
  auto& a = b.args<moekit_moe_fwd_args_t>(moekit_moe_fwd_args_init);
  const int64_t re = desc.router_experts;
  b.tensor("x", a.x, d.dtype, {d.t, d.h});
  b.tensor("w_router", a.w_router, d.dtype, {re, d.h});
  Slot& bias = b.tensor("router_bias", a.router_bias, kFp32, {re});
  if (desc.router == MOEKIT_ROUTER_SIGMOID)
    optional(bias, d.cfg.bit(7, 7));
  else
    required_iff(bias, false);
  expert_weights(b, desc, a.w1, &a.b1, a.w2, &a.b2);
  b.out("out", a.out, d.dtype, {d.t, d.h});
  optional(b.out("scores", a.scores, d.score_dtype, {d.t, d.k}), d.cfg.bit(0, 6));
  optional(b.out("indices", a.indices, d.index_dtype, {d.t, d.k}), d.cfg.bit(0, 7));
  optional(b.out("counts", a.counts, kI32, {re}), d.cfg.bit(6, 7));
  b.scalar("beta_out", a.beta_out);
  loss_slots(b, d, desc.load_balance_coeff, desc.z_loss_coeff, false, a.load_balance_loss, a.z_loss, true, true);
  b.c.run = [&a](const RunArgs& r) {
    return moekit_moe_forward(r.plan, r.null_args ? nullptr : &a, r.saved, r.saved_bytes, r.workspace,
                              r.workspace_bytes, nullptr);
  };
}

void experts_forward(Builder& b, const Dims& d, bool training) {
  const int64_t p = d.t * d.k;
  const moekit_moe_desc_t desc = moe_desc(d, p, training);
  layer_plan(b, moekit_experts_plan_create, desc);
  b.c.saved_use = Call::Saved::forward;
  auto& a = b.args<moekit_experts_fwd_args_t>(moekit_experts_fwd_args_init);
  b.tensor("x", a.x, d.dtype, {p, d.h}).checked = Checked::rows;
  b.offsets("offsets", a.offsets, d.e + 1, p);
  expert_weights(b, desc, a.w1, &a.b1, a.w2, &a.b2);
  b.out("y", a.y, d.dtype, {p, d.h});
  b.c.run = [&a](const RunArgs& r) {
    return moekit_experts_forward(r.plan, r.null_args ? nullptr : &a, r.saved, r.saved_bytes, r.workspace,
                                  r.workspace_bytes, nullptr);
  };
}

void sparse_ffn_forward(Builder& b, const Dims& d, bool training) {
  SparseDims s;
  moekit_sparse_ffn_desc_t desc = sparse_desc(d, s);
  if (training) desc.inference = 0;
  b.plan(moekit_sparse_ffn_plan_create, desc);
  size_t saved = 0;
  moekit_plan_saved_size(b.c.plan.get(), &saved);
  b.c.saved_bytes = saved;
  b.c.saved_use = Call::Saved::forward;
  auto& a = b.args<moekit_sparse_ffn_fwd_args_t>(moekit_sparse_ffn_fwd_args_init);
  selection_inputs(b, d, s, a.x, a.w_gate, a.subsample_rows, a.lb_bias);
  b.tensor("w_up", a.w_up, d.dtype, {s.d_ff, s.d_model});
  b.tensor("w_down", a.w_down, d.dtype, {s.d_model, s.d_ff});
  b.out("out", a.out, d.dtype, {d.t, s.d_model});
  optional(b.out("groups", a.groups, kI32, {d.t, s.top_groups}), d.cfg.bit(6, 4));
  optional(b.out("counts", a.counts, kI32, {s.groups}), d.cfg.bit(6, 5));
  b.scalar("beta_out", a.beta_out);
  b.c.run = [&a](const RunArgs& r) {
    return moekit_sparse_ffn_forward(r.plan, r.null_args ? nullptr : &a, r.saved, r.saved_bytes, r.workspace,
                                     r.workspace_bytes, nullptr);
  };
}

std::unique_ptr<Call> build(Op op, const Config& config, bool training, bool validating);

// Runs the valid forward of a backward call's plan (training) and keeps its saved buffer.
void run_forward(Call& backward, Op forward_op, const Config& config) {
  std::unique_ptr<Call> forward = build(forward_op, config, true, backward.validating);
  Engine engine(*forward, 0x5eed);
  const moekit_status_t status = engine.run().status;
  // A validating forward may find that an output overflowed; it ran all the same and filled the saved buffer.
  if (status != MOEKIT_SUCCESS && !(forward->validating && status == MOEKIT_STATUS_VALIDATION_FAILED))
    violation(forward->op, "the forward of a backward call failed");
  backward.plan = forward->plan;
  backward.other_plan = forward->other_plan;
  backward.handle = forward->handle;
  backward.saved_bytes = forward->saved_bytes;
  backward.forward_saved = engine.take_saved();
  backward.saved_use = Call::Saved::backward;
}

void moe_backward(Builder& b, const Dims& d) {
  run_forward(b.c, Op::moe_forward, d.cfg);
  const moekit_moe_desc_t desc = moe_desc(d, d.t, true);
  auto& a = b.args<moekit_moe_bwd_args_t>(moekit_moe_bwd_args_init);
  const int64_t re = desc.router_experts;
  b.tensor("x", a.x, d.dtype, {d.t, d.h});
  b.tensor("dout", a.dout, d.dtype, {d.t, d.h});
  b.tensor("w_router", a.w_router, d.dtype, {re, d.h});
  expert_weights(b, desc, a.w1, nullptr, a.w2, nullptr);
  required_iff(b.tensor("b2", a.b2, d.dtype, {d.e, d.h}), desc.has_b2);
  expert_gradients(b, d, desc, d.t, a);
  used_if(b.out("dw_router", a.dw_router, expert_shapes(desc).weight_grad, {re, d.h}), a.compute_weight_grad);
  b.scalar("beta_dw_router", a.beta_dw_router);
  loss_slots(b, d, desc.load_balance_coeff, desc.z_loss_coeff, true, a.dload_balance_loss, a.dz_loss, true, true);
  b.c.run = [&a](const RunArgs& r) {
    return moekit_moe_backward(r.plan, r.null_args ? nullptr : &a, r.saved, r.saved_bytes, r.workspace,
                               r.workspace_bytes, nullptr);
  };
}

void experts_backward(Builder& b, const Dims& d) {
  run_forward(b.c, Op::experts_forward, d.cfg);
  const int64_t p = d.t * d.k;
  const moekit_moe_desc_t desc = moe_desc(d, p, true);
  auto& a = b.args<moekit_experts_bwd_args_t>(moekit_experts_bwd_args_init);
  b.tensor("x", a.x, d.dtype, {p, d.h}).checked = Checked::rows;
  b.offsets("offsets", a.offsets, d.e + 1, p);
  expert_weights(b, desc, a.w1, nullptr, a.w2, nullptr);
  b.tensor("dy", a.dy, d.dtype, {p, d.h}).checked = Checked::rows;
  expert_gradients(b, d, desc, p, a);
  b.c.run = [&a](const RunArgs& r) {
    return moekit_experts_backward(r.plan, r.null_args ? nullptr : &a, r.saved, r.saved_bytes, r.workspace,
                                   r.workspace_bytes, nullptr);
  };
}

void sparse_ffn_backward(Builder& b, const Dims& d) {
  run_forward(b.c, Op::sparse_ffn_forward, d.cfg);
  SparseDims s;
  moekit_sparse_ffn_desc_t desc = sparse_desc(d, s);
  const int32_t wg = desc.weight_grad_dtype == MOEKIT_DTYPE_INVALID ? d.dtype : desc.weight_grad_dtype;
  auto& a = b.args<moekit_sparse_ffn_bwd_args_t>(moekit_sparse_ffn_bwd_args_init);
  b.tensor("x", a.x, d.dtype, {d.t, s.d_model});
  b.tensor("w_gate", a.w_gate, d.dtype, {s.d_ff, s.d_model});
  b.tensor("w_up", a.w_up, d.dtype, {s.d_ff, s.d_model});
  b.tensor("w_down", a.w_down, d.dtype, {s.d_model, s.d_ff});
  b.tensor("dout", a.dout, d.dtype, {d.t, s.d_model});
  a.compute_input_grad = !d.cfg.bit(0, 6);
  a.compute_weight_grad = !d.cfg.bit(0, 7);
  used_if(b.out("dx", a.dx, d.dtype, {d.t, s.d_model}), a.compute_input_grad);
  used_if(b.out("dw_gate", a.dw_gate, wg, {s.d_ff, s.d_model}), a.compute_weight_grad);
  used_if(b.out("dw_up", a.dw_up, wg, {s.d_ff, s.d_model}), a.compute_weight_grad);
  used_if(b.out("dw_down", a.dw_down, wg, {s.d_model, s.d_ff}), a.compute_weight_grad);
  b.scalar("compute_input_grad", a.compute_input_grad, nullptr);
  b.scalar("compute_weight_grad", a.compute_weight_grad, nullptr);
  b.scalar("beta_dx", a.beta_dx);
  b.scalar("beta_dw_gate", a.beta_dw_gate);
  b.scalar("beta_dw_up", a.beta_dw_up);
  b.scalar("beta_dw_down", a.beta_dw_down);
  b.c.run = [&a](const RunArgs& r) {
    return moekit_sparse_ffn_backward(r.plan, r.null_args ? nullptr : &a, r.saved, r.saved_bytes, r.workspace,
                                      r.workspace_bytes, nullptr);
  };
}

// Every Op's function name and builder; training: a layer forward's plan keeps its saved buffer whatever the
// configuration says (a backward follows).
struct OpEntry {
  const char* name;
  void (*build)(Builder& b, const Dims& d, bool training);
};

const OpEntry kOps[] = {
    {"moekit_router_forward", [](Builder& b, const Dims& d, bool) { router_forward(b, d); }},
    {"moekit_router_backward", [](Builder& b, const Dims& d, bool) { router_backward(b, d); }},
    {"moekit_dispatch", [](Builder& b, const Dims& d, bool) { dispatch(b, d); }},
    {"moekit_gemm", [](Builder& b, const Dims& d, bool) { gemm(b, d); }},
    {"moekit_combine", [](Builder& b, const Dims& d, bool) { combine(b, d, true); }},
    {"moekit_broadcast_backward", [](Builder& b, const Dims& d, bool) { combine(b, d, false); }},
    {"moekit_db1", [](Builder& b, const Dims& d, bool) { db1(b, d); }},
    {"moekit_db2_ds", [](Builder& b, const Dims& d, bool) { db2_ds(b, d); }},
    {"moekit_group_select", [](Builder& b, const Dims& d, bool) { group_select(b, d); }},
    {"moekit_load_balance_update", [](Builder& b, const Dims& d, bool) { load_balance_update(b, d); }},
    {"moekit_moe_forward", moe_forward},
    {"moekit_moe_backward", [](Builder& b, const Dims& d, bool) { moe_backward(b, d); }},
    {"moekit_experts_forward", experts_forward},
    {"moekit_experts_backward", [](Builder& b, const Dims& d, bool) { experts_backward(b, d); }},
    {"moekit_sparse_ffn_forward", sparse_ffn_forward},
    {"moekit_sparse_ffn_backward", [](Builder& b, const Dims& d, bool) { sparse_ffn_backward(b, d); }},
    {"moekit_subsample_rows", [](Builder& b, const Dims& d, bool) { subsample_rows(b, d); }},
};
static_assert(sizeof(kOps) / sizeof(kOps[0]) == static_cast<size_t>(Op::count), "an entry for every Op");

std::unique_ptr<Call> build(Op op, const Config& config, bool training, bool validating) {
  auto call = std::make_unique<Call>();
  const OpEntry& entry = kOps[static_cast<size_t>(op)];
  call->op = entry.name;
  call->validating = validating;
  Builder b(*call);
  entry.build(b, dims_of(config), training);
  return call;
}

}  // namespace

moekit_handle_t fuzz_handle(bool validating) {
  static const auto make = [](uint32_t flags) {
    moekit_handle_desc_t desc;
    moekit_handle_desc_init(&desc);
    desc.num_threads = 1;
    desc.flags = flags;
    moekit_handle_t h = nullptr;
    if (moekit_handle_create(&desc, &h) != MOEKIT_SUCCESS) violation("moekit_handle_create", "the default failed");
    return h;
  };
  static moekit_handle_t plain = make(0), checking = make(MOEKIT_HANDLE_VALIDATE);
  return validating ? checking : plain;
}

std::unique_ptr<Call> make_call(Op op, const Config& config, bool validating) {
  return build(op, config, false, validating);
}

void fuzz_run_call(const uint8_t* data, size_t size, Edits edits) {
  FuzzInput in(data, size);
  const uint8_t first = in.byte();
  const Op op = static_cast<Op>((first & 0x7f) % static_cast<int>(Op::count));
  const Config config{in.config()};
  std::vector<std::unique_ptr<Call>> calls;
  calls.push_back(make_call(op, config, false));
  // A function without a handle (moekit_subsample_rows) has nothing to validate.
  if ((first & 0x80) && calls[0]->handle) calls.push_back(make_call(op, config, true));
  std::vector<std::unique_ptr<Engine>> engines;
  for (const std::unique_ptr<Call>& call : calls) engines.push_back(std::make_unique<Engine>(*call, config.bytes[7]));
  while (in.more()) {
    const Edit e = in.edit();
    for (const std::unique_ptr<Engine>& engine : engines) {
      if (edits == Edits::views)
        engine->view_edit(e);
      else
        engine->value_edit(e);
    }
  }
  const Outcome plain = engines[0]->run();
  if (engines.size() > 1) engines[1]->run(&plain);
}

}  // namespace moekit_fuzz
