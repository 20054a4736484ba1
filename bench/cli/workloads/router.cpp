// router_forward: scores, indices and counts from random logits [T, E]. router_backward: dlogits from the
// forward's logits and indices (real routing, routing.h) and random score gradients. Memory-bound.
#include "workloads/workloads.h"

namespace moekit_bench {
namespace {

class RouterWorkload final : public Workload {
 public:
  RouterWorkload(const CaseConfig& config, const Shape& shape) : Workload(config, shape) {}

  moekit_status_t create_plan(moekit_handle_t handle) override {
    moekit_router_desc_t desc;
    moekit_router_desc_init(&desc);
    desc.max_tokens = shape_.tokens;
    desc.experts = shape_.experts;
    desc.top_k = shape_.top_k;
    desc.kind = config_.router;
    desc.renormalize = config_.renormalize;
    desc.scale = config_.router_scale;
    desc.dtype = config_.dtype;
    const moekit_status_t status = moekit_router_plan_create(handle, &desc, &plan_);
    if (status != MOEKIT_SUCCESS) return status;

    const int64_t T = shape_.tokens, E = shape_.experts, K = shape_.top_k;
    if (config_.op == Op::router_forward) {
      logits_ = add(spec("logits", config_.dtype, {T, E}, Access::read, 1.0f));
      scores_ = add(spec("scores", MOEKIT_DTYPE_FP32, {T, K}, Access::write, 0.0f, Compare::values));
      indices_ = add(spec("indices", MOEKIT_DTYPE_INT32, {T, K}, Access::write, 0.0f, Compare::exact));
      counts_ = add(spec("counts", MOEKIT_DTYPE_INT32, {E}, Access::write, 0.0f, Compare::exact));
    } else {
      const Routing& routing = this->routing();
      logits_ = add(given("logits", config_.dtype, {T, E}, host_bytes(routing.logits)));
      indices_ = add(given("indices", MOEKIT_DTYPE_INT32, {T, K}, host_bytes(routing.indices)));
      dscores_ = add(spec("dscores", MOEKIT_DTYPE_FP32, {T, K}, Access::read, 1.0f));
      dlogits_ = add(spec("dlogits", config_.dtype, {T, E}, Access::write, 0.0f, Compare::values));
    }
    return MOEKIT_SUCCESS;
  }

  void bind_sets(const std::vector<const TensorSet*>& sets) override {
    for (const TensorSet* s : sets) {
      if (config_.op == Op::router_forward) {
        moekit_router_fwd_args_t a;
        moekit_router_fwd_args_init(&a);
        a.logits = s->view(logits_);
        a.scores = s->view(scores_);
        a.indices = s->view(indices_);
        a.counts = s->view(counts_);
        fwd_.push_back(a);
      } else {
        moekit_router_bwd_args_t a;
        moekit_router_bwd_args_init(&a);
        a.logits = s->view(logits_);
        a.indices = s->view(indices_);
        a.dscores = s->view(dscores_);
        a.dlogits = s->view(dlogits_);
        bwd_.push_back(a);
      }
    }
  }

  std::string step_name(int) const override { return config_.op_name; }

  moekit_status_t run_step(int, int set, void* stream) override {
    return config_.op == Op::router_forward
               ? moekit_router_forward(plan_, &fwd_[set], workspace_, workspace_bytes_, stream)
               : moekit_router_backward(plan_, &bwd_[set], workspace_, workspace_bytes_, stream);
  }

  WorkModel model() const override { return memory_bound_model(); }

 private:
  size_t logits_ = 0, scores_ = 0, indices_ = 0, counts_ = 0, dscores_ = 0, dlogits_ = 0;
  std::vector<moekit_router_fwd_args_t> fwd_;
  std::vector<moekit_router_bwd_args_t> bwd_;
};

}  // namespace

std::unique_ptr<Workload> make_router_workload(const CaseConfig& config, const Shape& shape) {
  return std::make_unique<RouterWorkload>(config, shape);
}

}  // namespace moekit_bench
