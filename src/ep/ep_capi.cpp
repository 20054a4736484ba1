// The C ABI of the expert-parallel layer (include/moekit/moekit_ep.h): argument checks that name the argument, the
// per-thread last error, and the translation of every failure into a status (no exception crosses the ABI).
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "moekit/moekit_ep.h"
#include "src/ep/ep_plan.h"
#include "src/ep/local_exchange.h"
#include "src/ep/nccl_exchange.h"

struct moekit_ep_local_group {
  explicit moekit_ep_local_group(int ranks) : group(ranks) {}
  moekit::ep::LocalGroup group;
};

namespace moekit {
inline namespace v0 {
namespace ep {
namespace {

thread_local std::string last_error;

template <class Body>
moekit_status_t translate(Body&& body) noexcept {
  try {
    body();
    return MOEKIT_SUCCESS;
  } catch (const EpError& e) {
    last_error = e.what();
    return e.status();
  } catch (const std::bad_alloc&) {
    last_error = "memory: a host allocation failed";
    return MOEKIT_STATUS_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    last_error = std::string("internal: ") + e.what();
    return MOEKIT_STATUS_INTERNAL_ERROR;
  } catch (...) {
    last_error = "internal: an unknown exception reached the C API";
    return MOEKIT_STATUS_INTERNAL_ERROR;
  }
}

[[noreturn]] void invalid(const std::string& message) { throw EpError(MOEKIT_STATUS_INVALID_VALUE, message); }

template <class T>
T& require_struct(const char* name, T* p, const char* init) {
  if (!p) invalid(std::string(name) + ": must not be NULL");
  if (p->struct_size < sizeof(size_t) || p->struct_size > sizeof(T))
    invalid(std::string(name) + ": struct_size " + std::to_string(p->struct_size) + " is not one this library knows; " +
            "fill it with " + init);
  return *p;
}

// A copy of a caller's struct: the fields its struct_size covers, the defaults of `init` for newer ones.
template <class T>
T read_struct(const char* name, const T* p, moekit_status_t (*init)(T*), const char* init_name) {
  require_struct(name, const_cast<T*>(p), init_name);
  T copy;
  init(&copy);
  std::memcpy(&copy, p, p->struct_size);
  copy.struct_size = sizeof(T);
  return copy;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// A contiguous tensor of this dtype and shape on the layer's memory; `optional` ones may be absent (data NULL).
void check_tensor(const moekit_ep_plan& p, const char* name, const moekit_tensor_t& t, int32_t dtype,
                  std::vector<int64_t> shape, bool optional = false) {
  std::string n(name);
  if (!t.data && t.rank == 0) {
    if (optional) return;
    invalid(n + ": required, got an absent tensor");
  }
  int32_t want_device = p.exchange->on_device() ? MOEKIT_DEVICE_CUDA : MOEKIT_DEVICE_CPU;
  if (t.device.type != want_device)
    invalid(n + ": expected a tensor on the " + (want_device == MOEKIT_DEVICE_CUDA ? "CUDA" : "CPU") +
            " device (the communicator's memory), got device type " + std::to_string(t.device.type));
  if (t.dtype != dtype)
    invalid(n + ": expected dtype " + std::to_string(dtype) + ", got " + std::to_string(t.dtype));
  std::vector<int64_t> got(t.shape, t.shape + (t.rank >= 0 && t.rank <= MOEKIT_MAX_RANK ? t.rank : 0));
  if (got != shape) invalid(n + ": expected shape " + shape_text(shape) + ", got " + shape_text(got));
  int64_t stride = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.stride[i] != stride)
      invalid(n + ": must be contiguous (row-major), got stride " + std::to_string(t.stride[i]) + " in dimension " +
              std::to_string(i));
    stride *= t.shape[i];
  }
  if (!t.data && stride > 0) invalid(n + ": data is NULL for a non-empty tensor");
}

int64_t tokens_of(const moekit_ep_plan& p, const moekit_tensor_t& x) {
  if (x.rank != 2) invalid("x: expected shape [T, H] with H = " + std::to_string(p.hidden) + ", got rank " +
                           std::to_string(x.rank));
  if (x.shape[0] < 0 || x.shape[0] > p.tokens)
    invalid("x: T = " + std::to_string(x.shape[0]) + " is outside 0..max_tokens = " + std::to_string(p.tokens));
  return x.shape[0];
}

void check_buffer(const char* name, const void* data, size_t bytes, size_t need) {
  if (bytes < need)
    throw EpError(MOEKIT_STATUS_INSUFFICIENT_WORKSPACE, std::string(name) + ": " + std::to_string(bytes) +
                                                            " bytes passed, the plan needs " + std::to_string(need));
  if (need > 0 && !data) invalid(std::string(name) + ": NULL, the plan needs " + std::to_string(need) + " bytes");
  if (reinterpret_cast<uintptr_t>(data) % 16 != 0) invalid(std::string(name) + ": must be 16-byte aligned");
}

// The saved buffer's header, where it can be read without synchronising (host memory: the reference backend): the
// forward of this plan on as many tokens must have filled it.
void check_saved_header(const moekit_ep_plan& p, const void* saved, int64_t tokens) {
  const SavedHeader* header =
      p.ops->readable_header(reinterpret_cast<const SavedHeader*>(static_cast<const char*>(saved) + p.saved.header));
  if (header == nullptr) return;
  if (header->magic != kSavedMagic)
    invalid("saved: not filled by a forward (bad header); pass the buffer this plan's forward filled");
  if (header->plan_id != p.id)
    invalid("saved: filled by the forward of another expert-parallel plan (id " + std::to_string(header->plan_id) +
            "), not this one (id " + std::to_string(p.id) + ")");
  if (header->tokens != tokens)
    invalid("saved: the forward ran on " + std::to_string(header->tokens) + " tokens, this call has " +
            std::to_string(tokens));
}

void check_weights(const moekit_ep_plan& p, const moekit_tensor_t& w1, const moekit_tensor_t& w2) {
  check_tensor(p, "w1", w1, p.dtype, {p.experts, p.width, p.hidden});
  check_tensor(p, "w2", w2, p.dtype, {p.experts, p.hidden, p.intermediate});
}

void check_forward(const moekit_ep_plan& p, const moekit_ep_fwd_args_t& a) {
  int64_t T = tokens_of(p, a.x);
  const moekit_moe_desc_t& l = p.desc.layer;
  check_tensor(p, "x", a.x, p.dtype, {T, p.hidden});
  check_tensor(p, "w_router", a.w_router, p.dtype, {p.router_experts, p.hidden});
  check_tensor(p, "router_bias", a.router_bias, MOEKIT_DTYPE_FP32, {p.router_experts}, true);
  check_weights(p, a.w1, a.w2);
  check_tensor(p, "b1", a.b1, p.dtype, {p.experts, p.width}, !l.has_b1);
  check_tensor(p, "b2", a.b2, p.dtype, {p.experts, p.hidden}, !l.has_b2);
  check_tensor(p, "out", a.out, p.dtype, {T, p.hidden});
  check_tensor(p, "scores", a.scores, p.score_dtype, {T, p.top_k}, true);
  check_tensor(p, "indices", a.indices, MOEKIT_DTYPE_INT32, {T, p.top_k}, true);
  check_tensor(p, "counts", a.counts, MOEKIT_DTYPE_INT32, {p.router_experts}, true);
  check_tensor(p, "dropped", a.dropped, MOEKIT_DTYPE_INT32, {1}, true);
}

void check_backward(const moekit_ep_plan& p, const moekit_ep_bwd_args_t& a) {
  int64_t T = tokens_of(p, a.x);
  const moekit_moe_desc_t& l = p.desc.layer;
  check_tensor(p, "x", a.x, p.dtype, {T, p.hidden});
  check_tensor(p, "dout", a.dout, p.dtype, {T, p.hidden});
  check_tensor(p, "w_router", a.w_router, p.dtype, {p.router_experts, p.hidden});
  check_weights(p, a.w1, a.w2);
  check_tensor(p, "b2", a.b2, p.dtype, {p.experts, p.hidden}, !l.has_b2);
  if (a.compute_input_grad) check_tensor(p, "dx", a.dx, p.dtype, {T, p.hidden});
  if (a.compute_weight_grad) {
    check_tensor(p, "dw_router", a.dw_router, p.grad_dtype, {p.router_experts, p.hidden});
    check_tensor(p, "dw1", a.dw1, p.grad_dtype, {p.experts, p.width, p.hidden});
    check_tensor(p, "db1", a.db1, p.grad_dtype, {p.experts, p.width}, !l.has_b1);
    check_tensor(p, "dw2", a.dw2, p.grad_dtype, {p.experts, p.hidden, p.intermediate});
    check_tensor(p, "db2", a.db2, p.grad_dtype, {p.experts, p.hidden}, !l.has_b2);
  }
}

moekit_ep_plan& require_plan(moekit_ep_plan_t plan) {
  if (!plan) invalid("plan: must not be NULL");
  return *plan;
}

}  // namespace
}  // namespace ep
}  // namespace v0
}  // namespace moekit

using namespace moekit::ep;

extern "C" {

MOEKIT_API int32_t moekit_ep_has_nccl(void) { return nccl_available() ? 1 : 0; }

MOEKIT_API size_t moekit_ep_get_last_error(char* buf, size_t cap) {
  if (buf && cap > 0) {
    size_t n = last_error.size() < cap - 1 ? last_error.size() : cap - 1;
    std::memcpy(buf, last_error.data(), n);
    buf[n] = '\0';
  }
  return last_error.size();
}

MOEKIT_API moekit_status_t moekit_ep_local_group_create(int32_t ranks, moekit_ep_local_group_t* group) {
  return translate([&] {
    if (!group) invalid("group: must not be NULL");
    if (ranks < 1 || ranks > 1024) invalid("ranks: expected 1..1024, got " + std::to_string(ranks));
    *group = new moekit_ep_local_group(ranks);
  });
}

MOEKIT_API moekit_status_t moekit_ep_local_group_destroy(moekit_ep_local_group_t group) {
  delete group;
  return MOEKIT_SUCCESS;
}

MOEKIT_API moekit_status_t moekit_ep_comm_create_local(moekit_ep_local_group_t group, int32_t rank,
                                                       moekit_ep_comm_t* comm) {
  return translate([&] {
    if (!group) invalid("group: must not be NULL");
    if (!comm) invalid("comm: must not be NULL");
    if (rank < 0 || rank >= group->group.ranks())
      invalid("rank: expected 0.." + std::to_string(group->group.ranks() - 1) + ", got " + std::to_string(rank));
    auto c = std::make_unique<moekit_ep_comm>();
    c->exchange = std::make_unique<LocalExchange>(group->group, rank);
    *comm = c.release();
  });
}

MOEKIT_API moekit_status_t moekit_ep_comm_create_nccl(void* nccl_comm, moekit_ep_comm_t* comm) {
  return translate([&] {
    if (!comm) invalid("comm: must not be NULL");
    if (!nccl_comm) invalid("nccl_comm: must not be NULL");
    if (!nccl_available())
      throw EpError(MOEKIT_STATUS_NOT_SUPPORTED, "nccl_comm: this build of moekit_ep has no NCCL (MOEKIT_NCCL=OFF "
                                                 "or NCCL not found at configure time)");
    auto c = std::make_unique<moekit_ep_comm>();
    c->exchange = make_nccl_exchange(nccl_comm);
    *comm = c.release();
  });
}

MOEKIT_API moekit_status_t moekit_ep_comm_destroy(moekit_ep_comm_t comm) {
  delete comm;
  return MOEKIT_SUCCESS;
}

MOEKIT_API moekit_status_t moekit_ep_comm_rank(moekit_ep_comm_t comm, int32_t* rank, int32_t* ranks) {
  return translate([&] {
    if (!comm) invalid("comm: must not be NULL");
    if (rank) *rank = comm->exchange->rank();
    if (ranks) *ranks = comm->exchange->ranks();
  });
}

MOEKIT_API moekit_status_t moekit_ep_desc_init(moekit_ep_desc_t* desc) {
  return translate([&] {
    if (!desc) invalid("desc: must not be NULL");
    std::memset(desc, 0, sizeof(*desc));
    desc->struct_size = sizeof(*desc);
    moekit::ep::check_inner(moekit_moe_desc_init(&desc->layer), "moekit_moe_desc_init");
    desc->layer.inference = 0;
    desc->mode = MOEKIT_EP_EXACT;
  });
}

MOEKIT_API moekit_status_t moekit_ep_fwd_args_init(moekit_ep_fwd_args_t* args) {
  return translate([&] {
    if (!args) invalid("args: must not be NULL");
    std::memset(args, 0, sizeof(*args));
    args->struct_size = sizeof(*args);
  });
}

MOEKIT_API moekit_status_t moekit_ep_bwd_args_init(moekit_ep_bwd_args_t* args) {
  return translate([&] {
    if (!args) invalid("args: must not be NULL");
    std::memset(args, 0, sizeof(*args));
    args->struct_size = sizeof(*args);
    args->compute_input_grad = 1;
    args->compute_weight_grad = 1;
  });
}

MOEKIT_API moekit_status_t moekit_ep_plan_create(moekit_handle_t handle, moekit_ep_comm_t comm,
                                                 const moekit_ep_desc_t* desc, moekit_ep_plan_t* plan) {
  return translate([&] {
    if (!plan) invalid("plan: must not be NULL");
    if (!handle) invalid("handle: must not be NULL");
    if (!comm) invalid("comm: must not be NULL");
    moekit_ep_desc_t d = read_struct("desc", desc, moekit_ep_desc_init, "moekit_ep_desc_init");
    if (d.layer.struct_size != sizeof(moekit_moe_desc_t))
      invalid("desc.layer.struct_size: expected sizeof(moekit_moe_desc_t) = " +
              std::to_string(sizeof(moekit_moe_desc_t)) + " (moekit_ep_desc_init sets it), got " +
              std::to_string(d.layer.struct_size));
    auto p = std::make_unique<moekit_ep_plan>();
    p->handle = handle;
    p->exchange = comm->exchange.get();
    p->desc = d;
    p->ops = p->exchange->on_device() ? make_cuda_row_ops() : make_host_row_ops();
    if (!p->ops) throw EpError(MOEKIT_STATUS_NOT_SUPPORTED, "comm: a device communicator in a build without CUDA");
    build_plan(*p);
    *plan = p.release();
  });
}

MOEKIT_API moekit_status_t moekit_ep_plan_destroy(moekit_ep_plan_t plan) {
  delete plan;
  return MOEKIT_SUCCESS;
}

MOEKIT_API moekit_status_t moekit_ep_plan_sizes(moekit_ep_plan_t plan, size_t* workspace_bytes, size_t* saved_bytes) {
  return translate([&] {
    moekit_ep_plan& p = require_plan(plan);
    if (workspace_bytes) *workspace_bytes = p.workspace.total;
    if (saved_bytes) *saved_bytes = p.saved.total;
  });
}

MOEKIT_API moekit_status_t moekit_ep_forward(moekit_ep_plan_t plan, const moekit_ep_fwd_args_t* args, void* saved,
                                             size_t saved_bytes, void* workspace, size_t workspace_bytes,
                                             void* stream) {
  return translate([&] {
    moekit_ep_plan& p = require_plan(plan);
    moekit_ep_fwd_args_t a = read_struct("args", args, moekit_ep_fwd_args_init, "moekit_ep_fwd_args_init");
    check_forward(p, a);
    check_buffer("saved", saved, saved_bytes, p.saved.total);
    check_buffer("workspace", workspace, workspace_bytes, p.workspace.total);
    run_forward(p, a, saved, workspace, stream);
  });
}

MOEKIT_API moekit_status_t moekit_ep_backward(moekit_ep_plan_t plan, const moekit_ep_bwd_args_t* args,
                                              const void* saved, size_t saved_bytes, void* workspace,
                                              size_t workspace_bytes, void* stream) {
  return translate([&] {
    moekit_ep_plan& p = require_plan(plan);
    moekit_ep_bwd_args_t a = read_struct("args", args, moekit_ep_bwd_args_init, "moekit_ep_bwd_args_init");
    check_backward(p, a);
    check_buffer("saved", saved, saved_bytes, p.saved.total);
    check_saved_header(p, saved, a.x.shape[0]);
    check_buffer("workspace", workspace, workspace_bytes, p.workspace.total);
    run_backward(p, a, saved, workspace, stream);
  });
}

}  // extern "C"
