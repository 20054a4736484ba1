#include "routing.h"

#include <map>
#include <memory>
#include <tuple>

#include "platform.h"
#include "random_fill.h"
#include "tensor_set.h"

namespace moekit_bench {
namespace {

moekit_tensor_t host_view(void* data, moekit_dtype_t dtype, std::vector<int64_t> shape) {
  return moekit_tensor_make(data, dtype, static_cast<int32_t>(shape.size()), shape.data(),
                            moekit_device_t{MOEKIT_DEVICE_CPU, 0});
}

// A reference handle and a plan, destroyed in reverse order.
struct ReferenceCall {
  moekit_handle_t handle = nullptr;
  moekit_plan_t plan = nullptr;
  std::vector<unsigned char> workspace;
  ReferenceCall() {
    moekit_handle_desc_t desc;
    moekit_handle_desc_init(&desc);
    desc.backend = MOEKIT_BACKEND_REFERENCE;
    check_call(moekit_handle_create(&desc, &handle), "routing: reference handle");
  }
  ~ReferenceCall() {
    moekit_plan_destroy(plan);
    moekit_handle_destroy(handle);
  }
  void size_workspace() {
    size_t bytes = 0;
    check_call(moekit_plan_workspace_size(plan, &bytes), "routing: workspace size");
    workspace.resize(bytes);
  }
};

std::unique_ptr<Routing> make_routing(int64_t T, int64_t E, int64_t K, moekit_dtype_t dtype, uint64_t seed) {
  auto r = std::make_unique<Routing>();
  r->tokens = T;
  r->experts = E;
  r->top_k = K;
  r->logits_dtype = dtype;
  r->logits.resize(static_cast<size_t>(T * E) * dtype_bytes(dtype));
  fill_random(*make_host_platform(1), r->logits.data(), dtype, T * E, 1.0f, seed);
  r->scores.resize(static_cast<size_t>(T * K));
  r->indices.resize(static_cast<size_t>(T * K));
  r->counts.resize(static_cast<size_t>(E));
  {
    ReferenceCall router;
    moekit_router_desc_t desc;
    moekit_router_desc_init(&desc);
    desc.max_tokens = T;
    desc.experts = E;
    desc.top_k = K;
    desc.kind = MOEKIT_ROUTER_SOFTMAX_TOPK;
    desc.dtype = dtype;
    check_call(moekit_router_plan_create(router.handle, &desc, &router.plan), "routing: router plan");
    router.size_workspace();
    moekit_router_fwd_args_t args;
    moekit_router_fwd_args_init(&args);
    args.logits = host_view(r->logits.data(), dtype, {T, E});
    args.scores = host_view(r->scores.data(), MOEKIT_DTYPE_FP32, {T, K});
    args.indices = host_view(r->indices.data(), MOEKIT_DTYPE_INT32, {T, K});
    args.counts = host_view(r->counts.data(), MOEKIT_DTYPE_INT32, {E});
    check_call(moekit_router_forward(router.plan, &args, router.workspace.data(), router.workspace.size(), nullptr),
               "routing: router forward");
  }
  const int64_t P = T * K;
  r->expert_offsets.resize(static_cast<size_t>(E + 1));
  r->gather_idx.resize(static_cast<size_t>(P));
  r->pair_idx.resize(static_cast<size_t>(P));
  r->grouped_pos.resize(static_cast<size_t>(P));
  {
    ReferenceCall dispatch;
    moekit_dispatch_desc_t desc;
    moekit_dispatch_desc_init(&desc);
    desc.max_tokens = T;
    desc.top_k = K;
    desc.experts = E;
    check_call(moekit_dispatch_plan_create(dispatch.handle, &desc, &dispatch.plan), "routing: dispatch plan");
    dispatch.size_workspace();
    moekit_dispatch_args_t args;
    moekit_dispatch_args_init(&args);
    args.indices = host_view(r->indices.data(), MOEKIT_DTYPE_INT32, {T, K});
    args.expert_offsets = host_view(r->expert_offsets.data(), MOEKIT_DTYPE_INT32, {E + 1});
    args.gather_idx = host_view(r->gather_idx.data(), MOEKIT_DTYPE_INT32, {P});
    args.pair_idx = host_view(r->pair_idx.data(), MOEKIT_DTYPE_INT32, {P});
    args.grouped_pos = host_view(r->grouped_pos.data(), MOEKIT_DTYPE_INT32, {P});
    check_call(moekit_dispatch(dispatch.plan, &args, dispatch.workspace.data(), dispatch.workspace.size(), nullptr),
               "routing: dispatch");
  }
  return r;
}

}  // namespace

const Routing& routing_for(int64_t tokens, int64_t experts, int64_t top_k, moekit_dtype_t logits_dtype, uint64_t seed) {
  using Key = std::tuple<int64_t, int64_t, int64_t, int, uint64_t>;
  static std::map<Key, std::unique_ptr<Routing>> cache;
  const Key key{tokens, experts, top_k, logits_dtype, seed};
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_routing(tokens, experts, top_k, logits_dtype, seed)).first;
  return *it->second;
}

}  // namespace moekit_bench
