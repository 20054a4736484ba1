// moe_forward / moe_backward / moe_forward_backward: the whole MoE layer (docs/math.md sections 3 and 4) on random bf16
// x and weights, routed by the layer's own router on the logits x Wr^T. A forward is timed from the router GEMM
// through the combine; a backward as t(forward + backward) - t(forward). Model FLOPs are the expert GEMMs' only
// (as SonicMoE counts them): forward 6*T*K*H*I for a gated activation (4*T*K*H*I otherwise), backward twice that.
#include <cmath>
#include <optional>

#include "workloads/workloads.h"
#include "cuda/common/activation_kind.h"

namespace moekit_bench {
namespace {

class MoeLayerWorkload final : public Workload {
 public:
  MoeLayerWorkload(const CaseConfig& config, const Shape& shape) : Workload(config, shape) {}

  moekit_status_t create_plan(moekit_handle_t handle) override {
    const int64_t T = shape_.tokens, H = shape_.hidden, I = shape_.intermediate, E = shape_.experts, K = shape_.top_k;
    const int64_t I1 = moekit::is_gated_activation(config_.activation) ? 2 * I : I;  // rows of W1 per expert
    const moekit_dtype_t dtype = config_.dtype, grad_dtype = or_dtype(config_.weight_grad_dtype, dtype);
    moekit_moe_desc_t desc;
    moekit_moe_desc_init(&desc);
    desc.max_tokens = T;
    desc.hidden = H;
    desc.intermediate = I;
    desc.router_experts = E;
    desc.experts = E;
    desc.top_k = K;
    desc.activation = config_.activation;
    desc.glu_layout = config_.glu_layout;
    desc.router = config_.router;
    desc.renormalize = config_.renormalize;
    desc.router_scale = config_.router_scale;
    desc.has_b1 = config_.has_b1;
    desc.has_b2 = config_.has_b2;
    desc.dtype = dtype;
    desc.weight_grad_dtype = config_.weight_grad_dtype;
    const moekit_status_t status = moekit_moe_plan_create(handle, &desc, &plan_);
    if (status != MOEKIT_SUCCESS) return status;

    const float h_scale = 1.0f / std::sqrt(static_cast<float>(H)), i_scale = 1.0f / std::sqrt(static_cast<float>(I));
    x_ = add(spec("x", dtype, {T, H}, Access::read, 1.0f));
    w_router_ = add(spec("w_router", dtype, {E, H}, Access::read, h_scale));
    w1_ = add(spec("w1", dtype, {E, I1, H}, Access::read, h_scale));
    w2_ = add(spec("w2", dtype, {E, H, I}, Access::read, i_scale));
    if (config_.has_b1) b1_ = add(spec("b1", dtype, {E, I1}, Access::read, 0.1f));
    if (config_.has_b2) b2_ = add(spec("b2", dtype, {E, H}, Access::read, 0.1f));
    out_ = add(spec("out", dtype, {T, H}, Access::write, 0.0f, Compare::values));
    specs_[out_].rows_keyed_on = "indices";
    indices_ = add(spec("indices", MOEKIT_DTYPE_INT32, {T, K}, Access::write, 0.0f, Compare::selection));
    forward_bytes_ = bytes_of({x_, w_router_, w1_, w2_, out_, indices_}) + bytes_of({b1_, b2_});
    saved_ = add_saved_buffer(Access::write);
    forward_bytes_ += bytes_of({saved_});
    if (config_.op == Op::moe_forward) return MOEKIT_SUCCESS;

    dout_ = add(spec("dout", dtype, {T, H}, Access::read, 1.0f));
    dx_ = add(spec("dx", dtype, {T, H}, Access::write, 0.0f, Compare::values));
    specs_[dx_].rows_keyed_on = "indices";
    dw_router_ = add(spec("dw_router", grad_dtype, {E, H}, Access::write, 0.0f, Compare::values));
    dw1_ = add(spec("dw1", grad_dtype, {E, I1, H}, Access::write, 0.0f, Compare::values));
    dw2_ = add(spec("dw2", grad_dtype, {E, H, I}, Access::write, 0.0f, Compare::values));
    if (config_.has_b1) db1_ = add(spec("db1", grad_dtype, {E, I1}, Access::write, 0.0f, Compare::values));
    if (config_.has_b2) db2_ = add(spec("db2", grad_dtype, {E, H}, Access::write, 0.0f, Compare::values));
    backward_bytes_ = bytes_of({x_, dout_, w_router_, w1_, w2_, dx_, dw_router_, dw1_, dw2_}) +
                      bytes_of({b2_, db1_, db2_, saved_});
    return MOEKIT_SUCCESS;
  }

  void bind_sets(const std::vector<const TensorSet*>& sets) override {
    for (const TensorSet* s : sets) {
      moekit_moe_fwd_args_t f;
      moekit_moe_fwd_args_init(&f);
      f.x = s->view(x_);
      f.w_router = s->view(w_router_);
      f.w1 = s->view(w1_);
      f.w2 = s->view(w2_);
      if (b1_) f.b1 = s->view(*b1_);
      if (b2_) f.b2 = s->view(*b2_);
      f.out = s->view(out_);
      f.indices = s->view(indices_);
      fwd_.push_back(f);
      saved_data_.push_back(saved_ ? s->data(*saved_) : nullptr);
      if (config_.op == Op::moe_forward) continue;
      moekit_moe_bwd_args_t b;
      moekit_moe_bwd_args_init(&b);
      b.x = f.x;
      b.dout = s->view(dout_);
      b.w_router = f.w_router;
      b.w1 = f.w1;
      b.w2 = f.w2;
      if (b2_) b.b2 = f.b2;
      b.dx = s->view(dx_);
      b.dw_router = s->view(dw_router_);
      b.dw1 = s->view(dw1_);
      b.dw2 = s->view(dw2_);
      if (db1_) b.db1 = s->view(*db1_);
      if (db2_) b.db2 = s->view(*db2_);
      bwd_.push_back(b);
    }
  }

  int steps() const override { return config_.op == Op::moe_forward ? 1 : 2; }
  std::vector<int> subtracted_steps() const override {
    return config_.op == Op::moe_backward ? std::vector<int>{0} : std::vector<int>{};
  }
  std::string step_name(int step) const override { return step == 0 ? "moe_forward" : "moe_backward"; }

  moekit_status_t run_step(int step, int set, void* stream) override {
    const size_t saved_bytes = saved_ ? specs_[*saved_].bytes() : 0;
    if (step == 0)
      return moekit_moe_forward(plan_, &fwd_[set], saved_data_[set], saved_bytes, workspace_, workspace_bytes_,
                                stream);
    return moekit_moe_backward(plan_, &bwd_[set], saved_data_[set], saved_bytes, workspace_, workspace_bytes_, stream);
  }

  double bytes() const override {
    switch (config_.op) {
      case Op::moe_forward: return forward_bytes_;
      case Op::moe_backward: return backward_bytes_;
      default: return forward_bytes_ + backward_bytes_;
    }
  }

  WorkModel model() const override {
    const int64_t P = shape_.tokens * shape_.top_k, H = shape_.hidden, I = shape_.intermediate;
    const int64_t I1 = moekit::is_gated_activation(config_.activation) ? 2 * I : I;
    const std::vector<DenseGemm> forward = {{P, I1, H}, {P, H, I}};
    // dA = dout W2 [P, I], dW2 [H, I] over P rows, dxe = dh W1 [P, H], dW1 [I1, H] over P rows.
    const std::vector<DenseGemm> backward = {{P, I, H}, {H, I, P}, {P, H, I1}, {I1, H, P}};
    WorkModel m;
    if (config_.op != Op::moe_backward) m.dense = forward;
    if (config_.op != Op::moe_forward) m.dense.insert(m.dense.end(), backward.begin(), backward.end());
    for (const DenseGemm& g : m.dense) m.flops += g.flops();
    m.flop_convention = std::string("expert GEMMs only: forward ") +
                        (I1 == 2 * I ? "6" : "4") + "*T*K*H*I, backward twice that; router GEMM, router, dispatch, " +
                        "activation and combine not counted";
    m.baseline_description = "cuBLASLt dense bf16 GEMMs of the expert GEMMs' shapes (P = T*K rows), one after another";
    return m;
  }

 private:
  size_t x_ = 0, w_router_ = 0, w1_ = 0, w2_ = 0, out_ = 0, indices_ = 0;
  size_t dout_ = 0, dx_ = 0, dw_router_ = 0, dw1_ = 0, dw2_ = 0;
  std::optional<size_t> b1_, b2_, db1_, db2_, saved_;
  double forward_bytes_ = 0, backward_bytes_ = 0;
  std::vector<moekit_moe_fwd_args_t> fwd_;
  std::vector<moekit_moe_bwd_args_t> bwd_;
  std::vector<void*> saved_data_;
};

}  // namespace

std::unique_ptr<Workload> make_moe_layer_workload(const CaseConfig& config, const Shape& shape) {
  return std::make_unique<MoeLayerWorkload>(config, shape);
}

}  // namespace moekit_bench
