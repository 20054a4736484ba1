// The calling contract of the C ABI: every bad argument is answered with the right status and a message naming
// it, and nothing the caller passed is written. Each operation is set up once as a valid call (a Fixture); the
// tests then break one thing at a time. None of these checks needs the math: capi rejects the call before the
// backend runs. Only "valid calls succeed" and "a saved buffer from another plan" need the reference operations.
#include <catch2/catch.hpp>

#include <cstdint>
#include <deque>
#include <limits>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "moekit/moekit.h"
#include "plan_descs.h"
#include "src/plan.h"

using moekit_test::AlignedBuffer;
using moekit_test::HostTensor;
using moekit_test::ReferenceHandle;

namespace {

using namespace plan_descs;

constexpr moekit_device_t kCpu{MOEKIT_DEVICE_CPU, 0};

// The tokens of every call (the descriptors' shapes are in plan_descs.h).
constexpr int64_t kT = 5;

struct Rejection {
  moekit_status_t status;
  std::string message;
};

Rejection outcome(moekit_status_t status) { return Rejection{status, moekit_test::last_error()}; }

#define REQUIRE_REJECTED(call, expected_status, argument)                                                    \
  do {                                                                                                      \
    Rejection rejection_ = outcome(call);                                                                   \
    INFO(#call << " -> " << moekit_status_string(rejection_.status) << ": " << rejection_.message);        \
    REQUIRE(rejection_.status == (expected_status));                                                        \
    REQUIRE_THAT(rejection_.message, Catch::Contains(argument));                                            \
  } while (0)

enum class Role { input, output };

// One tensor argument of a fixture: the args field it fills and what a bad value of it may be tested with.
struct Slot {
  std::string name;
  moekit_tensor_t* field;
  bool required;
  bool leading;  // dimension 0 gives a run-time extent (T, P, M) to the other tensors
  bool flat;     // read flat: any rank with the right element count is fine
};

// A valid call of one operation, with every tensor it passes.
class Fixture {
 public:
  explicit Fixture(std::string op) : op(std::move(op)) {}
  virtual ~Fixture() { moekit_plan_destroy(plan); }
  virtual moekit_status_t call() = 0;

  // Remembers every tensor's bytes, to prove later that a rejected call wrote nothing.
  void snapshot() {
    before_.assign(tensors_.begin(), tensors_.end());
  }
  bool untouched() const {
    for (size_t i = 0; i < before_.size(); ++i)
      if (!before_[i].bytes_equal(tensors_[i])) return false;
    return true;
  }

  std::string op;
  moekit_plan_t plan = nullptr;
  std::vector<Slot> slots;
  bool baseline_succeeds = true;  // false where the backend needs more than valid arguments (a real saved buffer)

 // Binds a tensor to an args field: inputs get random values (or `values`), outputs are poisoned.
  void bind(const char* name, moekit_tensor_t& field, moekit_dtype_t dtype, std::vector<int64_t> shape, Role role,
            bool required = true, const std::vector<int64_t>& values = {}) {
    tensors_.emplace_back(dtype, std::move(shape));
    HostTensor& t = tensors_.back();
    if (!values.empty()) {
      for (size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), static_cast<double>(values[i]));
    } else if (role == Role::output) {
      t.poison();
    } else {
      t.fill_uniform(rng_, 1.0);
    }
    field = t.view();
    slots.push_back(Slot{name, &field, required, false, false});
  }
  void bind_out(const char* name, moekit_tensor_t& field, moekit_dtype_t dtype, std::vector<int64_t> shape,
                bool required = true) {
    bind(name, field, dtype, std::move(shape), Role::output, required);
  }
  void bind_ints(const char* name, moekit_tensor_t& field, moekit_dtype_t dtype, const std::vector<int64_t>& values,
                 std::vector<int64_t> shape = {}) {
    if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
    bind(name, field, dtype, std::move(shape), Role::input, true, values);
  }
  void mark_leading() { slots.back().leading = true; }
  void mark_flat() { slots.back().flat = true; }

 private:
  std::deque<HostTensor> tensors_;
  std::vector<HostTensor> before_;
  std::mt19937_64 rng_{20261129};
};

template <class Args>
class OpFixture : public Fixture {
 public:
  using Run = std::function<moekit_status_t(OpFixture&)>;
  OpFixture(std::string op, Run run) : Fixture(std::move(op)), run_(std::move(run)) {}
  moekit_status_t call() override { return run_(*this); }
  Args args{};
  AlignedBuffer saved;

 private:
  Run run_;
};

// Routing metadata of kT tokens, top-kK, kE local experts: every pair valid, grouped by expert.
const std::vector<int64_t> kIndices = {0, 1, 2, 3, 1, 2, 0, 3, 3, 2};  // [T, K]
const std::vector<int64_t> kOffsets = {0, 2, 4, 7, 10};                 // [E+1]
const std::vector<int64_t> kGatherIdx = {0, 3, 0, 2, 1, 2, 4, 1, 3, 4}; // token of grouped row i
const std::vector<int64_t> kPairIdx = {0, 6, 1, 4, 2, 5, 9, 3, 7, 8};   // pair of grouped row i
const std::vector<int64_t> kGroupedPos = {0, 2, 4, 7, 3, 5, 1, 8, 9, 6}; // grouped row of pair p
constexpr int64_t kP = kT * kK;

constexpr moekit_dtype_t kBf16 = MOEKIT_DTYPE_BF16, kFp32 = MOEKIT_DTYPE_FP32, kI32 = MOEKIT_DTYPE_INT32,
                         kI64 = MOEKIT_DTYPE_INT64;

template <class Args>
std::unique_ptr<OpFixture<Args>> fixture(const char* op, typename OpFixture<Args>::Run run) {
  return std::make_unique<OpFixture<Args>>(op, std::move(run));
}

// ---- Level 1 ----------------------------------------------------------------------------------------------

std::unique_ptr<Fixture> router_forward(moekit_handle_t h) {
  auto f = fixture<moekit_router_fwd_args_t>("router forward", [](auto& f) {
    return moekit_router_forward(f.plan, &f.args, nullptr, 0, nullptr);
  });
  moekit_router_desc_t d = router_desc();
  MOEKIT_REQUIRE_OK(moekit_router_plan_create(h, &d, &f->plan));
  auto& a = f->args;
  moekit_router_fwd_args_init(&a);
  f->bind("logits", a.logits, kBf16, {kT, kE}, Role::input);
  f->mark_leading();
  f->bind("bias", a.bias, kFp32, {kE}, Role::input, false);
  f->bind_out("scores", a.scores, kFp32, {kT, kK});
  f->bind_out("indices", a.indices, kI64, {kT, kK});
  f->bind_out("counts", a.counts, kI32, {kE}, false);
  return f;
}

std::unique_ptr<Fixture> router_backward(moekit_handle_t h) {
  auto f = fixture<moekit_router_bwd_args_t>("router backward", [](auto& f) {
    return moekit_router_backward(f.plan, &f.args, nullptr, 0, nullptr);
  });
  moekit_router_desc_t d = router_desc();
  MOEKIT_REQUIRE_OK(moekit_router_plan_create(h, &d, &f->plan));
  auto& a = f->args;
  moekit_router_bwd_args_init(&a);
  f->bind("logits", a.logits, kBf16, {kT, kE}, Role::input);
  f->mark_leading();
  f->bind_ints("indices", a.indices, kI32, kIndices, {kT, kK});
  f->bind("dscores", a.dscores, kFp32, {kT, kK}, Role::input);
  f->bind_out("dlogits", a.dlogits, kFp32, {kT, kE});
  return f;
}

std::unique_ptr<Fixture> dispatch_fixed(moekit_handle_t h) {
  auto f = fixture<moekit_dispatch_args_t>("dispatch (fixed top-k)", [](auto& f) {
    return moekit_dispatch(f.plan, &f.args, nullptr, 0, nullptr);
  });
  moekit_dispatch_desc_t d = dispatch_desc();
  MOEKIT_REQUIRE_OK(moekit_dispatch_plan_create(h, &d, &f->plan));
  auto& a = f->args;
  moekit_dispatch_args_init(&a);
  f->bind_ints("indices", a.indices, kI32, kIndices, {kT, kK});
  f->mark_leading();
  f->bind_out("expert_offsets", a.expert_offsets, kI32, {kE + 1});
  f->bind_out("gather_idx", a.gather_idx, kI32, {kP});
  f->bind_out("pair_idx", a.pair_idx, kI32, {kP});
  f->bind_out("grouped_pos", a.grouped_pos, kI32, {kP});
  return f;
}

std::unique_ptr<Fixture> dispatch_general(moekit_handle_t h) {
  auto f = fixture<moekit_dispatch_args_t>("dispatch (general routing)", [](auto& f) {
    return moekit_dispatch(f.plan, &f.args, nullptr, 0, nullptr);
  });
  moekit_dispatch_desc_t d;
  moekit_dispatch_desc_init(&d);
  d.max_tokens = kMaxTokens;
  d.top_k = 0;
  d.max_pairs = 12;
  d.experts = kE;
  MOEKIT_REQUIRE_OK(moekit_dispatch_plan_create(h, &d, &f->plan));
  auto& a = f->args;
  moekit_dispatch_args_init(&a);
  f->bind_ints("tok_offsets", a.tok_offsets, kI32, {0, 2, 4, 6, 8, 10});
  f->mark_leading();
  f->bind_ints("indices", a.indices, kI64, kIndices);
  f->mark_leading();
  f->bind_out("expert_offsets", a.expert_offsets, kI32, {kE + 1});
  f->bind_out("gather_idx", a.gather_idx, kI32, {kP});
  f->bind_out("pair_idx", a.pair_idx, kI32, {kP});
  f->bind_out("grouped_pos", a.grouped_pos, kI32, {kP});
  return f;
}

using GemmFixture = OpFixture<moekit_gemm_args_t>;

std::unique_ptr<GemmFixture> gemm_fixture(const char* op, moekit_handle_t h, const moekit_gemm_desc_t& d) {
  auto f = fixture<moekit_gemm_args_t>(op, [](auto& f) { return moekit_gemm(f.plan, &f.args, nullptr, 0, nullptr); });
  MOEKIT_REQUIRE_OK(moekit_gemm_plan_create(h, &d, &f->plan));
  moekit_gemm_args_init(&f->args);
  f->bind_ints("offsets", f->args.offsets, kI32, kOffsets);
  return f;
}

// h = x[gather_idx] W1^T + b1, a = swiglu(h): the up-projection of the MoE forward.
std::unique_ptr<Fixture> gemm_gated(moekit_handle_t h) {
  auto f = gemm_fixture("grouped GEMM (gathered, GATED)", h, gated_gemm_desc());
  auto& a = f->args;
  f->bind_ints("gather_idx", a.gather_idx, kI32, kGatherIdx);
  f->mark_leading();
  f->bind("a", a.a, kBf16, {kT, kH}, Role::input);
  f->mark_leading();
  f->bind("b", a.b, kBf16, {kE, 2 * kI, kH}, Role::input);
  f->bind("bias", a.bias, kBf16, {kE, 2 * kI}, Role::input, false);
  f->bind_out("c", a.c, kBf16, {kP, 2 * kI});
  f->bind_out("act", a.act, kBf16, {kP, kI});
  return f;
}

// dA = dout[gather_idx] W2 with the dgated epilogue: the first GEMM of the MoE backward.
std::unique_ptr<Fixture> gemm_dgated(moekit_handle_t h) {
  moekit_gemm_desc_t d = gemm_desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_GEMM_GATHER_A, MOEKIT_EPILOGUE_DGATED);
  d.b_layout = MOEKIT_GEMM_B_KN;
  d.n = 2 * kI;
  d.k = kH;
  auto f = gemm_fixture("grouped GEMM (gathered, DGATED)", h, d);
  auto& a = f->args;
  f->bind_ints("gather_idx", a.gather_idx, kI32, kGatherIdx);
  f->mark_leading();
  f->bind("a", a.a, kBf16, {kT, kH}, Role::input);
  f->mark_leading();
  f->bind("b", a.b, kBf16, {kE, kH, kI}, Role::input);
  f->bind("h", a.h, kBf16, {kP, 2 * kI}, Role::input);
  f->bind("row_scale", a.row_scale, kFp32, {kT, kK}, Role::input);
  f->mark_flat();
  f->bind_ints("pair_idx", a.pair_idx, kI32, kPairIdx);
  f->bind_out("c", a.c, kBf16, {kP, 2 * kI});
  f->bind_out("act", a.act, kBf16, {kP, kI});
  f->bind_out("dscores", a.dscores, kFp32, {kT, kK});
  f->mark_flat();
  return f;
}

// dW1[e] = dh_e^T x[gather_idx]_e in fp32: varlen K with B gathered.
std::unique_ptr<Fixture> gemm_varlen_k(moekit_handle_t h) {
  auto f = gemm_fixture("grouped GEMM (varlen K, B gathered)", h, varlen_k_gemm_desc());
  auto& a = f->args;
  f->bind_ints("gather_idx", a.gather_idx, kI64, kGatherIdx);
  f->mark_leading();
  f->bind("a", a.a, kBf16, {kP, 2 * kI}, Role::input);
  f->bind("b", a.b, kBf16, {kT, kH}, Role::input);
  f->mark_leading();
  f->bind_out("c", a.c, kFp32, {kE, 2 * kI, kH});
  return f;
}

std::unique_ptr<Fixture> gemm_bias(moekit_handle_t h) {
  moekit_gemm_desc_t d = gemm_desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_GEMM_GATHER_NONE, MOEKIT_EPILOGUE_BIAS);
  d.n = kH;
  d.k = kI;
  auto f = gemm_fixture("grouped GEMM (BIAS)", h, d);
  auto& a = f->args;
  f->bind("a", a.a, kBf16, {kP, kI}, Role::input);
  f->mark_leading();
  f->bind("b", a.b, kBf16, {kE, kH, kI}, Role::input);
  f->bind("bias", a.bias, kBf16, {kE, kH}, Role::input);
  f->bind_out("c", a.c, kBf16, {kP, kH});
  return f;
}

using CombineFixture = OpFixture<moekit_combine_args_t>;

std::unique_ptr<CombineFixture> combine_fixture(const char* op, moekit_handle_t h, int64_t top_k, bool weighted) {
  auto f = fixture<moekit_combine_args_t>(op, [weighted](auto& f) {
    return weighted ? moekit_combine(f.plan, &f.args, nullptr, 0, nullptr)
                    : moekit_broadcast_backward(f.plan, &f.args, nullptr, 0, nullptr);
  });
  moekit_combine_desc_t d;
  moekit_combine_desc_init(&d);
  d.max_tokens = kMaxTokens;
  d.top_k = top_k;
  d.max_pairs = 12;
  d.hidden = kH;
  MOEKIT_REQUIRE_OK(moekit_combine_plan_create(h, &d, &f->plan));
  moekit_combine_args_init(&f->args);
  f->args.beta = 1.0;
  return f;
}

std::unique_ptr<Fixture> combine(moekit_handle_t h) {
  auto f = combine_fixture("combine", h, kK, true);
  auto& a = f->args;
  f->bind("grouped", a.grouped, kBf16, {kP, kH}, Role::input);
  f->bind("scores", a.scores, kFp32, {kT, kK}, Role::input);
  f->bind_ints("grouped_pos", a.grouped_pos, kI32, kGroupedPos);
  f->bind("out", a.out, kBf16, {kT, kH}, Role::input);  // read: beta = 1
  f->mark_leading();
  return f;
}

std::unique_ptr<Fixture> broadcast_backward(moekit_handle_t h) {
  auto f = combine_fixture("broadcast backward", h, kK, false);
  auto& a = f->args;
  f->bind("grouped", a.grouped, kBf16, {kP, kH}, Role::input);
  f->bind_ints("grouped_pos", a.grouped_pos, kI32, kGroupedPos);
  f->bind("out", a.out, kBf16, {kT, kH}, Role::input);
  f->mark_leading();
  return f;
}

std::unique_ptr<Fixture> combine_variable(moekit_handle_t h) {
  auto f = combine_fixture("combine (variable top-k)", h, 0, true);
  auto& a = f->args;
  f->bind_ints("tok_offsets", a.tok_offsets, kI32, {0, 2, 4, 6, 8, 10});
  f->mark_leading();
  f->bind_ints("grouped_pos", a.grouped_pos, kI32, kGroupedPos);
  f->mark_leading();
  f->bind("scores", a.scores, kFp32, {kP}, Role::input);
  f->bind("grouped", a.grouped, kBf16, {kP, kH}, Role::input);
  f->bind_out("out", a.out, kBf16, {kT, kH});
  return f;
}

moekit_plan_t bias_grad_plan(moekit_handle_t h, int64_t width, moekit_dtype_t out_dtype) {
  moekit_bias_grad_desc_t d;
  moekit_bias_grad_desc_init(&d);
  d.experts = kE;
  d.max_rows = 12;
  d.width = width;
  d.max_tokens = kMaxTokens;
  d.out_dtype = out_dtype;
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_bias_grad_plan_create(h, &d, &plan));
  return plan;
}

std::unique_ptr<Fixture> db1(moekit_handle_t h) {
  auto f = fixture<moekit_db1_args_t>("db1", [](auto& f) { return moekit_db1(f.plan, &f.args, nullptr, 0, nullptr); });
  f->plan = bias_grad_plan(h, 2 * kI, kFp32);
  auto& a = f->args;
  moekit_db1_args_init(&a);
  f->bind("dh", a.dh, kBf16, {kP, 2 * kI}, Role::input);
  f->mark_leading();
  f->bind_ints("offsets", a.offsets, kI32, kOffsets);
  f->bind_out("db1", a.db1, kFp32, {kE, 2 * kI});
  return f;
}

std::unique_ptr<Fixture> db2_ds(moekit_handle_t h) {
  auto f = fixture<moekit_db2_ds_args_t>("db2_ds", [](auto& f) {
    return moekit_db2_ds(f.plan, &f.args, nullptr, 0, nullptr);
  });
  f->plan = bias_grad_plan(h, kH, kBf16);
  auto& a = f->args;
  moekit_db2_ds_args_init(&a);
  f->bind("dout", a.dout, kBf16, {kT, kH}, Role::input);
  f->mark_leading();
  f->bind("scores", a.scores, kFp32, {kT, kK}, Role::input);
  f->mark_flat();
  f->bind("b2", a.b2, kBf16, {kE, kH}, Role::input, false);
  f->bind_ints("offsets", a.offsets, kI32, kOffsets);
  f->bind_ints("gather_idx", a.gather_idx, kI32, kGatherIdx);
  f->mark_leading();
  f->bind_ints("pair_idx", a.pair_idx, kI32, kPairIdx);
  f->bind_out("db2", a.db2, kBf16, {kE, kH}, false);
  f->bind("dscores", a.dscores, kFp32, {kT, kK}, Role::input);  // in/out; required since b2 is given
  f->mark_flat();
  return f;
}

std::vector<int64_t> subsample_ids() {
  std::vector<int64_t> ids;
  for (int64_t g = 0; g < kGroups; ++g)
    for (int64_t j = 0; j < kSubsample; ++j) ids.push_back(g * kG + (j * 5) % kG);
  return ids;
}

std::unique_ptr<Fixture> group_select(moekit_handle_t h) {
  auto f = fixture<moekit_group_select_args_t>("group select", [](auto& f) {
    return moekit_group_select(f.plan, &f.args, nullptr, 0, nullptr);
  });
  moekit_sparse_ffn_desc_t d = sparse_ffn_desc();
  MOEKIT_REQUIRE_OK(moekit_group_select_plan_create(h, &d, &f->plan));
  auto& a = f->args;
  moekit_group_select_args_init(&a);
  f->bind("x", a.x, kBf16, {kT, kD}, Role::input);
  f->mark_leading();
  f->bind("w_gate", a.w_gate, kBf16, {kF, kD}, Role::input);
  f->bind_ints("subsample_rows", a.subsample_rows, kI32, subsample_ids(), {kGroups, kSubsample});
  f->bind("lb_bias", a.lb_bias, kFp32, {kGroups}, Role::input, false);
  f->bind_out("groups", a.groups, kI32, {kT, kTopGroups});
  f->bind_out("counts", a.counts, kI32, {kGroups}, false);
  return f;
}

std::unique_ptr<Fixture> load_balance(moekit_handle_t h) {
  auto f = fixture<moekit_load_balance_args_t>("load balance update", [h](auto& f) {
    return moekit_load_balance_update(h, &f.args, nullptr);
  });
  auto& a = f->args;
  moekit_load_balance_args_init(&a);
  a.tokens = 16;
  a.top_groups = kTopGroups;
  f->bind_ints("counts", a.counts, kI32, {3, 1, 5, 7});
  f->mark_leading();
  f->bind("ema", a.ema, kFp32, {kGroups}, Role::input);
  f->bind("bias", a.bias, kFp32, {kGroups}, Role::input);
  return f;
}

// ---- Level 2 ----------------------------------------------------------------------------------------------

template <class Args>
void make_saved(OpFixture<Args>& f) {
  size_t bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_saved_size(f.plan, &bytes));
  f.saved = AlignedBuffer(bytes);
}

template <class Args>
void bind_expert_weights(OpFixture<Args>& f, moekit_tensor_t& w1, moekit_tensor_t* b1, moekit_tensor_t& w2,
                         moekit_tensor_t* b2) {
  f.bind("w1", w1, kBf16, {kE, 2 * kI, kH}, Role::input);
  if (b1) f.bind("b1", *b1, kBf16, {kE, 2 * kI}, Role::input);
  f.bind("w2", w2, kBf16, {kE, kH, kI}, Role::input);
  if (b2) f.bind("b2", *b2, kBf16, {kE, kH}, Role::input);
}

template <class Args>
void bind_expert_gradients(OpFixture<Args>& f, Args& a) {
  f.bind_out("dw1", a.dw1, kBf16, {kE, 2 * kI, kH});
  f.bind_out("db1", a.db1, kBf16, {kE, 2 * kI});
  f.bind_out("dw2", a.dw2, kBf16, {kE, kH, kI});
  f.bind_out("db2", a.db2, kBf16, {kE, kH});
}

std::unique_ptr<Fixture> moe_forward(moekit_handle_t h) {
  auto f = fixture<moekit_moe_fwd_args_t>("MoE forward", [](auto& f) {
    return moekit_moe_forward(f.plan, &f.args, f.saved.data(), f.saved.size(), nullptr, 0, nullptr);
  });
  moekit_moe_desc_t d = moe_desc();
  MOEKIT_REQUIRE_OK(moekit_moe_plan_create(h, &d, &f->plan));
  make_saved(*f);
  auto& a = f->args;
  moekit_moe_fwd_args_init(&a);
  f->bind("x", a.x, kBf16, {kT, kH}, Role::input);
  f->mark_leading();
  f->bind("w_router", a.w_router, kBf16, {kRouterExperts, kH}, Role::input);
  f->bind("router_bias", a.router_bias, kFp32, {kRouterExperts}, Role::input, false);
  bind_expert_weights(*f, a.w1, &a.b1, a.w2, &a.b2);
  f->bind_out("out", a.out, kBf16, {kT, kH});
  f->bind_out("scores", a.scores, kFp32, {kT, kK}, false);
  f->bind_out("indices", a.indices, kI32, {kT, kK}, false);
  f->bind_out("counts", a.counts, kI32, {kRouterExperts}, false);
  return f;
}

std::unique_ptr<Fixture> moe_backward(moekit_handle_t h) {
  auto f = fixture<moekit_moe_bwd_args_t>("MoE backward", [](auto& f) {
    return moekit_moe_backward(f.plan, &f.args, f.saved.data(), f.saved.size(), nullptr, 0, nullptr);
  });
  f->baseline_succeeds = false;  // its saved buffer was never filled by a forward
  moekit_moe_desc_t d = moe_desc();
  MOEKIT_REQUIRE_OK(moekit_moe_plan_create(h, &d, &f->plan));
  make_saved(*f);
  auto& a = f->args;
  moekit_moe_bwd_args_init(&a);
  f->bind("x", a.x, kBf16, {kT, kH}, Role::input);
  f->mark_leading();
  f->bind("dout", a.dout, kBf16, {kT, kH}, Role::input);
  f->bind("w_router", a.w_router, kBf16, {kRouterExperts, kH}, Role::input);
  bind_expert_weights(*f, a.w1, nullptr, a.w2, &a.b2);
  f->bind_out("dx", a.dx, kBf16, {kT, kH});
  f->bind_out("dw_router", a.dw_router, kBf16, {kRouterExperts, kH});
  bind_expert_gradients(*f, a);
  return f;
}

std::unique_ptr<Fixture> experts_forward(moekit_handle_t h) {
  auto f = fixture<moekit_experts_fwd_args_t>("experts forward", [](auto& f) {
    return moekit_experts_forward(f.plan, &f.args, f.saved.data(), f.saved.size(), nullptr, 0, nullptr);
  });
  moekit_moe_desc_t d = moe_desc();
  d.max_tokens = 12;
  MOEKIT_REQUIRE_OK(moekit_experts_plan_create(h, &d, &f->plan));
  make_saved(*f);
  auto& a = f->args;
  moekit_experts_fwd_args_init(&a);
  f->bind("x", a.x, kBf16, {kP, kH}, Role::input);
  f->mark_leading();
  f->bind_ints("offsets", a.offsets, kI32, kOffsets);
  bind_expert_weights(*f, a.w1, &a.b1, a.w2, &a.b2);
  f->bind_out("y", a.y, kBf16, {kP, kH});
  return f;
}

std::unique_ptr<Fixture> experts_backward(moekit_handle_t h) {
  auto f = fixture<moekit_experts_bwd_args_t>("experts backward", [](auto& f) {
    return moekit_experts_backward(f.plan, &f.args, f.saved.data(), f.saved.size(), nullptr, 0, nullptr);
  });
  f->baseline_succeeds = false;
  moekit_moe_desc_t d = moe_desc();
  d.max_tokens = 12;
  MOEKIT_REQUIRE_OK(moekit_experts_plan_create(h, &d, &f->plan));
  make_saved(*f);
  auto& a = f->args;
  moekit_experts_bwd_args_init(&a);
  f->bind("x", a.x, kBf16, {kP, kH}, Role::input);
  f->mark_leading();
  f->bind_ints("offsets", a.offsets, kI32, kOffsets);
  bind_expert_weights(*f, a.w1, nullptr, a.w2, nullptr);
  f->bind("dy", a.dy, kBf16, {kP, kH}, Role::input);
  f->bind_out("dx", a.dx, kBf16, {kP, kH});
  bind_expert_gradients(*f, a);
  return f;
}

// Local ids of kT tokens, top-kK, kE local experts, with pairs that are not here (-1) or past the local range.
const std::vector<int64_t> kLocalIds = {0, -1, 2, 3, 1, 5, 0, 3, -1, 2};

std::unique_ptr<Fixture> token_experts_forward(moekit_handle_t h) {
  auto f = fixture<moekit_token_experts_fwd_args_t>("token-major experts forward", [](auto& f) {
    return moekit_token_experts_forward(f.plan, &f.args, f.saved.data(), f.saved.size(), nullptr, 0, nullptr);
  });
  moekit_moe_desc_t d = token_experts_desc();
  MOEKIT_REQUIRE_OK(moekit_token_experts_plan_create(h, &d, &f->plan));
  make_saved(*f);
  auto& a = f->args;
  moekit_token_experts_fwd_args_init(&a);
  f->bind("x", a.x, kBf16, {kT, kH}, Role::input);
  f->mark_leading();
  f->bind_ints("topk_idx", a.topk_idx, kI64, kLocalIds, {kT, kK});
  f->bind("topk_weights", a.topk_weights, kFp32, {kT, kK}, Role::input);
  bind_expert_weights(*f, a.w1, &a.b1, a.w2, &a.b2);
  f->bind_out("out", a.out, kBf16, {kT, kH});
  return f;
}

std::unique_ptr<Fixture> token_experts_backward(moekit_handle_t h) {
  auto f = fixture<moekit_token_experts_bwd_args_t>("token-major experts backward", [](auto& f) {
    return moekit_token_experts_backward(f.plan, &f.args, f.saved.data(), f.saved.size(), nullptr, 0, nullptr);
  });
  f->baseline_succeeds = false;
  moekit_moe_desc_t d = token_experts_desc();
  MOEKIT_REQUIRE_OK(moekit_token_experts_plan_create(h, &d, &f->plan));
  make_saved(*f);
  auto& a = f->args;
  moekit_token_experts_bwd_args_init(&a);
  f->bind("x", a.x, kBf16, {kT, kH}, Role::input);
  f->mark_leading();
  f->bind_ints("topk_idx", a.topk_idx, kI32, kLocalIds, {kT, kK});
  f->bind("topk_weights", a.topk_weights, kFp32, {kT, kK}, Role::input);
  bind_expert_weights(*f, a.w1, nullptr, a.w2, &a.b2);
  f->bind("dout", a.dout, kBf16, {kT, kH}, Role::input);
  f->bind_out("dx", a.dx, kBf16, {kT, kH});
  f->bind_out("dtopk_weights", a.dtopk_weights, kFp32, {kT, kK}, false);
  bind_expert_gradients(*f, a);
  return f;
}

template <class Args>
void bind_ffn_weights(OpFixture<Args>& f, Args& a) {
  f.bind("w_gate", a.w_gate, kBf16, {kF, kD}, Role::input);
  f.bind("w_up", a.w_up, kBf16, {kF, kD}, Role::input);
  f.bind("w_down", a.w_down, kBf16, {kD, kF}, Role::input);
}

std::unique_ptr<Fixture> sparse_ffn_forward(moekit_handle_t h) {
  auto f = fixture<moekit_sparse_ffn_fwd_args_t>("sparse FFN forward", [](auto& f) {
    return moekit_sparse_ffn_forward(f.plan, &f.args, f.saved.data(), f.saved.size(), nullptr, 0, nullptr);
  });
  moekit_sparse_ffn_desc_t d = sparse_ffn_desc();
  MOEKIT_REQUIRE_OK(moekit_sparse_ffn_plan_create(h, &d, &f->plan));
  make_saved(*f);
  auto& a = f->args;
  moekit_sparse_ffn_fwd_args_init(&a);
  f->bind("x", a.x, kBf16, {kT, kD}, Role::input);
  f->mark_leading();
  bind_ffn_weights(*f, a);
  f->bind_ints("subsample_rows", a.subsample_rows, kI32, subsample_ids(), {kGroups, kSubsample});
  f->bind("lb_bias", a.lb_bias, kFp32, {kGroups}, Role::input, false);
  f->bind_out("out", a.out, kBf16, {kT, kD});
  f->bind_out("groups", a.groups, kI32, {kT, kTopGroups}, false);
  f->bind_out("counts", a.counts, kI32, {kGroups}, false);
  return f;
}

std::unique_ptr<Fixture> sparse_ffn_backward(moekit_handle_t h) {
  auto f = fixture<moekit_sparse_ffn_bwd_args_t>("sparse FFN backward", [](auto& f) {
    return moekit_sparse_ffn_backward(f.plan, &f.args, f.saved.data(), f.saved.size(), nullptr, 0, nullptr);
  });
  f->baseline_succeeds = false;
  moekit_sparse_ffn_desc_t d = sparse_ffn_desc();
  MOEKIT_REQUIRE_OK(moekit_sparse_ffn_plan_create(h, &d, &f->plan));
  make_saved(*f);
  auto& a = f->args;
  moekit_sparse_ffn_bwd_args_init(&a);
  f->bind("x", a.x, kBf16, {kT, kD}, Role::input);
  f->mark_leading();
  bind_ffn_weights(*f, a);
  f->bind("dout", a.dout, kBf16, {kT, kD}, Role::input);
  f->bind_out("dx", a.dx, kBf16, {kT, kD});
  f->bind_out("dw_gate", a.dw_gate, kBf16, {kF, kD});
  f->bind_out("dw_up", a.dw_up, kBf16, {kF, kD});
  f->bind_out("dw_down", a.dw_down, kBf16, {kD, kF});
  return f;
}

using FixtureMaker = std::unique_ptr<Fixture> (*)(moekit_handle_t);

const std::vector<FixtureMaker>& all_fixtures() {
  static const std::vector<FixtureMaker> makers = {
      router_forward, router_backward, dispatch_fixed,   dispatch_general,   gemm_gated,        gemm_dgated,
      gemm_varlen_k,  gemm_bias,       combine,          broadcast_backward, combine_variable,  db1,
      db2_ds,         group_select,    load_balance,     moe_forward,        moe_backward,      experts_forward,
      experts_backward, token_experts_forward, token_experts_backward, sparse_ffn_forward, sparse_ffn_backward};
  return makers;
}

// One way to break a tensor view; returns false where it does not apply to the slot.
struct Mutation {
  const char* what;
  bool (*apply)(const Slot& slot, moekit_tensor_t& t);
};

const Mutation kMutations[] = {
    {"data NULL", [](const Slot& s, moekit_tensor_t& t) { return s.required && (t.data = nullptr, true); }},
    {"an fp8 dtype", [](const Slot&, moekit_tensor_t& t) { return t.dtype = MOEKIT_DTYPE_FP8_E4M3, true; }},
    {"an extra dimension",
     [](const Slot& s, moekit_tensor_t& t) {
       if (s.flat || t.rank >= MOEKIT_MAX_RANK) return false;
       t.shape[t.rank] = 1;
       t.stride[t.rank] = 1;
       ++t.rank;
       return true;
     }},
    {"a wrong last extent",
     [](const Slot& s, moekit_tensor_t& t) {
       // The extent of a rank-1 leading tensor is the call's T or P itself: then another tensor disagrees.
       if (s.leading && t.rank == 1) return false;
       t.shape[t.rank - 1] += 1;
       return true;
     }},
    {"overlapping rows",
     [](const Slot&, moekit_tensor_t& t) {
       if (t.rank < 2 || t.shape[t.rank - 1] < 2 || t.shape[t.rank - 2] < 2) return false;
       t.stride[t.rank - 2] -= 1;
       return true;
     }},
    {"a strided last dimension",
     [](const Slot&, moekit_tensor_t& t) {
       if (t.shape[t.rank - 1] < 2) return false;
       for (int32_t i = 0; i < t.rank; ++i) t.stride[i] *= 2;
       return true;
     }},
    {"a misaligned pointer",
     [](const Slot&, moekit_tensor_t& t) { return t.data = static_cast<char*>(t.data) + 1, true; }},
    {"a CUDA device", [](const Slot&, moekit_tensor_t& t) { return t.device = {MOEKIT_DEVICE_CUDA, 0}, true; }},
    // No memory holds such a view; before it was rejected, its element offsets overflowed int64 in the backend.
    {"a stride reaching past 2^63 bytes",
     [](const Slot&, moekit_tensor_t& t) {
       if (t.rank < 2 || t.shape[0] < 2) return false;
       t.stride[0] = std::numeric_limits<int64_t>::max();
       return true;
     }},
    // The run-time extent of a [T+1] tensor is shape[0] - 1: it must not wrap around.
    {"a first extent of INT64_MIN",
     [](const Slot&, moekit_tensor_t& t) { return t.shape[0] = std::numeric_limits<int64_t>::min(), true; }},
    {"a nonzero reserved field", [](const Slot&, moekit_tensor_t& t) { return t.reserved[1] = 42, true; }},
};

// Runs `fixture` with one argument changed by `change`, expects `status` with a message starting with `name`, and
// that no tensor was written; then undoes the change.
template <class Change, class Undo>
void expect_rejected(Fixture& f, Change change, Undo undo, moekit_status_t status, const std::string& name) {
  f.snapshot();
  change();
  Rejection r = outcome(f.call());
  undo();
  INFO(f.op << " -> " << moekit_status_string(r.status) << ": " << r.message);
  CHECK(r.status == status);
  CHECK_THAT(r.message, Catch::StartsWith(name));
  CHECK(f.untouched());
}

}  // namespace

TEST_CASE("every tensor of every operation: a bad view is rejected, named, and nothing is written", "[capi]") {
  ReferenceHandle h(2);
  for (FixtureMaker make : all_fixtures()) {
    std::unique_ptr<Fixture> f = make(h.handle);
    for (const Slot& slot : f->slots) {
      for (const Mutation& m : kMutations) {
        moekit_tensor_t original = *slot.field;
        moekit_tensor_t broken = original;
        if (!m.apply(slot, broken)) continue;
        INFO(f->op << ": " << slot.name << " with " << m.what);
        expect_rejected(
            *f, [&] { *slot.field = broken; }, [&] { *slot.field = original; }, MOEKIT_STATUS_INVALID_VALUE,
            slot.name + ":");
      }
    }
  }
}

TEST_CASE("the valid call of every fixture passes validation and runs", "[capi][reference]") {
  ReferenceHandle h(2);
  for (FixtureMaker make : all_fixtures()) {
    std::unique_ptr<Fixture> f = make(h.handle);
    if (!f->baseline_succeeds) continue;
    INFO(f->op);
    MOEKIT_REQUIRE_OK(f->call());
  }
}

namespace {

template <class Args>
OpFixture<Args>& as(Fixture& f) {
  return dynamic_cast<OpFixture<Args>&>(f);
}

}  // namespace

TEST_CASE("NULL handles, plans, args, descriptors and output pointers are rejected by name", "[capi]") {
  ReferenceHandle h(2);
  auto owner = router_forward(h.handle);
  auto& f = as<moekit_router_fwd_args_t>(*owner);
  f.snapshot();
  REQUIRE_REJECTED(moekit_router_forward(nullptr, &f.args, nullptr, 0, nullptr), MOEKIT_STATUS_INVALID_VALUE, "plan:");
  REQUIRE_REJECTED(moekit_router_forward(f.plan, nullptr, nullptr, 0, nullptr), MOEKIT_STATUS_INVALID_VALUE, "args:");
  CHECK(f.untouched());

  moekit_router_desc_t desc = router_desc();
  moekit_plan_t plan = reinterpret_cast<moekit_plan_t>(uintptr_t{0x5a5a});
  REQUIRE_REJECTED(moekit_router_plan_create(nullptr, &desc, &plan), MOEKIT_STATUS_INVALID_VALUE, "handle:");
  REQUIRE_REJECTED(moekit_router_plan_create(h.handle, nullptr, &plan), MOEKIT_STATUS_INVALID_VALUE, "desc:");
  REQUIRE_REJECTED(moekit_router_plan_create(h.handle, &desc, nullptr), MOEKIT_STATUS_INVALID_VALUE, "plan:");
  CHECK(plan == reinterpret_cast<moekit_plan_t>(uintptr_t{0x5a5a}));

  moekit_handle_desc_t handle_desc;
  moekit_handle_desc_init(&handle_desc);
  moekit_handle_t handle = nullptr;
  REQUIRE_REJECTED(moekit_handle_create(nullptr, &handle), MOEKIT_STATUS_INVALID_VALUE, "desc:");
  REQUIRE_REJECTED(moekit_handle_create(&handle_desc, nullptr), MOEKIT_STATUS_INVALID_VALUE, "handle:");
  CHECK(handle == nullptr);

  size_t bytes = 77;
  REQUIRE_REJECTED(moekit_plan_workspace_size(nullptr, &bytes), MOEKIT_STATUS_INVALID_VALUE, "plan:");
  REQUIRE_REJECTED(moekit_plan_saved_size(nullptr, &bytes), MOEKIT_STATUS_INVALID_VALUE, "plan:");
  REQUIRE_REJECTED(moekit_plan_workspace_size(f.plan, nullptr), MOEKIT_STATUS_INVALID_VALUE, "bytes:");
  CHECK(bytes == 77);

  moekit_load_balance_args_t lb;
  moekit_load_balance_args_init(&lb);
  REQUIRE_REJECTED(moekit_load_balance_update(nullptr, &lb, nullptr), MOEKIT_STATUS_INVALID_VALUE, "handle:");
  REQUIRE_REJECTED(moekit_load_balance_update(h.handle, nullptr, nullptr), MOEKIT_STATUS_INVALID_VALUE, "args:");
  REQUIRE_REJECTED(moekit_subsample_rows(7, 4, 32, 8, nullptr), MOEKIT_STATUS_INVALID_VALUE, "out:");
  REQUIRE_REJECTED(moekit_moe_fwd_args_init(nullptr), MOEKIT_STATUS_INVALID_VALUE, "args:");
  REQUIRE_REJECTED(moekit_gemm_desc_init(nullptr), MOEKIT_STATUS_INVALID_VALUE, "desc:");
}

TEST_CASE("a plan made for another operation is rejected, naming both", "[capi]") {
  ReferenceHandle h(2);
  auto router = router_forward(h.handle);
  auto dispatch = dispatch_fixed(h.handle);
  auto& r = as<moekit_router_fwd_args_t>(*router);
  r.snapshot();
  REQUIRE_REJECTED(moekit_router_forward(dispatch->plan, &r.args, nullptr, 0, nullptr), MOEKIT_STATUS_INVALID_VALUE,
                   "plan: created for the dispatch, not for the router");
  CHECK(r.untouched());

  auto experts = experts_forward(h.handle);
  auto moe = moe_forward(h.handle);
  auto& m = as<moekit_moe_fwd_args_t>(*moe);
  REQUIRE_REJECTED(moekit_moe_forward(experts->plan, &m.args, m.saved.data(), m.saved.size(), nullptr, 0, nullptr),
                   MOEKIT_STATUS_INVALID_VALUE, "plan: created for the experts layer, not for the MoE layer");
  auto select = group_select(h.handle);
  auto ffn = sparse_ffn_forward(h.handle);
  auto& s = as<moekit_sparse_ffn_fwd_args_t>(*ffn);
  REQUIRE_REJECTED(moekit_sparse_ffn_forward(select->plan, &s.args, s.saved.data(), s.saved.size(), nullptr, 0,
                                             nullptr),
                   MOEKIT_STATUS_INVALID_VALUE, "plan: created for the group selection");
}

TEST_CASE("a struct_size smaller than this header's is rejected and points to the init function", "[capi]") {
  ReferenceHandle h(2);
  auto owner = router_forward(h.handle);
  auto& f = as<moekit_router_fwd_args_t>(*owner);
  expect_rejected(
      f, [&] { f.args.struct_size = sizeof(moekit_router_fwd_args_t) - 8; },
      [&] { f.args.struct_size = sizeof(moekit_router_fwd_args_t); }, MOEKIT_STATUS_INVALID_VALUE, "args:");
  CHECK_THAT(moekit_test::last_error(), Catch::Contains("moekit_router_fwd_args_init"));

  moekit_moe_desc_t desc = moe_desc();
  desc.struct_size = 0;
  moekit_plan_t plan = nullptr;
  REQUIRE_REJECTED(moekit_moe_plan_create(h.handle, &desc, &plan), MOEKIT_STATUS_INVALID_VALUE, "desc:");
  CHECK_THAT(moekit_test::last_error(), Catch::Contains("moekit_moe_desc_init"));
  CHECK(plan == nullptr);
}

namespace {

// A descriptor change that plan creation must reject, naming `field`.
struct DescCase {
  const char* field;
  std::function<moekit_status_t(moekit_handle_t, moekit_plan_t*)> create;
};

template <class Desc>
std::function<moekit_status_t(moekit_handle_t, moekit_plan_t*)> with(
    Desc (*make)(), void (*change)(Desc&),
    moekit_status_t (*create)(moekit_handle_t, const Desc*, moekit_plan_t*)) {
  return [=](moekit_handle_t h, moekit_plan_t* plan) {
    Desc d = make();
    change(d);
    return create(h, &d, plan);
  };
}

const std::vector<DescCase>& bad_descriptors() {
  using R = moekit_router_desc_t;
  using M = moekit_moe_desc_t;
  using S = moekit_sparse_ffn_desc_t;
  using G = moekit_gemm_desc_t;
  static const std::vector<DescCase> cases = {
      {"top_k:", with<R>(router_desc, [](R& d) { d.top_k = d.experts + 1; }, moekit_router_plan_create)},
      {"top_k:", with<R>(router_desc, [](R& d) { d.top_k = 0; }, moekit_router_plan_create)},
      {"experts:", with<R>(router_desc, [](R& d) { d.experts = 0; }, moekit_router_plan_create)},
      {"kind:", with<R>(router_desc, [](R& d) { d.kind = 9; }, moekit_router_plan_create)},
      {"renormalize:", with<R>(router_desc, [](R& d) { d.renormalize = 2; }, moekit_router_plan_create)},
      {"dtype:", with<R>(router_desc, [](R& d) { d.dtype = MOEKIT_DTYPE_INT32; }, moekit_router_plan_create)},
      {"max_tokens:", with<R>(router_desc, [](R& d) { d.max_tokens = 0; }, moekit_router_plan_create)},
      {"scale:", with<R>(router_desc, [](R& d) { d.scale = INFINITY; }, moekit_router_plan_create)},
      {"top_k:", with<M>(moe_desc, [](M& d) { d.router_experts = 64, d.experts = 64, d.expert_begin = 0, d.top_k = 33; },
                         moekit_moe_plan_create)},
      {"experts:", with<M>(moe_desc, [](M& d) { d.experts = d.router_experts + 1; }, moekit_moe_plan_create)},
      {"expert_begin:", with<M>(moe_desc, [](M& d) { d.expert_begin = 3; }, moekit_moe_plan_create)},
      {"hidden:", with<M>(moe_desc, [](M& d) { d.hidden = -4; }, moekit_moe_plan_create)},
      {"activation:", with<M>(moe_desc, [](M& d) { d.activation = 5; }, moekit_moe_plan_create)},
      {"glu_layout:", with<M>(moe_desc, [](M& d) { d.glu_layout = 2; }, moekit_moe_plan_create)},
      {"glu_limit:", with<M>(moe_desc, [](M& d) { d.glu_limit = 0; }, moekit_moe_plan_create)},
      {"router:", with<M>(moe_desc, [](M& d) { d.router = 4; }, moekit_moe_plan_create)},
      {"has_b1:", with<M>(moe_desc, [](M& d) { d.has_b1 = 3; }, moekit_moe_plan_create)},
      {"inference:", with<M>(moe_desc, [](M& d) { d.inference = -1; }, moekit_moe_plan_create)},
      {"backward_overwrites_saved:", with<M>(moe_desc, [](M& d) { d.backward_overwrites_saved = 2; },
                                             moekit_moe_plan_create)},
      {"backward_scratch_in_dw1:", with<M>(moe_desc, [](M& d) { d.backward_scratch_in_dw1 = -1; },
                                           moekit_experts_plan_create)},
      {"weight_grad_dtype:", with<M>(moe_desc, [](M& d) { d.weight_grad_dtype = MOEKIT_DTYPE_FP16; },
                                     moekit_moe_plan_create)},
      {"dtype:", with<M>(moe_desc, [](M& d) { d.dtype = MOEKIT_DTYPE_FP8_E4M3; }, moekit_moe_plan_create)},
      {"intermediate:", with<M>(moe_desc, [](M& d) { d.intermediate = 0; }, moekit_experts_plan_create)},
      {"expert_begin:", with<M>(token_experts_desc, [](M& d) { d.expert_begin = 1; }, moekit_token_experts_plan_create)},
      {"top_k:", with<M>(token_experts_desc, [](M& d) { d.top_k = 0; }, moekit_token_experts_plan_create)},
      {"top_k:", with<M>(token_experts_desc, [](M& d) { d.max_tokens = 1 << 20, d.top_k = 1 << 12; },
                         moekit_token_experts_plan_create)},
      {"experts:", with<M>(token_experts_desc, [](M& d) { d.experts = 0; }, moekit_token_experts_plan_create)},
      {"dtype:", with<M>(token_experts_desc, [](M& d) { d.dtype = MOEKIT_DTYPE_INT64; },
                         moekit_token_experts_plan_create)},
      {"group_size:", with<S>(sparse_ffn_desc, [](S& d) { d.group_size = 48; }, moekit_sparse_ffn_plan_create)},
      {"group_size:", with<S>(sparse_ffn_desc, [](S& d) { d.group_size = 256; }, moekit_group_select_plan_create)},
      {"d_ff:", with<S>(sparse_ffn_desc, [](S& d) { d.d_ff = 100; }, moekit_sparse_ffn_plan_create)},
      {"subsample:", with<S>(sparse_ffn_desc, [](S& d) { d.subsample = kG + 1; }, moekit_sparse_ffn_plan_create)},
      {"top_groups:", with<S>(sparse_ffn_desc, [](S& d) { d.top_groups = kGroups + 1; },
                              moekit_group_select_plan_create)},
      {"mode:", with<G>(gated_gemm_desc, [](G& d) { d.mode = 2; }, moekit_gemm_plan_create)},
      {"epilogue:", with<G>(gated_gemm_desc, [](G& d) { d.mode = MOEKIT_GEMM_VARLEN_K; }, moekit_gemm_plan_create)},
      {"gather:", with<G>(gated_gemm_desc, [](G& d) { d.gather = MOEKIT_GEMM_GATHER_B; }, moekit_gemm_plan_create)},
      {"n:", with<G>(gated_gemm_desc, [](G& d) { d.n = 31; }, moekit_gemm_plan_create)},
      {"out_dtype:", with<G>(gated_gemm_desc, [](G& d) { d.out_dtype = MOEKIT_DTYPE_INT32; }, moekit_gemm_plan_create)},
      {"out_dtype:", with<G>(gated_gemm_desc, [](G& d) { d.out_dtype = MOEKIT_DTYPE_FP32; }, moekit_gemm_plan_create)},
      {"gather_rows:", with<G>(gated_gemm_desc, [](G& d) { d.gather_rows = 0; }, moekit_gemm_plan_create)},
      {"groups:", with<G>(gated_gemm_desc, [](G& d) { d.groups = 0; }, moekit_gemm_plan_create)},
      {"top_k:", with<moekit_dispatch_desc_t>(dispatch_desc, [](moekit_dispatch_desc_t& d) { d.top_k = -1; },
                                              moekit_dispatch_plan_create)},
      {"max_pairs:", with<moekit_dispatch_desc_t>(dispatch_desc, [](moekit_dispatch_desc_t& d) { d.top_k = 0; },
                                                  moekit_dispatch_plan_create)},
      {"expert_begin:",
       with<moekit_dispatch_desc_t>(dispatch_desc, [](moekit_dispatch_desc_t& d) { d.expert_begin = -1; },
                                    moekit_dispatch_plan_create)},
      {"hidden:", with<moekit_combine_desc_t>(combine_desc, [](moekit_combine_desc_t& d) { d.hidden = 0; },
                                              moekit_combine_plan_create)},
      {"width:", with<moekit_bias_grad_desc_t>(bias_grad_desc, [](moekit_bias_grad_desc_t& d) { d.width = 0; },
                                               moekit_bias_grad_plan_create)},
      {"out_dtype:",
       with<moekit_bias_grad_desc_t>(bias_grad_desc, [](moekit_bias_grad_desc_t& d) { d.out_dtype = MOEKIT_DTYPE_FP64; },
                                     moekit_bias_grad_plan_create)},
      // Tensors of more than 2^56 elements at the plan's bounds: the sizes derived from them (2I, T * router_experts,
      // the saved buffer, E + 1) would overflow int64, so the largest dimension's field is named instead.
      {"intermediate:", with<M>(moe_desc, [](M& d) { d.intermediate = int64_t{1} << 62; }, moekit_moe_plan_create)},
      {"intermediate:", with<M>(moe_desc, [](M& d) { d.intermediate = int64_t{1} << 61; }, moekit_experts_plan_create)},
      {"router_experts:", with<M>(moe_desc, [](M& d) { d.router_experts = INT64_MAX - 1; }, moekit_moe_plan_create)},
      {"hidden:", with<M>(moe_desc, [](M& d) { d.hidden = int64_t{1} << 52; }, moekit_moe_plan_create)},
      {"groups:", with<G>(gated_gemm_desc, [](G& d) { d.groups = INT64_MAX; }, moekit_gemm_plan_create)},
      {"experts:", with<moekit_dispatch_desc_t>(dispatch_desc, [](moekit_dispatch_desc_t& d) { d.experts = INT64_MAX; },
                                                moekit_dispatch_plan_create)},
      {"experts:", with<moekit_bias_grad_desc_t>(bias_grad_desc,
                                                 [](moekit_bias_grad_desc_t& d) { d.experts = INT64_MAX; },
                                                 moekit_bias_grad_plan_create)},
      {"d_model:", with<S>(sparse_ffn_desc, [](S& d) { d.d_model = int64_t{1} << 60; }, moekit_sparse_ffn_plan_create)},
  };
  return cases;
}

}  // namespace

TEST_CASE("descriptor values out of range are rejected by field, and no plan is returned", "[capi]") {
  ReferenceHandle h(2);
  for (const DescCase& c : bad_descriptors()) {
    INFO(c.field);
    moekit_plan_t plan = reinterpret_cast<moekit_plan_t>(uintptr_t{0x5a5a});
    REQUIRE_REJECTED(c.create(h.handle, &plan), MOEKIT_STATUS_INVALID_VALUE, c.field);
    CHECK_THAT(moekit_test::last_error(), Catch::StartsWith(c.field));
    CHECK(plan == reinterpret_cast<moekit_plan_t>(uintptr_t{0x5a5a}));
  }
}

TEST_CASE("a non-gated activation ignores the GLU layout and the unused fields of the experts plan are ignored",
          "[capi]") {
  ReferenceHandle h(2);
  moekit_moe_desc_t d = moe_desc();
  d.activation = MOEKIT_ACT_RELU2;
  d.glu_layout = MOEKIT_GLU_INTERLEAVED;
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_moe_plan_create(h.handle, &d, &plan));
  moekit_plan_destroy(plan);
  d.top_k = 1000;  // the experts layer has no router
  d.router = 77;
  MOEKIT_REQUIRE_OK(moekit_experts_plan_create(h.handle, &d, &plan));
  moekit_plan_destroy(plan);
}

TEST_CASE("handle descriptors: bad values, and a CUDA handle in a build or machine without one", "[capi]") {
  moekit_handle_desc_t d;
  moekit_handle_desc_init(&d);
  moekit_handle_t handle = nullptr;
  d.backend = 7;
  REQUIRE_REJECTED(moekit_handle_create(&d, &handle), MOEKIT_STATUS_INVALID_VALUE, "backend:");
  d.backend = MOEKIT_BACKEND_REFERENCE;
  d.flags = 1u << 9;
  REQUIRE_REJECTED(moekit_handle_create(&d, &handle), MOEKIT_STATUS_INVALID_VALUE, "flags:");
  // The validation mode is a known flag: a reference handle takes it.
  d.flags = MOEKIT_HANDLE_VALIDATE;
  REQUIRE(moekit_handle_create(&d, &handle) == MOEKIT_SUCCESS);
  moekit_handle_destroy(handle);
  handle = nullptr;
  d.flags = 0;
  d.num_threads = -1;
  REQUIRE_REJECTED(moekit_handle_create(&d, &handle), MOEKIT_STATUS_INVALID_VALUE, "num_threads:");
  CHECK(handle == nullptr);

  // NOTE: CPU CI has no GPU; with a GPU of compute capability 9.x this request would succeed.
  moekit_handle_desc_init(&d);
  d.backend = MOEKIT_BACKEND_CUDA;
  moekit_status_t status = moekit_handle_create(&d, &handle);
  if (status == MOEKIT_SUCCESS) {
    moekit_handle_destroy(handle);
    SUCCEED("this machine has a usable Hopper GPU");
    return;
  }
  INFO(moekit_test::last_error());
  CHECK(status == MOEKIT_STATUS_NOT_SUPPORTED);
  CHECK_THAT(moekit_test::last_error(), Catch::Contains("CUDA"));
  CHECK(handle == nullptr);
}

TEST_CASE("run-time T: above max_tokens, or disagreeing between tensors, names the tensor", "[capi]") {
  ReferenceHandle h(2);
  auto owner = moe_forward(h.handle);
  auto& f = as<moekit_moe_fwd_args_t>(*owner);
  moekit_tensor_t& x = f.args.x;
  moekit_tensor_t& out = f.args.out;
  expect_rejected(f, [&] { x.shape[0] = kMaxTokens + 1; }, [&] { x.shape[0] = kT; }, MOEKIT_STATUS_INVALID_VALUE, "x:");
  CHECK_THAT(moekit_test::last_error(), Catch::Contains("max_tokens = 8"));
  expect_rejected(f, [&] { out.shape[0] = kT + 1; }, [&] { out.shape[0] = kT; }, MOEKIT_STATUS_INVALID_VALUE,
                  "out: expected shape [T, H] = [5, 32], got [6, 32]");

  auto bwd_owner = moe_backward(h.handle);
  auto& b = as<moekit_moe_bwd_args_t>(*bwd_owner);
  expect_rejected(b, [&] { b.args.dout.shape[0] = kT - 1; }, [&] { b.args.dout.shape[0] = kT; },
                  MOEKIT_STATUS_INVALID_VALUE, "dout:");

  auto router = router_forward(h.handle);
  auto& r = as<moekit_router_fwd_args_t>(*router);
  expect_rejected(r, [&] { r.args.scores.shape[0] = kT - 1; }, [&] { r.args.scores.shape[0] = kT; },
                  MOEKIT_STATUS_INVALID_VALUE, "scores:");
}

TEST_CASE("messages say what was expected and what came", "[capi]") {
  ReferenceHandle h(2);
  auto owner = moe_forward(h.handle);
  auto& f = as<moekit_moe_fwd_args_t>(*owner);
  moekit_tensor_t& w1 = f.args.w1;
  moekit_tensor_t& x = f.args.x;
  expect_rejected(f, [&] { w1.shape[2] += 1; }, [&] { w1.shape[2] -= 1; }, MOEKIT_STATUS_INVALID_VALUE,
                  "w1: expected shape [E, 2I, H] = [4, 16, 32], got [4, 16, 33]");
  expect_rejected(f, [&] { x.dtype = MOEKIT_DTYPE_FP16; }, [&] { x.dtype = MOEKIT_DTYPE_BF16; },
                  MOEKIT_STATUS_INVALID_VALUE, "x: expected dtype bf16, got fp16");
  expect_rejected(f, [&] { x.device = {MOEKIT_DEVICE_CUDA, 0}; }, [&] { x.device = kCpu; },
                  MOEKIT_STATUS_INVALID_VALUE, "x: expected a CPU tensor for a reference handle, got CUDA:0");
  expect_rejected(f, [&] { w1.rank = 2; }, [&] { w1.rank = 3; }, MOEKIT_STATUS_INVALID_VALUE,
                  "w1: expected rank 3 [E, 2I, H] = [4, 16, 32], got rank 2");
}

TEST_CASE("tensors required or forbidden by the plan's flags", "[capi]") {
  ReferenceHandle h(2);
  {
    // has_b1 = 0: b1 must be absent.
    auto owner = moe_forward(h.handle);
    auto& f = as<moekit_moe_fwd_args_t>(*owner);
    moekit_moe_desc_t d = moe_desc();
    d.has_b1 = 0;
    moekit_plan_t without_b1 = nullptr;
    MOEKIT_REQUIRE_OK(moekit_moe_plan_create(h.handle, &d, &without_b1));
    std::swap(f.plan, without_b1);
    make_saved(f);
    expect_rejected(f, [] {}, [] {}, MOEKIT_STATUS_INVALID_VALUE, "b1: must be absent");
    moekit_plan_destroy(without_b1);
  }
  {
    // A router bias is for the SIGMOID kind only.
    auto owner = router_forward(h.handle);
    auto& f = as<moekit_router_fwd_args_t>(*owner);
    moekit_router_desc_t d = router_desc();
    d.kind = MOEKIT_ROUTER_SOFTMAX_TOPK;
    moekit_plan_t softmax = nullptr;
    MOEKIT_REQUIRE_OK(moekit_router_plan_create(h.handle, &d, &softmax));
    std::swap(f.plan, softmax);
    expect_rejected(f, [] {}, [] {}, MOEKIT_STATUS_INVALID_VALUE, "bias: must be absent");
    moekit_plan_destroy(softmax);
  }
  {
    // Fixed routing takes no tok_offsets; a plan without gather takes no gather_idx.
    auto owner = dispatch_fixed(h.handle);
    auto& f = as<moekit_dispatch_args_t>(*owner);
    int32_t offsets[kT + 1] = {0, 2, 4, 6, 8, 10};
    int64_t shape[1] = {kT + 1};
    expect_rejected(
        f, [&] { f.args.tok_offsets = moekit_tensor_make(offsets, MOEKIT_DTYPE_INT32, 1, shape, kCpu); },
        [&] { f.args.tok_offsets = moekit_tensor_t{}; }, MOEKIT_STATUS_INVALID_VALUE, "tok_offsets: must be absent");
    auto gemm = gemm_bias(h.handle);
    auto& g = as<moekit_gemm_args_t>(*gemm);
    expect_rejected(
        g, [&] { g.args.gather_idx = f.args.grouped_pos; }, [&] { g.args.gather_idx = moekit_tensor_t{}; },
        MOEKIT_STATUS_INVALID_VALUE, "gather_idx: must be absent");
    expect_rejected(
        g, [&] { g.args.h = g.args.c; }, [&] { g.args.h = moekit_tensor_t{}; }, MOEKIT_STATUS_INVALID_VALUE,
        "h: must be absent");
    expect_rejected(
        g, [&] { g.args.beta = NAN; }, [&] { g.args.beta = 0; }, MOEKIT_STATUS_INVALID_VALUE, "beta:");
  }
  {
    // The broadcast backward sums with weights of 1: scores must be absent.
    auto owner = broadcast_backward(h.handle);
    auto& f = as<moekit_combine_args_t>(*owner);
    auto with_scores = combine(h.handle);
    expect_rejected(
        f, [&] { f.args.scores = as<moekit_combine_args_t>(*with_scores).args.scores; },
        [&] { f.args.scores = moekit_tensor_t{}; }, MOEKIT_STATUS_INVALID_VALUE, "scores: must be absent");
  }
  {
    // subsample = 0: no subsample_rows.
    auto owner = group_select(h.handle);
    auto& f = as<moekit_group_select_args_t>(*owner);
    moekit_sparse_ffn_desc_t d = sparse_ffn_desc();
    d.subsample = 0;
    moekit_plan_t all_rows = nullptr;
    MOEKIT_REQUIRE_OK(moekit_group_select_plan_create(h.handle, &d, &all_rows));
    std::swap(f.plan, all_rows);
    expect_rejected(f, [] {}, [] {}, MOEKIT_STATUS_INVALID_VALUE, "subsample_rows: must be absent");
    moekit_plan_destroy(all_rows);
  }
  {
    // Gradients that are not computed are not checked: a missing dw1 matters only with compute_weight_grad = 1.
    auto owner = moe_backward(h.handle);
    auto& f = as<moekit_moe_bwd_args_t>(*owner);
    moekit_tensor_t dw1 = f.args.dw1;
    f.args.dw1 = moekit_tensor_t{};
    expect_rejected(f, [] {}, [] {}, MOEKIT_STATUS_INVALID_VALUE, "dw1: required tensor is missing");
    f.args.compute_weight_grad = 0;
    moekit_status_t status = f.call();
    INFO(moekit_status_string(status) << ": " << moekit_test::last_error());
    CHECK((status == MOEKIT_SUCCESS || !Catch::StartsWith("dw").match(moekit_test::last_error())));
    f.args.compute_weight_grad = 2;
    expect_rejected(f, [] {}, [] {}, MOEKIT_STATUS_INVALID_VALUE, "compute_weight_grad:");
    f.args.dw1 = dw1;
  }
}

// The plan of `f` made again from `d` with backward_scratch_in_dw1 = 1 (by `create`); then each rule that flag
// sets on a backward call is broken once: refused by name, nothing written.
template <class Args>
void check_scratch_in_dw1_rules(moekit_handle_t h, OpFixture<Args>& f, moekit_moe_desc_t d,
                                moekit_status_t (*create)(moekit_handle_t, const moekit_moe_desc_t*, moekit_plan_t*)) {
  d.backward_scratch_in_dw1 = 1;
  moekit_plan_t scratch = nullptr;
  MOEKIT_REQUIRE_OK(create(h, &d, &scratch));
  std::swap(f.plan, scratch);
  make_saved(f);
  const char* why = "the plan has backward_scratch_in_dw1 = 1";
  expect_rejected(
      f, [&] { f.args.compute_weight_grad = 0; }, [&] { f.args.compute_weight_grad = 1; },
      MOEKIT_STATUS_INVALID_VALUE, std::string("compute_weight_grad: must be 1 where ") + why);
  expect_rejected(
      f, [&] { f.args.beta_dw1 = 0.5; }, [&] { f.args.beta_dw1 = 0.0; }, MOEKIT_STATUS_INVALID_VALUE,
      std::string("beta_dw1: must be 0 where ") + why);
  // Rows twice apart: a valid strided view (the plan without the flag takes it), not one flat buffer.
  expect_rejected(
      f, [&] { f.args.dw1.stride[0] *= 2; }, [&] { f.args.dw1.stride[0] /= 2; }, MOEKIT_STATUS_INVALID_VALUE,
      std::string("dw1: must be contiguous (") + why);
  std::swap(f.plan, scratch);
  moekit_plan_destroy(scratch);
}

TEST_CASE("backward_scratch_in_dw1: each backward computes dW1 with beta 0 into a contiguous dw1", "[capi]") {
  ReferenceHandle h(2);
  {
    auto owner = moe_backward(h.handle);
    check_scratch_in_dw1_rules(h.handle, as<moekit_moe_bwd_args_t>(*owner), moe_desc(), moekit_moe_plan_create);
  }
  {
    auto owner = experts_backward(h.handle);
    moekit_moe_desc_t d = moe_desc();
    d.max_tokens = 12;
    check_scratch_in_dw1_rules(h.handle, as<moekit_experts_bwd_args_t>(*owner), d, moekit_experts_plan_create);
  }
  {
    auto owner = token_experts_backward(h.handle);
    check_scratch_in_dw1_rules(h.handle, as<moekit_token_experts_bwd_args_t>(*owner), token_experts_desc(),
                               moekit_token_experts_plan_create);
  }
}

TEST_CASE("workspace: too small, NULL, misaligned", "[capi]") {
  ReferenceHandle h(2);
  auto owner = router_forward(h.handle);
  auto& f = as<moekit_router_fwd_args_t>(*owner);
  // NOTE: the reference backend needs no workspace; the only white-box step of this file pretends it does, as a
  // CUDA plan would.
  f.plan->workspace_bytes = 512;
  size_t bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(f.plan, &bytes));
  CHECK(bytes == 512);
  AlignedBuffer workspace(512);
  f.snapshot();
  REQUIRE_REJECTED(moekit_router_forward(f.plan, &f.args, workspace.data(), 511, nullptr),
                   MOEKIT_STATUS_INSUFFICIENT_WORKSPACE, "workspace");
  REQUIRE_REJECTED(moekit_router_forward(f.plan, &f.args, nullptr, 512, nullptr), MOEKIT_STATUS_INVALID_VALUE,
                   "workspace:");
  REQUIRE_REJECTED(moekit_router_forward(f.plan, &f.args, static_cast<char*>(workspace.data()) + 4, 512, nullptr),
                   MOEKIT_STATUS_INVALID_VALUE, "workspace:");
  CHECK(f.untouched());
}

TEST_CASE("layer workspace: each direction needs its own size only", "[capi]") {
  ReferenceHandle h(2);
  size_t forward = 77, backward = 77;
  REQUIRE_REJECTED(moekit_plan_layer_workspace_sizes(nullptr, &forward, &backward), MOEKIT_STATUS_INVALID_VALUE,
                   "plan:");
  CHECK(forward == 77);
  CHECK(backward == 77);
  auto forward_owner = moe_forward(h.handle);
  auto& f = as<moekit_moe_fwd_args_t>(*forward_owner);
  auto backward_owner = moe_backward(h.handle);
  auto& b = as<moekit_moe_bwd_args_t>(*backward_owner);
  // NOTE: white-box, as above: the reference layers need no workspace; these sizes are a CUDA plan's pretence.
  for (moekit_plan_t plan : {f.plan, b.plan}) {
    plan->workspace_bytes = plan->forward_workspace_bytes = 512;
    plan->backward_workspace_bytes = 256;
  }
  MOEKIT_REQUIRE_OK(moekit_plan_layer_workspace_sizes(f.plan, &forward, &backward));
  CHECK(forward == 512);
  CHECK(backward == 256);
  MOEKIT_REQUIRE_OK(moekit_plan_layer_workspace_sizes(f.plan, nullptr, nullptr));
  AlignedBuffer workspace(512);
  f.snapshot();
  REQUIRE_REJECTED(moekit_moe_forward(f.plan, &f.args, f.saved.data(), f.saved.size(), workspace.data(), 511, nullptr),
                   MOEKIT_STATUS_INSUFFICIENT_WORKSPACE, "moekit_plan_layer_workspace_sizes");
  CHECK(f.untouched());
  MOEKIT_REQUIRE_OK(
      moekit_moe_forward(f.plan, &f.args, f.saved.data(), f.saved.size(), workspace.data(), 512, nullptr));
  b.snapshot();
  REQUIRE_REJECTED(moekit_moe_backward(b.plan, &b.args, b.saved.data(), b.saved.size(), workspace.data(), 255, nullptr),
                   MOEKIT_STATUS_INSUFFICIENT_WORKSPACE, "workspace_bytes: 255 bytes given, the plan needs 256");
  // 256 bytes pass the workspace check: the next one, the saved buffer no forward filled, refuses the call.
  REQUIRE_REJECTED(moekit_moe_backward(b.plan, &b.args, b.saved.data(), b.saved.size(), workspace.data(), 256, nullptr),
                   MOEKIT_STATUS_INVALID_VALUE, "saved:");
  CHECK(b.untouched());

  // A building block: its workspace size for both.
  auto router_owner = router_forward(h.handle);
  MOEKIT_REQUIRE_OK(moekit_plan_layer_workspace_sizes(router_owner->plan, &forward, &backward));
  CHECK(forward == 0);
  CHECK(backward == 0);
}

TEST_CASE("saved buffer: too small, NULL, misaligned, and an inference plan has no backward", "[capi]") {
  ReferenceHandle h(2);
  for (FixtureMaker make : {moe_forward, moe_backward, experts_forward, token_experts_backward, sparse_ffn_backward}) {
    std::unique_ptr<Fixture> f = make(h.handle);
    size_t needed = 0;
    MOEKIT_REQUIRE_OK(moekit_plan_saved_size(f->plan, &needed));
    REQUIRE(needed > 0);
    AlignedBuffer& saved = f->op == "MoE forward"        ? as<moekit_moe_fwd_args_t>(*f).saved
                           : f->op == "MoE backward"     ? as<moekit_moe_bwd_args_t>(*f).saved
                           : f->op == "experts forward"  ? as<moekit_experts_fwd_args_t>(*f).saved
                           : f->op == "token-major experts backward"
                               ? as<moekit_token_experts_bwd_args_t>(*f).saved
                               : as<moekit_sparse_ffn_bwd_args_t>(*f).saved;
    AlignedBuffer full(needed);
    INFO(f->op);
    expect_rejected(*f, [&] { saved = AlignedBuffer(needed - 1); }, [&] { saved = AlignedBuffer(needed); },
                    MOEKIT_STATUS_INSUFFICIENT_WORKSPACE, "saved_bytes:");
    expect_rejected(*f, [&] { saved = AlignedBuffer::non_null(0); }, [&] { saved = AlignedBuffer(needed); },
                    MOEKIT_STATUS_INSUFFICIENT_WORKSPACE, "saved_bytes:");
  }
  auto owner = moe_forward(h.handle);
  auto& f = as<moekit_moe_fwd_args_t>(*owner);
  f.snapshot();
  REQUIRE_REJECTED(moekit_moe_forward(f.plan, &f.args, nullptr, f.saved.size(), nullptr, 0, nullptr),
                   MOEKIT_STATUS_INVALID_VALUE, "saved:");
  AlignedBuffer bigger(f.saved.size() + 256);
  REQUIRE_REJECTED(moekit_moe_forward(f.plan, &f.args, static_cast<char*>(bigger.data()) + 8, f.saved.size(), nullptr,
                                      0, nullptr),
                   MOEKIT_STATUS_INVALID_VALUE, "saved:");
  CHECK(f.untouched());

  auto bwd_owner = moe_backward(h.handle);
  auto& b = as<moekit_moe_bwd_args_t>(*bwd_owner);
  moekit_moe_desc_t d = moe_desc();
  d.inference = 1;
  moekit_plan_t inference = nullptr;
  MOEKIT_REQUIRE_OK(moekit_moe_plan_create(h.handle, &d, &inference));
  size_t inference_saved = 1;
  MOEKIT_REQUIRE_OK(moekit_plan_saved_size(inference, &inference_saved));
  CHECK(inference_saved == 0);
  b.snapshot();
  REQUIRE_REJECTED(moekit_moe_backward(inference, &b.args, b.saved.data(), b.saved.size(), nullptr, 0, nullptr),
                   MOEKIT_STATUS_INVALID_VALUE, "inference");
  CHECK(b.untouched());
  moekit_plan_destroy(inference);
}

TEST_CASE("strided (padded) views and empty batches with NULL data are accepted", "[capi][reference]") {
  ReferenceHandle h(2);
  auto owner = router_forward(h.handle);
  auto& f = as<moekit_router_fwd_args_t>(*owner);
  // logits rows padded to 2E elements: not contiguous, but no two elements overlap.
  HostTensor padded(kBf16, {kT, 2 * kE});
  std::mt19937_64 rng(3);
  padded.fill_uniform(rng, 1.0);
  f.args.logits = padded.view();
  f.args.logits.shape[1] = kE;
  MOEKIT_REQUIRE_OK(f.call());

  // T = 0: PyTorch hands out NULL data for empty tensors.
  int64_t logits_shape[2] = {0, kE}, pair_shape[2] = {0, kK};
  f.args.logits = moekit_tensor_make(nullptr, kBf16, 2, logits_shape, kCpu);
  f.args.scores = moekit_tensor_make(nullptr, kFp32, 2, pair_shape, kCpu);
  f.args.indices = moekit_tensor_make(nullptr, kI64, 2, pair_shape, kCpu);
  MOEKIT_REQUIRE_OK(f.call());
}

TEST_CASE("a saved buffer filled by another plan's forward is rejected by the backward", "[capi][reference]") {
  ReferenceHandle h(2);
  auto fwd_owner = moe_forward(h.handle);
  auto& fwd = as<moekit_moe_fwd_args_t>(*fwd_owner);
  MOEKIT_REQUIRE_OK(fwd.call());
  auto bwd_owner = moe_backward(h.handle);  // its own plan, same descriptor
  auto& bwd = as<moekit_moe_bwd_args_t>(*bwd_owner);
  bwd.args.x = fwd.args.x;
  bwd.snapshot();
  REQUIRE_REJECTED(moekit_moe_backward(bwd.plan, &bwd.args, fwd.saved.data(), fwd.saved.size(), nullptr, 0, nullptr),
                   MOEKIT_STATUS_INVALID_VALUE, "saved");
  CHECK(bwd.untouched());
  // The same buffer with the plan that filled it is accepted.
  MOEKIT_REQUIRE_OK(moekit_moe_backward(fwd.plan, &bwd.args, fwd.saved.data(), fwd.saved.size(), nullptr, 0, nullptr));
}
