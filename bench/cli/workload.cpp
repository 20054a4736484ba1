#include "workload.h"

#include <numeric>

namespace moekit_bench {

Workload::~Workload() { moekit_plan_destroy(plan_); }

size_t Workload::workspace_bytes() const {
  size_t bytes = 0;
  check_call(moekit_plan_workspace_size(plan_, &bytes), "moekit_plan_workspace_size");
  return bytes;
}

size_t Workload::saved_bytes() const {
  size_t bytes = 0;
  check_call(moekit_plan_saved_size(plan_, &bytes), "moekit_plan_saved_size");
  return bytes;
}

std::vector<int> Workload::timed_steps() const {
  std::vector<int> all(static_cast<size_t>(steps()));
  std::iota(all.begin(), all.end(), 0);
  return all;
}

double Workload::bytes() const {
  double total = 0;
  for (const TensorSpec& s : specs_) {
    const double b = static_cast<double>(s.bytes());
    if (s.access == Access::read || s.access == Access::write) total += b;
    if (s.access == Access::read_write) total += 2 * b;
  }
  return total;
}

std::optional<size_t> Workload::add_saved_buffer(Access access) {
  const size_t bytes = saved_bytes();
  if (bytes == 0) return std::nullopt;
  TensorSpec saved;
  saved.name = "saved";
  saved.shape = {static_cast<int64_t>(bytes)};
  saved.access = access;
  return add(saved);
}

double Workload::bytes_of(std::initializer_list<std::optional<size_t>> tensors) const {
  double total = 0;
  for (const auto& t : tensors)
    if (t) total += static_cast<double>(specs_[*t].bytes());
  return total;
}

const Routing& Workload::routing() {
  if (routing_ == nullptr)
    routing_ = &routing_for(shape_.tokens, shape_.experts, shape_.top_k, config_.dtype, config_.seed, config_.routing);
  return *routing_;
}

size_t Workload::add(TensorSpec spec) {
  specs_.push_back(std::move(spec));
  return specs_.size() - 1;
}

}  // namespace moekit_bench
