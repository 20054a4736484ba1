#include "routing.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
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

// Lognormal routing's per-expert logit offsets: log w_e = sigma * z_e (z_e standard normal, Box-Muller), then -1e4
// for `empty` experts chosen by a partial Fisher-Yates shuffle. Their own SplitMix64 stream (the seed with a fixed
// tag), so the uniform part of the logits is the uniform routing's.
std::vector<float> lognormal_offsets(int64_t E, double sigma, int64_t empty, uint64_t seed) {
  uint64_t state = seed ^ 0x6C6F676E6F726D6Cull;  // "lognorml"
  const auto unit = [&state] { return static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53; };  // [0, 1)
  constexpr double kTwoPi = 6.283185307179586;
  std::vector<float> offsets(static_cast<size_t>(E));
  for (float& offset : offsets) {
    const double u1 = 1.0 - unit(), u2 = unit();  // u1 in (0, 1]
    offset = static_cast<float>(sigma * std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2));
  }
  std::vector<size_t> experts(static_cast<size_t>(E));
  std::iota(experts.begin(), experts.end(), size_t{0});
  for (size_t i = 0; i < static_cast<size_t>(empty); ++i) {
    const size_t pick = i + static_cast<size_t>(splitmix64(state) % (experts.size() - i));
    std::swap(experts[i], experts[pick]);
    offsets[experts[i]] = -1e4f;
  }
  return offsets;
}

// The logits [T, E] in `dtype`: uniform in [-1, 1) from `seed` (as fill_random draws them), plus the expert's
// offset, rounded once.
std::vector<unsigned char> make_logits(int64_t T, int64_t E, moekit_dtype_t dtype, uint64_t seed,
                                       const std::vector<float>& offsets) {
  std::vector<float> values(static_cast<size_t>(T * E));
  fill_random(*make_host_platform(1), values.data(), MOEKIT_DTYPE_FP32, T * E, 1.0f, seed);
  std::vector<unsigned char> logits(values.size() * dtype_bytes(dtype));
  for (size_t i = 0; i < values.size(); ++i)
    store_element(dtype, values[i] + offsets[i % static_cast<size_t>(E)], logits.data() + i * dtype_bytes(dtype));
  return logits;
}

std::unique_ptr<Routing> make_routing(int64_t T, int64_t E, int64_t K, moekit_dtype_t dtype, uint64_t seed,
                                      const RoutingOptions& options) {
  auto r = std::make_unique<Routing>();
  r->tokens = T;
  r->experts = E;
  r->top_k = K;
  r->logits_dtype = dtype;
  r->options = options;
  r->forced_empty = options.empty_experts(E);
  r->logits = make_logits(T, E, dtype, seed,
                          options.kind == RoutingKind::lognormal
                              ? lognormal_offsets(E, options.sigma, r->forced_empty, seed)
                              : std::vector<float>(static_cast<size_t>(E), 0.0f));
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

const Routing& routing_for(int64_t tokens, int64_t experts, int64_t top_k, moekit_dtype_t logits_dtype, uint64_t seed,
                           const RoutingOptions& options) {
  // Uniform routing ignores sigma and the empty fraction: one key for all its spellings.
  const bool lognormal = options.kind == RoutingKind::lognormal;
  using Key = std::tuple<int64_t, int64_t, int64_t, int, uint64_t, bool, double, double>;
  static std::map<Key, std::unique_ptr<Routing>> cache;
  const Key key{tokens,    experts, top_k, logits_dtype, seed, lognormal, lognormal ? options.sigma : 0.0,
                lognormal ? options.empty_fraction : 0.0};
  auto it = cache.find(key);
  if (it == cache.end())
    it = cache.emplace(key, make_routing(tokens, experts, top_k, logits_dtype, seed, options)).first;
  return *it->second;
}

RoutingSummary summarize(const Routing& routing) {
  RoutingSummary s;
  s.present = true;
  const bool lognormal = routing.options.kind == RoutingKind::lognormal;
  s.kind = lognormal ? "lognormal" : "uniform";
  if (lognormal) {
    s.sigma = routing.options.sigma;
    s.empty_fraction = routing.options.empty_fraction;
    s.forced_empty = routing.forced_empty;
  }
  if (!routing.counts.empty()) {
    const auto [lo, hi] = std::minmax_element(routing.counts.begin(), routing.counts.end());
    s.count_min = *lo;
    s.count_max = *hi;
    s.empty = std::count(routing.counts.begin(), routing.counts.end(), 0);
    s.count_mean = static_cast<double>(routing.pairs()) / static_cast<double>(routing.experts);
  }
  return s;
}

}  // namespace moekit_bench
