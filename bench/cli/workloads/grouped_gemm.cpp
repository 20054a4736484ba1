// gemm: one grouped GEMM (docs/math.md section 5) over the P = T*K grouped rows of real routing (routing.h), in the
// mode, gather, B layout and epilogue the case names. Model FLOPs 2*P*N*K where N is the product's width (n/2 for a
// DGATED epilogue of a gated activation, whose product dA is as wide as a); the baseline is one dense cuBLASLt GEMM
// of the same FLOPs. With a nonzero `beta` (STORE/BIAS, varlen K) C starts as random data and the call accumulates
// into it, so C counts as read and written.
#include <cmath>
#include <optional>

#include "workloads/workloads.h"
#include "cuda/common/activation_kind.h"

namespace moekit_bench {
namespace {

class GroupedGemmWorkload final : public Workload {
 public:
  GroupedGemmWorkload(const CaseConfig& config, const Shape& shape) : Workload(config, shape) {}

  moekit_status_t create_plan(moekit_handle_t handle) override {
    const int64_t T = shape_.tokens, E = shape_.experts, K = shape_.top_k, P = T * K, n = shape_.n, k = shape_.k;
    const moekit_dtype_t dtype = config_.dtype;
    moekit_gemm_desc_t desc;
    moekit_gemm_desc_init(&desc);
    desc.mode = config_.mode;
    desc.b_layout = config_.b_layout;
    desc.gather = config_.gather;
    desc.epilogue = config_.epilogue;
    desc.activation = config_.activation;
    desc.glu_layout = config_.glu_layout;
    desc.groups = E;
    desc.max_rows = P;
    desc.gather_rows = T;
    desc.n = n;
    desc.k = k;
    desc.dtype = dtype;
    desc.out_dtype = config_.out_dtype;
    const moekit_status_t status = moekit_gemm_plan_create(handle, &desc, &plan_);
    if (status != MOEKIT_SUCCESS) return status;

    const Routing& routing = this->routing();
    const moekit_dtype_t out_dtype = or_dtype(config_.out_dtype, dtype);
    const bool gather_a = config_.gather == MOEKIT_GEMM_GATHER_A, gather_b = config_.gather == MOEKIT_GEMM_GATHER_B;
    const Access c_access = config_.beta != 0 ? Access::read_write : Access::write;
    const float c_scale = config_.beta != 0 ? 1.0f : 0.0f;
    offsets_ = add(given("offsets", MOEKIT_DTYPE_INT32, {E + 1}, host_bytes(routing.expert_offsets)));
    if (gather_a || gather_b) gather_ = add(given("gather_idx", MOEKIT_DTYPE_INT32, {P}, host_bytes(routing.gather_idx)));

    if (config_.mode == MOEKIT_GEMM_VARLEN_K) {
      // C[e] [k, n] = A_e^T B_e over the expert's rows.
      a_ = add(spec("a", dtype, {gather_a ? T : P, k}, Access::read, 1.0f));
      b_ = add(spec("b", dtype, {gather_b ? T : P, n}, Access::read, 1.0f));
      c_ = add(spec("c", out_dtype, {E, k, n}, c_access, c_scale, Compare::values));
      product_ = {k, n, P};
      return MOEKIT_SUCCESS;
    }

    const bool activated = config_.epilogue == MOEKIT_EPILOGUE_GATED || config_.epilogue == MOEKIT_EPILOGUE_DGATED;
    const int64_t act_width = moekit::is_gated_activation(config_.activation) ? n / 2 : n;
    const int64_t product_n = config_.epilogue == MOEKIT_EPILOGUE_DGATED ? act_width : n;
    const float b_scale = 1.0f / std::sqrt(static_cast<float>(k));
    a_ = add(spec("a", dtype, {gather_a ? T : P, k}, Access::read, 1.0f));
    b_ = add(spec("b", dtype,
                  config_.b_layout == MOEKIT_GEMM_B_NK ? std::vector<int64_t>{E, product_n, k}
                                                       : std::vector<int64_t>{E, k, product_n},
                  Access::read, b_scale));
    if (config_.epilogue == MOEKIT_EPILOGUE_BIAS) bias_ = add(spec("bias", dtype, {E, n}, Access::read, 1.0f));
    if (config_.epilogue == MOEKIT_EPILOGUE_DGATED) {
      h_ = add(spec("h", dtype, {P, n}, Access::read, 1.0f));
      row_scale_ = add(given("row_scale", MOEKIT_DTYPE_FP32, {P}, host_bytes(routing.scores)));
      pair_ = add(given("pair_idx", MOEKIT_DTYPE_INT32, {P}, host_bytes(routing.pair_idx)));
      dscores_ = add(spec("dscores", MOEKIT_DTYPE_FP32, {P}, Access::write, 0.0f, Compare::values));
    }
    c_ = add(spec(activated ? (config_.epilogue == MOEKIT_EPILOGUE_GATED ? "h" : "dh") : "c",
                  activated ? dtype : out_dtype, {P, n}, c_access, c_scale, Compare::values));
    if (activated) act_ = add(spec(config_.epilogue == MOEKIT_EPILOGUE_GATED ? "a" : "a_scaled", dtype,
                                   {P, act_width}, Access::write, 0.0f, Compare::values));
    product_ = {P, product_n, k};
    return MOEKIT_SUCCESS;
  }

  void bind_sets(const std::vector<const TensorSet*>& sets) override {
    for (const TensorSet* s : sets) {
      moekit_gemm_args_t a;
      moekit_gemm_args_init(&a);
      a.a = s->view(a_);
      a.b = s->view(b_);
      a.offsets = s->view(offsets_);
      a.c = s->view(c_);
      a.beta = config_.beta;
      if (gather_) a.gather_idx = s->view(*gather_);
      if (bias_) a.bias = s->view(*bias_);
      if (act_) a.act = s->view(*act_);
      if (h_) {
        a.h = s->view(*h_);
        a.row_scale = s->view(*row_scale_);
        a.pair_idx = s->view(*pair_);
        a.dscores = s->view(*dscores_);
      }
      args_.push_back(a);
    }
  }

  std::string step_name(int) const override { return "gemm"; }
  moekit_status_t run_step(int, int set, void* stream) override {
    return moekit_gemm(plan_, &args_[set], workspace_, workspace_bytes_, stream);
  }

  WorkModel model() const override {
    WorkModel m;
    m.flops = product_.flops();
    m.dense = {product_};
    m.flop_convention = config_.mode == MOEKIT_GEMM_VARLEN_K
                            ? "2 * P * k * n (P = tokens * top_k grouped rows, every pair valid)"
                            : "2 * P * N * k (P = tokens * top_k grouped rows; N = n, or n/2 for DGATED of a gated "
                              "activation); epilogue work not counted";
    m.baseline_description = "cuBLASLt dense bf16 GEMM m=" + std::to_string(product_.m) +
                             " n=" + std::to_string(product_.n) + " k=" + std::to_string(product_.k);
    return m;
  }

 private:
  size_t offsets_ = 0, a_ = 0, b_ = 0, c_ = 0;
  std::optional<size_t> gather_, bias_, act_, h_, row_scale_, pair_, dscores_;
  DenseGemm product_{0, 0, 0};
  std::vector<moekit_gemm_args_t> args_;
};

}  // namespace

std::unique_ptr<Workload> make_grouped_gemm_workload(const CaseConfig& config, const Shape& shape) {
  return std::make_unique<GroupedGemmWorkload>(config, shape);
}

}  // namespace moekit_bench
