// A benchmark case made runnable: its plan, its tensors, the calls it times and the work they do. One class per
// operation family lives in workloads/; make_workload() picks it from the case's op.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "case_config.h"
#include "moekit/moekit.h"
#include "routing.h"
#include "tensor_set.h"

namespace moekit_bench {

// A dense bf16 GEMM C[m, n] = A[m, k] B[n, k]^T with fp32 accumulation: the unit of the cuBLASLt baseline.
struct DenseGemm {
  int64_t m, n, k;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};

// The work one timed call does, by the conventions of docs/benchmark.md.
struct WorkModel {
  double flops = 0;                // model FLOPs; 0 for memory-bound work
  std::vector<DenseGemm> dense;    // the baseline's dense GEMMs of equal FLOPs; empty: a device copy of `bytes`
  std::string flop_convention;     // how `flops` is counted, in words (echoed into the results)
  std::string baseline_description;
};

class Workload {
 public:
  virtual ~Workload();

  // Creates the plan on `handle`. MOEKIT_STATUS_NOT_SUPPORTED: this backend cannot serve the case.
  virtual moekit_status_t create_plan(moekit_handle_t handle) = 0;
  moekit_plan_t plan() const { return plan_; }
  size_t workspace_bytes() const;
  size_t saved_bytes() const;

  // The tensors, once the plan exists (a layer's saved buffer is one of them).
  const std::vector<TensorSpec>& tensors() const { return specs_; }

  // Prepares the argument structs of every set, so that a call does no more host work than the library's own.
  // `workspace` (workspace_bytes() of the platform's memory) serves every set.
  void bind(const std::vector<const TensorSet*>& sets, void* workspace, size_t workspace_bytes) {
    workspace_ = workspace;
    workspace_bytes_ = workspace_bytes;
    bind_sets(sets);
  }

  // The library calls, run in order by one timed call. A `_backward` case also names the calls it subtracts:
  // its time is t(forward + backward) - t(forward).
  virtual int steps() const { return 1; }
  virtual std::vector<int> timed_steps() const;
  virtual std::vector<int> subtracted_steps() const { return {}; }
  virtual std::string step_name(int step) const = 0;
  virtual moekit_status_t run_step(int step, int set, void* stream) = 0;

  virtual WorkModel model() const = 0;

  // The real routing the case's inputs come from (routing.h); null for the operations without one.
  const Routing* routing_used() const { return routing_; }

  // Bytes one timed call moves: by default each tensor by its Access (docs/benchmark.md); the layers, whose
  // forward and backward read some tensors twice, count per step.
  virtual double bytes() const;

 protected:
  explicit Workload(const CaseConfig& config, const Shape& shape) : config_(config), shape_(shape) {}
  // Adds the saved buffer to the tensors when the plan has one (moekit_plan_saved_size > 0); returns its index.
  std::optional<size_t> add_saved_buffer(Access access);
  size_t add(TensorSpec spec);  // returns the tensor's index
  // The case's real routing at its shape (seed, dtype and routing options of the config), remembered for the record.
  const Routing& routing();
  // The total size of the tensors given by index (absent ones count 0).
  double bytes_of(std::initializer_list<std::optional<size_t>> tensors) const;
  virtual void bind_sets(const std::vector<const TensorSet*>& sets) = 0;

  const CaseConfig& config_;
  Shape shape_;
  moekit_plan_t plan_ = nullptr;
  std::vector<TensorSpec> specs_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;

 private:
  const Routing* routing_ = nullptr;
};

// The workload of `config.op` at `shape` (the case's shape, or its check shape). Throws CaseFailure when the
// inputs cannot be prepared.
std::unique_ptr<Workload> make_workload(const CaseConfig& config, const Shape& shape);

// Storage dtype of weight gradients / GEMM outputs: the configured one, or the case's dtype.
inline moekit_dtype_t or_dtype(moekit_dtype_t configured, moekit_dtype_t dtype) {
  return configured == MOEKIT_DTYPE_INVALID ? dtype : configured;
}

}  // namespace moekit_bench
