// The expert-parallel layer's plan: the rank's shape, the inner moekit plans it chains, and the byte layout of its
// workspace and saved buffer (one function computes both the sizes and the offsets, so they cannot disagree).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "moekit/moekit_ep.h"
#include "src/ep/exchange.h"
#include "src/ep/row_ops.h"

namespace moekit {
inline namespace v0 {
namespace ep {

// A failure with its status; the C ABI turns it into the status and this thread's message.
class EpError : public std::runtime_error {
 public:
  EpError(moekit_status_t status, const std::string& message) : std::runtime_error(message), status_(status) {}
  moekit_status_t status() const { return status_; }

 private:
  moekit_status_t status_;
};

// Throws EpError naming `what` with moekit's own message when an inner call fails.
void check_inner(moekit_status_t status, const char* what);

// Byte offsets (256-aligned) of the saved buffer's sections.
struct SavedLayout {
  size_t header, logits, scores, indices, expert_offsets, gather_idx, pair_idx, grouped_pos, slot, kept_pos, send_counts,
      recv_counts, perm, owner_offsets, x_owner, s_owner, h, total;
};
// Byte offsets of the workspace's sections; `inner` is shared by the inner operations, one at a time.
struct WorkspaceLayout {
  size_t single_group, iota, dropped, grouped, grouped_s, send_rows, send_s, recv_rows, recv_s, owner_a, owner_b,
      act, dh, ds_owner, ds, dlogits, inner, total;
};

struct Plans {
  moekit_plan_t router_gemm = nullptr, router = nullptr, dispatch = nullptr, gated = nullptr, down = nullptr,
                combine = nullptr, dgated = nullptr, db2 = nullptr, db1 = nullptr, dw2 = nullptr, dw1 = nullptr,
                dxe = nullptr, dx_router = nullptr, dw_router = nullptr;
  ~Plans();
};

}  // namespace ep
}  // namespace v0
}  // namespace moekit

struct moekit_ep_comm {
  std::unique_ptr<moekit::ep::Exchange> exchange;
};

struct moekit_ep_plan {
  uint64_t id;  // written into the saved buffer's header by the forward, checked by the backward
  moekit_handle_t handle;
  moekit::ep::Exchange* exchange;
  std::unique_ptr<moekit::ep::RowOps> ops;
  moekit_ep_desc_t desc;
  moekit::ep::EpShape shape;
  int64_t tokens, top_k, hidden, intermediate, width, experts, router_experts, pairs, send_slots, max_recv;
  int32_t dtype, score_dtype, grad_dtype;
  size_t element_bytes, score_bytes;
  moekit::ep::SavedLayout saved;
  moekit::ep::WorkspaceLayout workspace;
  moekit::ep::Plans plans;
};

namespace moekit {
inline namespace v0 {
namespace ep {

// Validates the descriptor against the communicator and builds every inner plan; throws EpError.
void build_plan(moekit_ep_plan& plan);
void run_forward(const moekit_ep_plan& plan, const moekit_ep_fwd_args_t& args, void* saved, void* workspace,
                 void* stream);
void run_backward(const moekit_ep_plan& plan, const moekit_ep_bwd_args_t& args, const void* saved, void* workspace,
                  void* stream);

}  // namespace ep
}  // namespace v0
}  // namespace moekit
