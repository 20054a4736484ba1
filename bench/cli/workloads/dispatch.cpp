// dispatch: the deterministic CSR (expert offsets, gather/pair indices, grouped positions) of the router's indices
// on random logits. Memory-bound; every output is an integer that must match the reference exactly.
#include "workloads/workloads.h"

namespace moekit_bench {
namespace {

class DispatchWorkload final : public Workload {
 public:
  DispatchWorkload(const CaseConfig& config, const Shape& shape) : Workload(config, shape) {}

  moekit_status_t create_plan(moekit_handle_t handle) override {
    const int64_t T = shape_.tokens, E = shape_.experts, K = shape_.top_k, P = T * K;
    moekit_dispatch_desc_t desc;
    moekit_dispatch_desc_init(&desc);
    desc.max_tokens = T;
    desc.top_k = K;
    desc.experts = E;
    const moekit_status_t status = moekit_dispatch_plan_create(handle, &desc, &plan_);
    if (status != MOEKIT_SUCCESS) return status;
    const Routing& routing = this->routing();
    indices_ = add(given("indices", MOEKIT_DTYPE_INT32, {T, K}, host_bytes(routing.indices)));
    offsets_ = add(spec("expert_offsets", MOEKIT_DTYPE_INT32, {E + 1}, Access::write, 0.0f, Compare::exact));
    gather_ = add(spec("gather_idx", MOEKIT_DTYPE_INT32, {P}, Access::write, 0.0f, Compare::exact));
    pair_ = add(spec("pair_idx", MOEKIT_DTYPE_INT32, {P}, Access::write, 0.0f, Compare::exact));
    pos_ = add(spec("grouped_pos", MOEKIT_DTYPE_INT32, {P}, Access::write, 0.0f, Compare::exact));
    return MOEKIT_SUCCESS;
  }

  void bind_sets(const std::vector<const TensorSet*>& sets) override {
    for (const TensorSet* s : sets) {
      moekit_dispatch_args_t a;
      moekit_dispatch_args_init(&a);
      a.indices = s->view(indices_);
      a.expert_offsets = s->view(offsets_);
      a.gather_idx = s->view(gather_);
      a.pair_idx = s->view(pair_);
      a.grouped_pos = s->view(pos_);
      args_.push_back(a);
    }
  }

  std::string step_name(int) const override { return "dispatch"; }
  moekit_status_t run_step(int, int set, void* stream) override {
    return moekit_dispatch(plan_, &args_[set], workspace_, workspace_bytes_, stream);
  }
  WorkModel model() const override { return memory_bound_model(); }

 private:
  size_t indices_ = 0, offsets_ = 0, gather_ = 0, pair_ = 0, pos_ = 0;
  std::vector<moekit_dispatch_args_t> args_;
};

}  // namespace

std::unique_ptr<Workload> make_dispatch_workload(const CaseConfig& config, const Shape& shape) {
  return std::make_unique<DispatchWorkload>(config, shape);
}

}  // namespace moekit_bench
