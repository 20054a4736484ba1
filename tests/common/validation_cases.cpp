#include "common/validation_cases.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace moekit_test {

namespace {

// Shapes every case uses; widths are multiples of 8 and the dtype bf16, as the CUDA kernels take them.
constexpr int64_t kT = 8, kK = 2, kE = 4, kP = kT * kK, kH = 64;

HostTensor random_tensor(moekit_dtype_t dtype, std::vector<int64_t> shape, uint64_t seed, double scale = 1.0) {
  HostTensor t(dtype, std::move(shape));
  std::mt19937_64 rng(seed);
  t.fill_uniform(rng, scale);
  return t;
}

HostTensor int_tensor(std::vector<int64_t> shape, const std::vector<int64_t>& values) {
  HostTensor t(MOEKIT_DTYPE_INT32, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), static_cast<double>(values[i]));
  return t;
}

// Four experts of four grouped rows each.
std::vector<int64_t> even_offsets() { return {0, 4, 8, 12, 16}; }

// A permutation of 0..n-1 (pair_idx, grouped_pos): p -> (5 p + 3) mod n, n = 16.
std::vector<int64_t> permutation(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (5 * i + 3) % n;
  return v;
}

std::vector<int64_t> tokens_of_rows() {
  std::vector<int64_t> v(kP);
  for (int64_t i = 0; i < kP; ++i) v[static_cast<size_t>(i)] = (3 * i) % kT;
  return v;
}

struct Plan {
  moekit_plan_t plan = nullptr;
  ~Plan() { moekit_plan_destroy(plan); }
  size_t workspace() const {
    size_t bytes = 0;
    moekit_plan_workspace_size(plan, &bytes);
    return bytes;
  }
  size_t saved() const {
    size_t bytes = 0;
    moekit_plan_saved_size(plan, &bytes);
    return bytes;
  }
};

// Creating the plan must succeed; a failure shows as that status.
#define CREATE_OR_RETURN(call)                  \
  do {                                          \
    moekit_status_t create_status_ = (call);    \
    if (create_status_ != MOEKIT_SUCCESS) return create_status_; \
  } while (0)

ValidationCase dispatch_case(const char* name, bool general) {
  return ValidationCase{name, general ? "tok_offsets" : "indices", true, false,
                        [general](moekit_handle_t h, TensorStore& s, bool plant, std::vector<moekit_tensor_t>& out) {
    moekit_dispatch_desc_t d;
    moekit_dispatch_desc_init(&d);
    d.max_tokens = kT;
    d.top_k = general ? 0 : kK;
    d.max_pairs = kP;
    d.experts = kE;
    Plan p;
    CREATE_OR_RETURN(moekit_dispatch_plan_create(h, &d, &p.plan));
    std::vector<int64_t> ids(kP);
    for (int64_t i = 0; i < kP; ++i) ids[static_cast<size_t>(i)] = (7 * i) % kE;
    std::vector<int64_t> tok(kT + 1);
    for (int64_t t = 0; t <= kT; ++t) tok[static_cast<size_t>(t)] = t * kK;
    if (plant && general) tok[3] = 1;
    if (plant && !general) ids[5] = -5;
    moekit_dispatch_args_t a;
    moekit_dispatch_args_init(&a);
    a.indices = s.put(general ? int_tensor({kP}, ids) : int_tensor({kT, kK}, ids));
    if (general) a.tok_offsets = s.put(int_tensor({kT + 1}, tok));
    a.expert_offsets = s.put(HostTensor(MOEKIT_DTYPE_INT32, {kE + 1}));
    a.gather_idx = s.put(HostTensor(MOEKIT_DTYPE_INT32, {kP}));
    a.pair_idx = s.put(HostTensor(MOEKIT_DTYPE_INT32, {kP}));
    a.grouped_pos = s.put(HostTensor(MOEKIT_DTYPE_INT32, {kP}));
    out = {a.expert_offsets, a.grouped_pos};
    return moekit_dispatch(p.plan, &a, s.scratch(p.workspace()), p.workspace(), nullptr);
  }};
}

// The router plan both router cases run: T x E logits, top-K, the z-loss on.
moekit_status_t create_z_loss_router(moekit_handle_t h, Plan& p) {
  moekit_router_desc_t d;
  moekit_router_desc_init(&d);
  d.max_tokens = kT;
  d.experts = kE;
  d.top_k = kK;
  d.z_loss_coeff = 0.001;
  return moekit_router_plan_create(h, &d, &p.plan);
}

// A router with the z-loss on. plant 1: an expert id past E; plant 2: a NaN upstream gradient of the z-loss.
ValidationCase router_backward_case(const char* name, int planted) {
  return ValidationCase{name, planted == 1 ? "indices" : "dz_loss", true, false,
                        [planted](moekit_handle_t h, TensorStore& s, bool plant, std::vector<moekit_tensor_t>& out) {
    Plan p;
    CREATE_OR_RETURN(create_z_loss_router(h, p));
    std::vector<int64_t> idx(kP);
    for (int64_t i = 0; i < kP; ++i) idx[static_cast<size_t>(i)] = (i % kK == 0) ? (i / kK) % kE : (i / kK + 1) % kE;
    HostTensor dz(MOEKIT_DTYPE_FP32, {1});
    dz.set(0, 1.0);
    if (plant && planted == 1) idx[7] = kE + 5;
    if (plant && planted == 2) dz.set(0, NAN);
    moekit_router_bwd_args_t a;
    moekit_router_bwd_args_init(&a);
    a.logits = s.put(random_tensor(MOEKIT_DTYPE_BF16, {kT, kE}, 11));
    a.indices = s.put(int_tensor({kT, kK}, idx));
    a.dscores = s.put(random_tensor(MOEKIT_DTYPE_FP32, {kT, kK}, 12));
    a.dlogits = s.put(HostTensor(MOEKIT_DTYPE_FP32, {kT, kE}));
    a.dz_loss = s.put(dz);
    out = {a.dlogits};
    return moekit_router_backward(p.plan, &a, s.scratch(p.workspace()), p.workspace(), nullptr);
  }};
}

// A router with the z-loss on. plant 1: a NaN logit; plant 2: logits near 1e30 in one row, whose squared
// log-sum-exp overflows the z-loss to inf (an output failure).
ValidationCase router_forward_case(const char* name, int planted) {
  return ValidationCase{name, planted == 1 ? "logits" : "z_loss", true, planted == 2,
                        [planted](moekit_handle_t h, TensorStore& s, bool plant, std::vector<moekit_tensor_t>& out) {
    Plan p;
    CREATE_OR_RETURN(create_z_loss_router(h, p));
    HostTensor logits = random_tensor(MOEKIT_DTYPE_BF16, {kT, kE}, 21);
    logits.set(2, -INFINITY);  // a masked expert is valid
    if (plant && planted == 1) logits.set(9, NAN);
    if (plant && planted == 2)
      for (int64_t e = 0; e < kE; ++e) logits.set(kE + e, 1e30 * (1 + e));
    moekit_router_fwd_args_t a;
    moekit_router_fwd_args_init(&a);
    a.logits = s.put(logits);
    a.scores = s.put(HostTensor(MOEKIT_DTYPE_FP32, {kT, kK}));
    a.indices = s.put(HostTensor(MOEKIT_DTYPE_INT32, {kT, kK}));
    a.z_loss = s.put(HostTensor(MOEKIT_DTYPE_FP32, {1}));
    out = {a.scores, a.indices, a.z_loss};
    return moekit_router_forward(p.plan, &a, s.scratch(p.workspace()), p.workspace(), nullptr);
  }};
}

// plant 1: a grouped position past P; plant 2: a NaN in a row the combine reads.
ValidationCase combine_case(const char* name, int planted) {
  return ValidationCase{name, planted == 1 ? "grouped_pos" : "grouped", true, false,
                        [planted](moekit_handle_t h, TensorStore& s, bool plant, std::vector<moekit_tensor_t>& out) {
    moekit_combine_desc_t d;
    moekit_combine_desc_init(&d);
    d.max_tokens = kT;
    d.top_k = kK;
    d.hidden = kH;
    Plan p;
    CREATE_OR_RETURN(moekit_combine_plan_create(h, &d, &p.plan));
    std::vector<int64_t> pos = permutation(kP);
    pos[4] = -1;  // a dropped pair
    HostTensor grouped = random_tensor(MOEKIT_DTYPE_BF16, {kP, kH}, 31);
    grouped.set(7 * kH, NAN);  // row 7 was the dropped pair 4's: no pair reads it, so it may hold anything
    if (plant && planted == 1) pos[9] = kP + 3;
    if (plant && planted == 2) grouped.set(pos[6] * kH + 17, INFINITY);
    moekit_combine_args_t a;
    moekit_combine_args_init(&a);
    a.grouped = s.put(grouped);
    a.scores = s.put(random_tensor(MOEKIT_DTYPE_FP32, {kT, kK}, 32));
    a.grouped_pos = s.put(int_tensor({kP}, pos));
    a.out = s.put(HostTensor(MOEKIT_DTYPE_BF16, {kT, kH}));
    out = {a.out};
    return moekit_combine(p.plan, &a, s.scratch(p.workspace()), p.workspace(), nullptr);
  }};
}

moekit_bias_grad_desc_t bias_grad_desc() {
  moekit_bias_grad_desc_t d;
  moekit_bias_grad_desc_init(&d);
  d.experts = kE;
  d.max_rows = kP;
  d.width = kH;
  d.max_tokens = kT;
  return d;
}

ValidationCase db1_case() {
  return ValidationCase{"db1: offsets past the rows", "offsets", true, false,
                        [](moekit_handle_t h, TensorStore& s, bool plant, std::vector<moekit_tensor_t>& out) {
    moekit_bias_grad_desc_t d = bias_grad_desc();
    Plan p;
    CREATE_OR_RETURN(moekit_bias_grad_plan_create(h, &d, &p.plan));
    std::vector<int64_t> offsets = even_offsets();
    if (plant) offsets[kE] = kP + 40;
    moekit_db1_args_t a;
    moekit_db1_args_init(&a);
    a.dh = s.put(random_tensor(MOEKIT_DTYPE_BF16, {kP, kH}, 41));
    a.offsets = s.put(int_tensor({kE + 1}, offsets));
    a.db1 = s.put(HostTensor(MOEKIT_DTYPE_BF16, {kE, kH}));
    out = {a.db1};
    return moekit_db1(p.plan, &a, s.scratch(p.workspace()), p.workspace(), nullptr);
  }};
}

// plant 1: a token past T in gather_idx; plant 2: a pair past P in pair_idx.
ValidationCase db2_ds_case(const char* name, int planted) {
  return ValidationCase{name, planted == 1 ? "gather_idx" : "pair_idx", true, false,
                        [planted](moekit_handle_t h, TensorStore& s, bool plant, std::vector<moekit_tensor_t>& out) {
    moekit_bias_grad_desc_t d = bias_grad_desc();
    Plan p;
    CREATE_OR_RETURN(moekit_bias_grad_plan_create(h, &d, &p.plan));
    std::vector<int64_t> gather = tokens_of_rows(), pairs = permutation(kP);
    if (plant && planted == 1) gather[3] = kT + 1000;
    if (plant && planted == 2) pairs[11] = -7;
    moekit_db2_ds_args_t a;
    moekit_db2_ds_args_init(&a);
    a.dout = s.put(random_tensor(MOEKIT_DTYPE_BF16, {kT, kH}, 51));
    a.scores = s.put(random_tensor(MOEKIT_DTYPE_FP32, {kT, kK}, 52));
    a.b2 = s.put(random_tensor(MOEKIT_DTYPE_BF16, {kE, kH}, 53));
    a.offsets = s.put(int_tensor({kE + 1}, even_offsets()));
    a.gather_idx = s.put(int_tensor({kP}, gather));
    a.pair_idx = s.put(int_tensor({kP}, pairs));
    a.db2 = s.put(HostTensor(MOEKIT_DTYPE_BF16, {kE, kH}));
    a.dscores = s.put(random_tensor(MOEKIT_DTYPE_FP32, {kT, kK}, 54));
    out = {a.db2, a.dscores};
    return moekit_db2_ds(p.plan, &a, s.scratch(p.workspace()), p.workspace(), nullptr);
  }};
}

// The up-projection without the gated epilogue: C = A[gather_idx] B^T. plant 1: a gathered row past S; plant 2:
// decreasing offsets; plant 3: values whose product overflows to inf in C (an output failure).
ValidationCase gemm_case(const char* name, int planted) {
  const char* tensor = planted == 1 ? "gather_idx" : planted == 2 ? "offsets" : "c";
  return ValidationCase{name, tensor, true, planted == 3,
                        [planted](moekit_handle_t h, TensorStore& s, bool plant, std::vector<moekit_tensor_t>& out) {
    moekit_gemm_desc_t d;
    moekit_gemm_desc_init(&d);
    d.mode = MOEKIT_GEMM_VARLEN_M;
    d.gather = MOEKIT_GEMM_GATHER_A;
    d.epilogue = MOEKIT_EPILOGUE_STORE;
    d.groups = kE;
    d.max_rows = kP;
    d.gather_rows = kT;
    d.n = kH;
    d.k = kH;
    Plan p;
    CREATE_OR_RETURN(moekit_gemm_plan_create(h, &d, &p.plan));
    std::vector<int64_t> gather = tokens_of_rows(), offsets = even_offsets();
    HostTensor x = random_tensor(MOEKIT_DTYPE_BF16, {kT, kH}, 61);
    HostTensor w = random_tensor(MOEKIT_DTYPE_BF16, {kE, kH, kH}, 62);
    if (plant && planted == 1) gather[13] = kT + 1000000;
    if (plant && planted == 2) offsets[2] = 2;
    if (plant && planted == 3) {
      for (int64_t j = 0; j < kH; ++j) x.set(gather[0] * kH + j, 1e30);
      for (int64_t j = 0; j < kH * kH; ++j) w.set(j, 1e30);
    }
    moekit_gemm_args_t a;
    moekit_gemm_args_init(&a);
    a.a = s.put(x);
    a.b = s.put(w);
    a.offsets = s.put(int_tensor({kE + 1}, offsets));
    a.gather_idx = s.put(int_tensor({kP}, gather));
    a.c = s.put(HostTensor(MOEKIT_DTYPE_BF16, {kP, kH}));
    out = {a.c};
    return moekit_gemm(p.plan, &a, s.scratch(p.workspace()), p.workspace(), nullptr);
  }};
}

moekit_moe_desc_t expert_desc() {
  moekit_moe_desc_t d;
  moekit_moe_desc_init(&d);
  d.max_tokens = kP;
  d.hidden = kH;
  d.intermediate = kH;
  d.router_experts = d.experts = kE;
  d.top_k = kK;
  d.inference = 1;
  return d;
}

// plant 1: offsets past the rows; plant 2: an infinite value in a valid row of x.
ValidationCase experts_case(const char* name, int planted) {
  return ValidationCase{name, planted == 1 ? "offsets" : "x", true, false,
                        [planted](moekit_handle_t h, TensorStore& s, bool plant, std::vector<moekit_tensor_t>& out) {
    moekit_moe_desc_t d = expert_desc();
    Plan p;
    CREATE_OR_RETURN(moekit_experts_plan_create(h, &d, &p.plan));
    std::vector<int64_t> offsets = {0, 3, 7, 7, 12};  // rows 12..15 hold no expert's row
    HostTensor x = random_tensor(MOEKIT_DTYPE_BF16, {kP, kH}, 71);
    x.set(14 * kH + 3, NAN);  // past offsets[E]: never read, never checked
    if (plant && planted == 1) offsets[kE] = kP + 1;
    if (plant && planted == 2) x.set(5 * kH + 9, -INFINITY);
    moekit_experts_fwd_args_t a;
    moekit_experts_fwd_args_init(&a);
    a.x = s.put(x);
    a.offsets = s.put(int_tensor({kE + 1}, offsets));
    a.w1 = s.put(random_tensor(MOEKIT_DTYPE_BF16, {kE, 2 * kH, kH}, 72, 0.1));
    a.w2 = s.put(random_tensor(MOEKIT_DTYPE_BF16, {kE, kH, kH}, 73, 0.1));
    a.y = s.put(HostTensor(MOEKIT_DTYPE_BF16, {kP, kH}));
    out = {a.y};
    return moekit_experts_forward(p.plan, &a, nullptr, 0, s.scratch(p.workspace()), p.workspace(), nullptr);
  }};
}

ValidationCase token_experts_case() {
  return ValidationCase{"token experts: an expert id past E", "topk_idx", false, false,
                        [](moekit_handle_t h, TensorStore& s, bool plant, std::vector<moekit_tensor_t>& out) {
    moekit_moe_desc_t d = expert_desc();
    d.max_tokens = kT;
    Plan p;
    CREATE_OR_RETURN(moekit_token_experts_plan_create(h, &d, &p.plan));
    std::vector<int64_t> idx(kP);
    for (int64_t i = 0; i < kP; ++i) idx[static_cast<size_t>(i)] = i % 5 == 4 ? -1 : i % kE;
    if (plant) idx[6] = kE + 2;
    moekit_token_experts_fwd_args_t a;
    moekit_token_experts_fwd_args_init(&a);
    a.x = s.put(random_tensor(MOEKIT_DTYPE_BF16, {kT, kH}, 81));
    a.topk_idx = s.put(int_tensor({kT, kK}, idx));
    a.topk_weights = s.put(random_tensor(MOEKIT_DTYPE_FP32, {kT, kK}, 82));
    a.w1 = s.put(random_tensor(MOEKIT_DTYPE_BF16, {kE, 2 * kH, kH}, 83, 0.1));
    a.w2 = s.put(random_tensor(MOEKIT_DTYPE_BF16, {kE, kH, kH}, 84, 0.1));
    a.out = s.put(HostTensor(MOEKIT_DTYPE_BF16, {kT, kH}));
    out = {a.out};
    return moekit_token_experts_forward(p.plan, &a, nullptr, 0, s.scratch(p.workspace()), p.workspace(), nullptr);
  }};
}

ValidationCase group_select_case() {
  return ValidationCase{"group selection: a subsample row of another group", "subsample_rows", true, false,
                        [](moekit_handle_t h, TensorStore& s, bool plant, std::vector<moekit_tensor_t>& out) {
    moekit_sparse_ffn_desc_t d;
    moekit_sparse_ffn_desc_init(&d);
    d.max_tokens = kT;
    d.d_model = kH;
    d.d_ff = 256;
    d.group_size = 32;
    d.top_groups = 2;
    d.subsample = 8;
    Plan p;
    CREATE_OR_RETURN(moekit_group_select_plan_create(h, &d, &p.plan));
    std::vector<int32_t> rows(8 * 8);
    REQUIRE(moekit_subsample_rows(5, 8, 32, 8, rows.data()) == MOEKIT_SUCCESS);
    std::vector<int64_t> ids(rows.begin(), rows.end());
    if (plant) ids[3 * 8 + 2] = 7;  // group 3 owns neurons 96..127
    moekit_group_select_args_t a;
    moekit_group_select_args_init(&a);
    a.x = s.put(random_tensor(MOEKIT_DTYPE_BF16, {kT, kH}, 91));
    a.w_gate = s.put(random_tensor(MOEKIT_DTYPE_BF16, {256, kH}, 92));
    a.subsample_rows = s.put(int_tensor({8, 8}, ids));
    a.groups = s.put(HostTensor(MOEKIT_DTYPE_INT32, {kT, 2}));
    out = {a.groups};
    return moekit_group_select(p.plan, &a, s.scratch(p.workspace()), p.workspace(), nullptr);
  }};
}

ValidationCase load_balance_case() {
  return ValidationCase{"load balance: a NaN in the EMA", "ema", true, false,
                        [](moekit_handle_t h, TensorStore& s, bool plant, std::vector<moekit_tensor_t>& out) {
    HostTensor ema = random_tensor(MOEKIT_DTYPE_FP32, {8}, 101, 0.1);
    if (plant) ema.set(6, NAN);
    moekit_load_balance_args_t a;
    moekit_load_balance_args_init(&a);
    a.counts = s.put(int_tensor({8}, {3, 1, 4, 1, 5, 9, 2, 6}));
    a.ema = s.put(ema);
    a.bias = s.put(random_tensor(MOEKIT_DTYPE_FP32, {8}, 102, 0.1));
    a.tokens = 16;
    a.top_groups = 2;
    out = {a.ema, a.bias};
    return moekit_load_balance_update(h, &a, nullptr);
  }};
}

}  // namespace

const std::vector<ValidationCase>& validation_cases() {
  static const std::vector<ValidationCase> cases = {
      dispatch_case("dispatch: an expert id below -1", false),
      dispatch_case("dispatch: decreasing tok_offsets", true),
      router_forward_case("router forward: a NaN logit", 1),
      router_forward_case("router forward: a z-loss that overflows to inf", 2),
      router_backward_case("router backward: an expert id past E", 1),
      router_backward_case("router backward: a NaN upstream gradient of the z-loss", 2),
      combine_case("combine: a grouped position past P", 1),
      combine_case("combine: an infinite value in a row it reads", 2),
      db1_case(),
      db2_ds_case("db2 + ds: a token past T", 1),
      db2_ds_case("db2 + ds: a negative pair", 2),
      gemm_case("grouped GEMM: a gathered row past the source", 1),
      gemm_case("grouped GEMM: decreasing offsets", 2),
      gemm_case("grouped GEMM: an output that overflows to inf", 3),
      experts_case("experts: offsets past the rows", 1),
      experts_case("experts: an infinite value in a valid row", 2),
      token_experts_case(),
      group_select_case(),
      load_balance_case(),
  };
  return cases;
}

}  // namespace moekit_test
