// The internal interface every backend implements: one method per operation of moekit.h.
// capi/ has checked every argument against the plan before a method is called (shapes, dtypes, devices,
// strides, alignment, workspace and saved-buffer sizes), so a backend trusts its inputs' host-side properties.
// Methods throw moekit::Error for what they cannot serve (NOT_SUPPORTED) and for a saved buffer whose header
// names another plan (INVALID_VALUE); they write no output before they know they will succeed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "moekit/moekit.h"
#include "src/plan.h"
#include "src/value_checks.h"

namespace moekit {
inline namespace v0 {

struct Workspace {
  void* data;
  size_t bytes;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual moekit_device_t device() const = 0;

  // Called once by plan creation, after the descriptor is validated: fills plan.workspace_bytes and
  // plan.saved_bytes, or throws NOT_SUPPORTED for a problem this backend cannot run.
  virtual void plan_sizes(moekit_plan& plan) const = 0;
  // What a plan runs, as text (moekit_plan_describe): plan_summary, then the backend's choice; a layer lists its
  // building blocks one per line.
  virtual std::string describe(const moekit_plan& plan) const = 0;

  // MOEKIT_HANDLE_VALIDATE: evaluates `checks`, numbered from first_check, after the work already enqueued on the
  // stream, and returns the smallest failure code (cuda/common/value_check_code.h) or kNoValueFailure. The CUDA
  // backend synchronises the stream to read it, and throws NOT_SUPPORTED before enqueuing anything on a stream
  // that is being captured.
  virtual uint64_t check_values(const std::vector<ValueCheck>& checks, uint32_t first_check, void* stream) = 0;

  virtual void router_forward(const moekit_plan&, const moekit_router_fwd_args_t&, Workspace, void* stream) = 0;
  virtual void router_backward(const moekit_plan&, const moekit_router_bwd_args_t&, Workspace, void* stream) = 0;
  virtual void dispatch(const moekit_plan&, const moekit_dispatch_args_t&, Workspace, void* stream) = 0;
  virtual void gemm(const moekit_plan&, const moekit_gemm_args_t&, Workspace, void* stream) = 0;
  // scores.data == NULL means weights of 1 (the broadcast backward).
  virtual void combine(const moekit_plan&, const moekit_combine_args_t&, Workspace, void* stream) = 0;
  virtual void db1(const moekit_plan&, const moekit_db1_args_t&, Workspace, void* stream) = 0;
  virtual void db2_ds(const moekit_plan&, const moekit_db2_ds_args_t&, Workspace, void* stream) = 0;
  virtual void group_select(const moekit_plan&, const moekit_group_select_args_t&, Workspace, void* stream) = 0;
  virtual void load_balance_update(const moekit_load_balance_args_t&, void* stream) = 0;

  virtual void moe_forward(const moekit_plan&, const moekit_moe_fwd_args_t&, void* saved, Workspace,
                           void* stream) = 0;
  virtual void moe_backward(const moekit_plan&, const moekit_moe_bwd_args_t&, const void* saved, Workspace,
                            void* stream) = 0;
  virtual void experts_forward(const moekit_plan&, const moekit_experts_fwd_args_t&, void* saved, Workspace,
                               void* stream) = 0;
  virtual void experts_backward(const moekit_plan&, const moekit_experts_bwd_args_t&, const void* saved,
                                Workspace, void* stream) = 0;
  virtual void token_experts_forward(const moekit_plan&, const moekit_token_experts_fwd_args_t&, void* saved,
                                     Workspace, void* stream) = 0;
  virtual void token_experts_backward(const moekit_plan&, const moekit_token_experts_bwd_args_t&, const void* saved,
                                      Workspace, void* stream) = 0;
  virtual void sparse_ffn_forward(const moekit_plan&, const moekit_sparse_ffn_fwd_args_t&, void* saved, Workspace,
                                  void* stream) = 0;
  virtual void sparse_ffn_backward(const moekit_plan&, const moekit_sparse_ffn_bwd_args_t&, const void* saved,
                                   Workspace, void* stream) = 0;
};

}  // namespace v0
}  // namespace moekit
