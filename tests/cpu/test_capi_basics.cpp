// The parts of the C ABI that describe the library rather than compute: version, status names, the thread-local
// last-error text, destroy(NULL), the *_init defaults, tensor views and the plan size queries.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "moekit/moekit.h"

namespace {

// Fills a struct with a byte pattern first, so an *_init that forgets a field is caught.
template <class Struct>
void scribble(Struct* s) {
  std::memset(static_cast<void*>(s), 0xA5, sizeof(Struct));
}

bool is_absent(const moekit_tensor_t& t) {
  moekit_tensor_t zero{};
  return std::memcmp(&t, &zero, sizeof t) == 0;
}

// A call that fails with a known message: a NULL plan.
std::string fail_with_null_plan() {
  size_t bytes = 0;
  REQUIRE(moekit_plan_workspace_size(nullptr, &bytes) == MOEKIT_STATUS_INVALID_VALUE);
  return moekit_test::last_error();
}

}  // namespace

TEST_CASE("version: the number encodes MAJOR*10000 + MINOR*100 + PATCH and matches the header", "[capi]") {
  CHECK(moekit_get_version() == MOEKIT_VERSION_NUMBER);
  CHECK(MOEKIT_VERSION_NUMBER == MOEKIT_VERSION_MAJOR * 10000 + MOEKIT_VERSION_MINOR * 100 + MOEKIT_VERSION_PATCH);
  CHECK(moekit_get_version() == 200);  // 0.2.0
}

TEST_CASE("status strings name every status, and unknown values say so", "[capi]") {
  CHECK(std::string(moekit_status_string(MOEKIT_SUCCESS)) == "MOEKIT_SUCCESS");
  CHECK(std::string(moekit_status_string(MOEKIT_STATUS_INVALID_VALUE)) == "MOEKIT_STATUS_INVALID_VALUE");
  CHECK(std::string(moekit_status_string(MOEKIT_STATUS_VALIDATION_FAILED)) == "MOEKIT_STATUS_VALIDATION_FAILED");
  CHECK(std::string(moekit_status_string(MOEKIT_STATUS_NOT_SUPPORTED)) == "MOEKIT_STATUS_NOT_SUPPORTED");
  CHECK(std::string(moekit_status_string(MOEKIT_STATUS_INSUFFICIENT_WORKSPACE)) ==
        "MOEKIT_STATUS_INSUFFICIENT_WORKSPACE");
  CHECK(std::string(moekit_status_string(MOEKIT_STATUS_OUT_OF_MEMORY)) == "MOEKIT_STATUS_OUT_OF_MEMORY");
  CHECK(std::string(moekit_status_string(MOEKIT_STATUS_EXECUTION_FAILED)) == "MOEKIT_STATUS_EXECUTION_FAILED");
  CHECK(std::string(moekit_status_string(MOEKIT_STATUS_INTERNAL_ERROR)) == "MOEKIT_STATUS_INTERNAL_ERROR");
  CHECK(std::string(moekit_status_string(static_cast<moekit_status_t>(123))) == "unknown status");
}

TEST_CASE("the last error is per thread and outlives later successful calls", "[capi]") {
  std::string main_message = fail_with_null_plan();
  REQUIRE_THAT(main_message, Catch::StartsWith("plan:"));

  std::string fresh_thread_message = "not run", other_thread_message;
  std::thread fresh([&] { fresh_thread_message = moekit_test::last_error(); });
  fresh.join();
  CHECK(fresh_thread_message.empty());

  std::thread other([&] {
    moekit_handle_desc_t desc;
    moekit_handle_desc_init(&desc);
    desc.backend = 42;
    moekit_handle_t handle = nullptr;
    moekit_handle_create(&desc, &handle);
    other_thread_message = moekit_test::last_error();
  });
  other.join();
  CHECK_THAT(other_thread_message, Catch::StartsWith("backend:"));
  CHECK(moekit_test::last_error() == main_message);

  // A successful call leaves the message of the last failure in place.
  moekit_handle_desc_t desc;
  REQUIRE(moekit_handle_desc_init(&desc) == MOEKIT_SUCCESS);
  CHECK(moekit_test::last_error() == main_message);
}

TEST_CASE("get_last_error truncates to the buffer, NUL-terminates, and returns the full length", "[capi]") {
  std::string message = fail_with_null_plan();
  REQUIRE(message.size() > 8);
  CHECK(moekit_get_last_error(nullptr, 0) == message.size());

  char small[6];
  std::memset(small, 'z', sizeof small);
  CHECK(moekit_get_last_error(small, sizeof small) == message.size());
  CHECK(std::string(small) == message.substr(0, 5));

  char one = 'z';
  CHECK(moekit_get_last_error(&one, 1) == message.size());
  CHECK(one == '\0');

  std::vector<char> exact(message.size() + 1, 'z');
  CHECK(moekit_get_last_error(exact.data(), exact.size()) == message.size());
  CHECK(std::string(exact.data()) == message);
}

TEST_CASE("destroying NULL handles and plans is a no-op", "[capi]") {
  CHECK(moekit_handle_destroy(nullptr) == MOEKIT_SUCCESS);
  CHECK(moekit_plan_destroy(nullptr) == MOEKIT_SUCCESS);
}

TEST_CASE("descriptor init functions set struct_size and the documented defaults", "[capi]") {
  moekit_handle_desc_t handle;
  scribble(&handle);
  REQUIRE(moekit_handle_desc_init(&handle) == MOEKIT_SUCCESS);
  CHECK(handle.struct_size == sizeof handle);
  CHECK(handle.backend == MOEKIT_BACKEND_REFERENCE);
  CHECK(handle.device_index == 0);
  CHECK(handle.flags == 0);
  CHECK(handle.num_threads == 0);

  moekit_router_desc_t router;
  scribble(&router);
  REQUIRE(moekit_router_desc_init(&router) == MOEKIT_SUCCESS);
  CHECK(router.struct_size == sizeof router);
  CHECK(router.kind == MOEKIT_ROUTER_SOFTMAX_TOPK);
  CHECK(router.renormalize == 0);
  CHECK(router.scale == 1.0);
  CHECK(router.dtype == MOEKIT_DTYPE_BF16);

  moekit_dispatch_desc_t dispatch;
  scribble(&dispatch);
  REQUIRE(moekit_dispatch_desc_init(&dispatch) == MOEKIT_SUCCESS);
  CHECK(dispatch.struct_size == sizeof dispatch);
  CHECK(dispatch.expert_begin == 0);

  moekit_gemm_desc_t gemm;
  scribble(&gemm);
  REQUIRE(moekit_gemm_desc_init(&gemm) == MOEKIT_SUCCESS);
  CHECK(gemm.struct_size == sizeof gemm);
  CHECK(gemm.mode == MOEKIT_GEMM_VARLEN_M);
  CHECK(gemm.b_layout == MOEKIT_GEMM_B_NK);
  CHECK(gemm.gather == MOEKIT_GEMM_GATHER_NONE);
  CHECK(gemm.epilogue == MOEKIT_EPILOGUE_STORE);
  CHECK(gemm.glu_layout == MOEKIT_GLU_CONCAT);
  CHECK(gemm.glu_limit == 7.0);
  CHECK(gemm.dtype == MOEKIT_DTYPE_BF16);
  CHECK(gemm.out_dtype == MOEKIT_DTYPE_INVALID);  // = dtype

  moekit_combine_desc_t combine;
  scribble(&combine);
  REQUIRE(moekit_combine_desc_init(&combine) == MOEKIT_SUCCESS);
  CHECK(combine.struct_size == sizeof combine);
  CHECK(combine.dtype == MOEKIT_DTYPE_BF16);

  moekit_bias_grad_desc_t bias_grad;
  scribble(&bias_grad);
  REQUIRE(moekit_bias_grad_desc_init(&bias_grad) == MOEKIT_SUCCESS);
  CHECK(bias_grad.struct_size == sizeof bias_grad);
  CHECK(bias_grad.dtype == MOEKIT_DTYPE_BF16);
  CHECK(bias_grad.out_dtype == MOEKIT_DTYPE_INVALID);

  moekit_sparse_ffn_desc_t ffn;
  scribble(&ffn);
  REQUIRE(moekit_sparse_ffn_desc_init(&ffn) == MOEKIT_SUCCESS);
  CHECK(ffn.struct_size == sizeof ffn);
  CHECK(ffn.subsample == 0);
  CHECK(ffn.dtype == MOEKIT_DTYPE_BF16);
  CHECK(ffn.inference == 0);
  CHECK(ffn.weight_grad_dtype == MOEKIT_DTYPE_INVALID);

  moekit_moe_desc_t moe;
  scribble(&moe);
  REQUIRE(moekit_moe_desc_init(&moe) == MOEKIT_SUCCESS);
  CHECK(moe.struct_size == sizeof moe);
  CHECK(moe.expert_begin == 0);
  CHECK(moe.activation == MOEKIT_ACT_SWIGLU);
  CHECK(moe.glu_layout == MOEKIT_GLU_CONCAT);
  CHECK(moe.glu_limit == 7.0);
  CHECK(moe.router == MOEKIT_ROUTER_SOFTMAX_TOPK);
  CHECK(moe.renormalize == 0);
  CHECK(moe.router_scale == 1.0);
  CHECK(moe.has_b1 == 0);
  CHECK(moe.has_b2 == 0);
  CHECK(moe.inference == 0);
  CHECK(moe.dtype == MOEKIT_DTYPE_BF16);
  CHECK(moe.weight_grad_dtype == MOEKIT_DTYPE_INVALID);
}

TEST_CASE("argument init functions zero every tensor and set the documented scalars", "[capi]") {
  moekit_router_fwd_args_t router_fwd;
  scribble(&router_fwd);
  REQUIRE(moekit_router_fwd_args_init(&router_fwd) == MOEKIT_SUCCESS);
  CHECK(router_fwd.struct_size == sizeof router_fwd);
  CHECK((is_absent(router_fwd.logits) && is_absent(router_fwd.bias) && is_absent(router_fwd.counts)));

  moekit_router_bwd_args_t router_bwd;
  scribble(&router_bwd);
  REQUIRE(moekit_router_bwd_args_init(&router_bwd) == MOEKIT_SUCCESS);
  CHECK(router_bwd.struct_size == sizeof router_bwd);
  CHECK(router_bwd.accumulate == 0);
  CHECK(is_absent(router_bwd.dlogits));

  moekit_dispatch_args_t dispatch;
  scribble(&dispatch);
  REQUIRE(moekit_dispatch_args_init(&dispatch) == MOEKIT_SUCCESS);
  CHECK(dispatch.struct_size == sizeof dispatch);
  CHECK((is_absent(dispatch.tok_offsets) && is_absent(dispatch.grouped_pos)));

  moekit_gemm_args_t gemm;
  scribble(&gemm);
  REQUIRE(moekit_gemm_args_init(&gemm) == MOEKIT_SUCCESS);
  CHECK(gemm.struct_size == sizeof gemm);
  CHECK(gemm.alpha == 1.0);
  CHECK(gemm.beta == 0.0);
  CHECK((is_absent(gemm.gather_idx) && is_absent(gemm.bias) && is_absent(gemm.dscores)));

  moekit_combine_args_t combine;
  scribble(&combine);
  REQUIRE(moekit_combine_args_init(&combine) == MOEKIT_SUCCESS);
  CHECK(combine.struct_size == sizeof combine);
  CHECK(combine.beta == 0.0);
  CHECK(is_absent(combine.scores));

  moekit_db1_args_t db1;
  scribble(&db1);
  REQUIRE(moekit_db1_args_init(&db1) == MOEKIT_SUCCESS);
  CHECK(db1.struct_size == sizeof db1);
  CHECK(db1.beta == 0.0);

  moekit_db2_ds_args_t db2;
  scribble(&db2);
  REQUIRE(moekit_db2_ds_args_init(&db2) == MOEKIT_SUCCESS);
  CHECK(db2.struct_size == sizeof db2);
  CHECK((is_absent(db2.b2) && is_absent(db2.db2) && db2.beta == 0.0));

  moekit_group_select_args_t select;
  scribble(&select);
  REQUIRE(moekit_group_select_args_init(&select) == MOEKIT_SUCCESS);
  CHECK(select.struct_size == sizeof select);
  CHECK((is_absent(select.subsample_rows) && is_absent(select.lb_bias) && is_absent(select.counts)));

  moekit_load_balance_args_t lb;
  scribble(&lb);
  REQUIRE(moekit_load_balance_args_init(&lb) == MOEKIT_SUCCESS);
  CHECK(lb.struct_size == sizeof lb);
  CHECK(lb.momentum == 0.99);
  CHECK(lb.gamma == 1e-3);
  CHECK(lb.bias_max == 0.5);
  CHECK(is_absent(lb.counts));

  moekit_moe_fwd_args_t moe_fwd;
  scribble(&moe_fwd);
  REQUIRE(moekit_moe_fwd_args_init(&moe_fwd) == MOEKIT_SUCCESS);
  CHECK(moe_fwd.struct_size == sizeof moe_fwd);
  CHECK(moe_fwd.beta_out == 0.0);
  CHECK((is_absent(moe_fwd.router_bias) && is_absent(moe_fwd.b1) && is_absent(moe_fwd.scores)));

  moekit_moe_bwd_args_t moe_bwd;
  scribble(&moe_bwd);
  REQUIRE(moekit_moe_bwd_args_init(&moe_bwd) == MOEKIT_SUCCESS);
  CHECK(moe_bwd.struct_size == sizeof moe_bwd);
  CHECK(moe_bwd.compute_input_grad == 1);
  CHECK(moe_bwd.compute_weight_grad == 1);
  CHECK((moe_bwd.beta_dx == 0.0 && moe_bwd.beta_dw_router == 0.0 && moe_bwd.beta_dw1 == 0.0 &&
         moe_bwd.beta_db1 == 0.0 && moe_bwd.beta_dw2 == 0.0 && moe_bwd.beta_db2 == 0.0));
  CHECK(is_absent(moe_bwd.db1));

  moekit_experts_fwd_args_t experts_fwd;
  scribble(&experts_fwd);
  REQUIRE(moekit_experts_fwd_args_init(&experts_fwd) == MOEKIT_SUCCESS);
  CHECK(experts_fwd.struct_size == sizeof experts_fwd);
  CHECK(is_absent(experts_fwd.b2));

  moekit_experts_bwd_args_t experts_bwd;
  scribble(&experts_bwd);
  REQUIRE(moekit_experts_bwd_args_init(&experts_bwd) == MOEKIT_SUCCESS);
  CHECK(experts_bwd.struct_size == sizeof experts_bwd);
  CHECK((experts_bwd.compute_input_grad == 1 && experts_bwd.compute_weight_grad == 1));
  CHECK((experts_bwd.beta_dx == 0.0 && experts_bwd.beta_db2 == 0.0));

  moekit_token_experts_fwd_args_t token_fwd;
  scribble(&token_fwd);
  REQUIRE(moekit_token_experts_fwd_args_init(&token_fwd) == MOEKIT_SUCCESS);
  CHECK(token_fwd.struct_size == sizeof token_fwd);
  CHECK((token_fwd.beta_out == 0.0 && is_absent(token_fwd.b1) && is_absent(token_fwd.b2)));

  moekit_token_experts_bwd_args_t token_bwd;
  scribble(&token_bwd);
  REQUIRE(moekit_token_experts_bwd_args_init(&token_bwd) == MOEKIT_SUCCESS);
  CHECK(token_bwd.struct_size == sizeof token_bwd);
  CHECK((token_bwd.compute_input_grad == 1 && token_bwd.compute_weight_grad == 1));
  CHECK((token_bwd.beta_dx == 0.0 && token_bwd.beta_dw1 == 0.0 && token_bwd.beta_db2 == 0.0));
  CHECK((is_absent(token_bwd.dtopk_weights) && is_absent(token_bwd.b2)));

  moekit_sparse_ffn_fwd_args_t ffn_fwd;
  scribble(&ffn_fwd);
  REQUIRE(moekit_sparse_ffn_fwd_args_init(&ffn_fwd) == MOEKIT_SUCCESS);
  CHECK(ffn_fwd.struct_size == sizeof ffn_fwd);
  CHECK((ffn_fwd.beta_out == 0.0 && is_absent(ffn_fwd.groups)));

  moekit_sparse_ffn_bwd_args_t ffn_bwd;
  scribble(&ffn_bwd);
  REQUIRE(moekit_sparse_ffn_bwd_args_init(&ffn_bwd) == MOEKIT_SUCCESS);
  CHECK(ffn_bwd.struct_size == sizeof ffn_bwd);
  CHECK((ffn_bwd.compute_input_grad == 1 && ffn_bwd.compute_weight_grad == 1));
  CHECK((ffn_bwd.beta_dx == 0.0 && ffn_bwd.beta_dw_down == 0.0));
}

TEST_CASE("tensor_make gives contiguous row-major strides and never fails", "[capi]") {
  float data[24];
  int64_t shape[3] = {2, 3, 4};
  moekit_device_t cpu{MOEKIT_DEVICE_CPU, 0};
  moekit_tensor_t t = moekit_tensor_make(data, MOEKIT_DTYPE_FP32, 3, shape, cpu);
  CHECK(t.data == data);
  CHECK(t.dtype == MOEKIT_DTYPE_FP32);
  CHECK(t.rank == 3);
  CHECK((t.shape[0] == 2 && t.shape[1] == 3 && t.shape[2] == 4));
  CHECK((t.stride[0] == 12 && t.stride[1] == 4 && t.stride[2] == 1));
  CHECK((t.reserved[0] == 0 && t.reserved[1] == 0));
  CHECK((t.device.type == MOEKIT_DEVICE_CPU && t.device.index == 0));

  moekit_tensor_t scalar = moekit_tensor_make(data, MOEKIT_DTYPE_FP32, 0, nullptr, cpu);
  CHECK(scalar.rank == 0);
  moekit_tensor_t too_many = moekit_tensor_make(data, MOEKIT_DTYPE_FP32, 9, nullptr, cpu);
  CHECK(too_many.rank == 9);  // kept, so validation reports it

  // A shape whose product does not fit int64 saturates the strides (validation then rejects them), never wraps.
  int64_t huge[3] = {3, 5, int64_t{1} << 62};
  moekit_tensor_t wide = moekit_tensor_make(data, MOEKIT_DTYPE_FP32, 3, huge, cpu);
  CHECK((wide.stride[2] == 1 && wide.stride[1] == int64_t{1} << 62));
  CHECK(wide.stride[0] == std::numeric_limits<int64_t>::max());
}

TEST_CASE("plan size queries: building blocks and inference layers save nothing, training layers do", "[capi]") {
  moekit_handle_desc_t hd;
  moekit_handle_desc_init(&hd);
  moekit_handle_t handle = nullptr;
  MOEKIT_REQUIRE_OK(moekit_handle_create(&hd, &handle));

  moekit_router_desc_t rd;
  moekit_router_desc_init(&rd);
  rd.max_tokens = 16;
  rd.experts = 8;
  rd.top_k = 2;
  moekit_plan_t router = nullptr;
  MOEKIT_REQUIRE_OK(moekit_router_plan_create(handle, &rd, &router));
  size_t saved = 99, workspace = 99;
  MOEKIT_REQUIRE_OK(moekit_plan_saved_size(router, &saved));
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(router, &workspace));
  CHECK(saved == 0);
  CHECK(workspace == 0);  // the reference backend needs no scratch memory

  moekit_moe_desc_t md;
  moekit_moe_desc_init(&md);
  md.max_tokens = 16;
  md.hidden = 32;
  md.intermediate = 16;
  md.router_experts = md.experts = 4;
  md.top_k = 2;
  moekit_plan_t training = nullptr, inference = nullptr, twice = nullptr;
  MOEKIT_REQUIRE_OK(moekit_moe_plan_create(handle, &md, &training));
  MOEKIT_REQUIRE_OK(moekit_moe_plan_create(handle, &md, &twice));
  md.inference = 1;
  MOEKIT_REQUIRE_OK(moekit_moe_plan_create(handle, &md, &inference));
  size_t training_saved = 0, twice_saved = 0, inference_saved = 99;
  MOEKIT_REQUIRE_OK(moekit_plan_saved_size(training, &training_saved));
  MOEKIT_REQUIRE_OK(moekit_plan_saved_size(twice, &twice_saved));
  MOEKIT_REQUIRE_OK(moekit_plan_saved_size(inference, &inference_saved));
  CHECK(training_saved > 0);
  CHECK(twice_saved == training_saved);  // sizes depend on the descriptor only
  CHECK(inference_saved == 0);

  for (moekit_plan_t plan : {router, training, inference, twice}) moekit_plan_destroy(plan);
  moekit_handle_destroy(handle);
}
