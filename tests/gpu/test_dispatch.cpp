// CUDA dispatch metadata (docs/math.md section 2) against the reference backend through the C ABI: every integer output
// identical (expert_offsets, gather_idx, pair_idx, grouped_pos), rows >= Pv of gather_idx / pair_idx still
// poisoned, over a shape table (T x E x K), dropped pairs, empty experts, one expert taking every
// token, a local expert range, strided id rows, general routing with 0..5 pairs per token, int32 and int64 ids;
// bitwise determinism over reruns and across two streams; NOT_SUPPORTED for more experts than fit.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_util.h"

using namespace moekit_test;

namespace {

constexpr int32_t kPoison = 0x7eadbeef;  // HostTensor::poison() of an int32 tensor

// Ids of one dispatch call: fixed routing [T, K] (rows `row_stride` apart when > K) or general routing [P].
struct Routing {
  moekit_dispatch_desc_t desc;
  HostTensor indices;      // fixed: [T, row_stride]; general: [P slots]
  int64_t tokens = 0;
  int64_t row_stride = 0;  // fixed routing: elements between rows (>= K)
  HostTensor tok_offsets;  // general routing: [T+1] int32
  int64_t pair_slots() const { return desc.top_k > 0 ? tokens * desc.top_k : indices.rows(); }
};

struct Outputs {
  HostTensor expert_offsets, gather_idx, pair_idx, grouped_pos;
};

moekit_dispatch_desc_t make_desc(int64_t tokens, int64_t top_k, int64_t experts, int64_t expert_begin,
                                 int64_t max_pairs = 0) {
  moekit_dispatch_desc_t desc;
  moekit_dispatch_desc_init(&desc);
  desc.max_tokens = tokens;
  desc.top_k = top_k;
  desc.max_pairs = max_pairs;
  desc.experts = experts;
  desc.expert_begin = expert_begin;
  return desc;
}

// A [T, K] view of the [T, row_stride] ids.
moekit_tensor_t ids_view(moekit_tensor_t v, const Routing& r) {
  if (r.desc.top_k > 0) {
    v.shape[1] = r.desc.top_k;
    v.stride[0] = r.row_stride;
  }
  return v;
}

// Fixed routing: ids drawn by `draw(token, k)`, rows padded to `row_stride`.
template <class Draw>
Routing fixed_routing(moekit_dtype_t dtype, int64_t tokens, int64_t top_k, int64_t experts, int64_t expert_begin,
                      Draw draw, int64_t row_stride = 0) {
  Routing r;
  r.desc = make_desc(tokens, top_k, experts, expert_begin);
  r.tokens = tokens;
  r.row_stride = row_stride > 0 ? row_stride : top_k;
  r.indices = HostTensor(dtype, {tokens, r.row_stride});
  r.indices.poison();  // the padding between rows must never be read as ids
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t k = 0; k < top_k; ++k) r.indices.set(t * r.row_stride + k, static_cast<double>(draw(t, k)));
  return r;
}

// General routing: `counts[t]` pairs for token t, ids by `draw(p)`, `slack` extra slots past the last pair.
template <class Draw>
Routing general_routing(moekit_dtype_t dtype, const std::vector<int64_t>& counts, int64_t experts,
                        int64_t expert_begin, int64_t slack, Draw draw) {
  Routing r;
  r.tokens = static_cast<int64_t>(counts.size());
  r.tok_offsets = HostTensor(MOEKIT_DTYPE_INT32, {r.tokens + 1});
  int64_t pairs = 0;
  r.tok_offsets.set(0, 0);
  for (int64_t t = 0; t < r.tokens; ++t) {
    pairs += counts[static_cast<size_t>(t)];
    r.tok_offsets.set(t + 1, static_cast<double>(pairs));
  }
  r.desc = make_desc(r.tokens, 0, experts, expert_begin, pairs + slack);
  r.indices = HostTensor(dtype, {pairs + slack});
  r.indices.poison();  // slots past tok_offsets[T] hold no pair
  for (int64_t p = 0; p < pairs; ++p) r.indices.set(p, static_cast<double>(draw(p)));
  return r;
}

Outputs poisoned_outputs(const Routing& r) {
  int64_t slots = r.pair_slots();
  Outputs o{HostTensor(MOEKIT_DTYPE_INT32, {r.desc.experts + 1}), HostTensor(MOEKIT_DTYPE_INT32, {slots}),
            HostTensor(MOEKIT_DTYPE_INT32, {slots}), HostTensor(MOEKIT_DTYPE_INT32, {slots})};
  for (HostTensor* t : {&o.expert_offsets, &o.gather_idx, &o.pair_idx, &o.grouped_pos}) t->poison();
  return o;
}

moekit_plan_t make_plan(moekit_handle_t handle, const moekit_dispatch_desc_t& desc) {
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_dispatch_plan_create(handle, &desc, &plan));
  return plan;
}

size_t workspace_size(moekit_plan_t plan) {
  size_t bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &bytes));
  return bytes;
}

Outputs run_reference(moekit_handle_t handle, Routing& r) {
  Outputs o = poisoned_outputs(r);
  moekit_plan_t plan = make_plan(handle, r.desc);
  std::vector<uint8_t> workspace(workspace_size(plan));
  moekit_dispatch_args_t args;
  moekit_dispatch_args_init(&args);
  args.indices = ids_view(r.indices.view(), r);
  if (r.desc.top_k == 0) args.tok_offsets = r.tok_offsets.view();
  args.expert_offsets = o.expert_offsets.view();
  args.gather_idx = o.gather_idx.view();
  args.pair_idx = o.pair_idx.view();
  args.grouped_pos = o.grouped_pos.view();
  MOEKIT_REQUIRE_OK(
      moekit_dispatch(plan, &args, workspace.empty() ? nullptr : workspace.data(), workspace.size(), nullptr));
  moekit_plan_destroy(plan);
  return o;
}

// The CUDA side of one call, kept on the device so reruns and streams can be compared.
struct CudaRun {
  DeviceTensor indices, tok_offsets, expert_offsets, gather_idx, pair_idx, grouped_pos;
  DeviceBuffer workspace;
  moekit_plan_t plan = nullptr;
  moekit_dispatch_args_t args;

  CudaRun(moekit_handle_t handle, const Routing& r) {
    plan = make_plan(handle, r.desc);
    workspace = DeviceBuffer(workspace_size(plan));
    Outputs o = poisoned_outputs(r);
    indices = DeviceTensor(r.indices);
    if (r.desc.top_k == 0) tok_offsets = DeviceTensor(r.tok_offsets);
    expert_offsets = DeviceTensor(o.expert_offsets);
    gather_idx = DeviceTensor(o.gather_idx);
    pair_idx = DeviceTensor(o.pair_idx);
    grouped_pos = DeviceTensor(o.grouped_pos);
    moekit_dispatch_args_init(&args);
    args.indices = ids_view(indices.view(), r);
    if (r.desc.top_k == 0) args.tok_offsets = tok_offsets.view();
    args.expert_offsets = expert_offsets.view();
    args.gather_idx = gather_idx.view();
    args.pair_idx = pair_idx.view();
    args.grouped_pos = grouped_pos.view();
  }
  ~CudaRun() { moekit_plan_destroy(plan); }
  CudaRun(const CudaRun&) = delete;
  CudaRun& operator=(const CudaRun&) = delete;

  void enqueue(cudaStream_t stream) {
    MOEKIT_REQUIRE_OK(moekit_dispatch(plan, &args, workspace.data(), workspace.bytes(), stream));
  }
  Outputs download() const {
    return Outputs{expert_offsets.download(), gather_idx.download(), pair_idx.download(), grouped_pos.download()};
  }
};

Outputs run_cuda(moekit_handle_t handle, const Routing& r) {
  CudaRun run(handle, r);
  run.enqueue(nullptr);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  return run.download();
}

const int32_t* ints(const HostTensor& t) { return static_cast<const int32_t*>(t.data()); }

void require_same(const char* name, const HostTensor& got, const HostTensor& want) {
  INFO(name);
  REQUIRE(got.numel() == want.numel());
  for (int64_t i = 0; i < want.numel(); ++i)
    if (ints(got)[i] != ints(want)[i]) {
      INFO("first difference at " << i << " of " << want.numel() << ": CUDA " << ints(got)[i] << ", reference "
                                  << ints(want)[i]);
      REQUIRE(ints(got)[i] == ints(want)[i]);
    }
}

void require_identical(const Outputs& got, const Outputs& want) {
  require_same("expert_offsets", got.expert_offsets, want.expert_offsets);
  require_same("grouped_pos", got.grouped_pos, want.grouped_pos);
  require_same("gather_idx", got.gather_idx, want.gather_idx);
  require_same("pair_idx", got.pair_idx, want.pair_idx);
}

// Runs both backends and requires identical outputs, rows >= Pv untouched; returns Pv.
int64_t check_against_reference(const Handles& handles, Routing& r) {
  Outputs want = run_reference(handles.reference, r);
  Outputs got = run_cuda(handles.cuda, r);
  require_identical(got, want);
  int64_t valid = ints(want.expert_offsets)[r.desc.experts];
  for (int64_t i = valid; i < r.pair_slots(); ++i) {
    INFO("grouped row " << i << " past the " << valid << " valid pairs");
    REQUIRE(ints(got.gather_idx)[i] == kPoison);
    REQUIRE(ints(got.pair_idx)[i] == kPoison);
  }
  return valid;
}

// Ids mostly in the local range [e0, e0 + E), with some drops: a neighbour rank's experts, -1, a sentinel.
struct MixedIds {
  std::mt19937_64* rng;
  int64_t experts, expert_begin;
  int64_t operator()(int64_t = 0, int64_t = 0) const {
    std::uniform_int_distribution<int64_t> local(expert_begin, expert_begin + experts - 1);
    std::uniform_int_distribution<int> kind(0, 99);
    int k = kind(*rng);
    if (k < 3) return -1;
    if (k < 5) return expert_begin + experts + k;  // another rank's expert
    if (k < 6) return expert_begin > 0 ? expert_begin - 1 : 2147483647;
    return local(*rng);
  }
};

void sweep_fixed(const Handles& handles, const std::vector<int64_t>& token_counts, uint64_t seed) {
  std::mt19937_64 rng(seed);
  int variant = 0;
  for (int64_t tokens : token_counts)
    for (int64_t experts : {3, 8, 128, 256, 4096})
      for (int64_t top_k : {1, 2, 8, 16}) {
        ++variant;
        moekit_dtype_t dtype = variant % 2 ? MOEKIT_DTYPE_INT32 : MOEKIT_DTYPE_INT64;
        int64_t expert_begin = variant % 3 == 0 ? 0 : 3 * experts;
        INFO("T=" << tokens << " E=" << experts << " K=" << top_k << " e0=" << expert_begin << " dtype " << dtype);
        Routing r = fixed_routing(dtype, tokens, top_k, experts, expert_begin, MixedIds{&rng, experts, expert_begin});
        int64_t valid = check_against_reference(handles, r);
        // About 6% of the ids are drops: on a large problem both kinds of pairs occur.
        if (tokens * top_k >= 4096) {
          REQUIRE(valid > 0);
          REQUIRE(valid < tokens * top_k);
        }
      }
}

}  // namespace

TEST_CASE("dispatch: CUDA equals the reference over T x E x K (drops, e0, int32/int64 ids)", "[gpu][dispatch]") {
  Handles handles;
  sweep_fixed(handles, {1, 7, 4096}, 7001);
}

TEST_CASE("dispatch: CUDA equals the reference at T = 32768 for every E and K", "[gpu][dispatch][large]") {
  Handles handles;
  sweep_fixed(handles, {32768}, 7002);
}

TEST_CASE("dispatch: edge cases of the routing", "[sanitize][gpu][dispatch]") {
  Handles handles;
  std::mt19937_64 rng(7003);
  const moekit_dtype_t dtype = GENERATE(MOEKIT_DTYPE_INT32, MOEKIT_DTYPE_INT64);
  INFO("dtype " << dtype);
  SECTION("one expert takes every token") {
    Routing r = fixed_routing(dtype, 4099, 8, 128, 0, [](int64_t, int64_t) { return 77; });
    REQUIRE(check_against_reference(handles, r) == 4099 * 8);
  }
  SECTION("every pair dropped: expert_offsets all 0, nothing written to the grouped rows") {
    Routing r = fixed_routing(dtype, 333, 4, 16, 16, [&](int64_t t, int64_t) { return t % 2 ? -1 : 32 + t % 7; });
    REQUIRE(check_against_reference(handles, r) == 0);
  }
  SECTION("a local slice of 16 experts out of 64 (e0 = 16): the other ranks' pairs dropped") {
    std::uniform_int_distribution<int64_t> id(0, 63);
    Routing r = fixed_routing(dtype, 2500, 6, 16, 16, [&](int64_t, int64_t) { return id(rng); });
    int64_t valid = check_against_reference(handles, r);
    REQUIRE(valid > 2500 * 6 / 8);
    REQUIRE(valid < 2500 * 6 / 2);
  }
  SECTION("empty experts: 4096 experts, ids on every 37th") {
    std::uniform_int_distribution<int64_t> id(0, 110);
    Routing r = fixed_routing(dtype, 1000, 8, 4096, 0, [&](int64_t, int64_t) { return 37 * id(rng); });
    check_against_reference(handles, r);
  }
  SECTION("skewed load: 90% of the pairs on two experts, spanning many chunks") {
    std::uniform_int_distribution<int> coin(0, 9);
    std::uniform_int_distribution<int64_t> id(0, 255);
    Routing r = fixed_routing(dtype, 9000, 8, 256, 0,
                              [&](int64_t, int64_t k) { return coin(rng) < 9 ? k % 2 : id(rng); });
    check_against_reference(handles, r);
  }
  SECTION("id rows further apart than K (a strided view of a wider tensor)") {
    Routing r = fixed_routing(dtype, 777, 6, 40, 8, MixedIds{&rng, 40, 8}, 11);
    check_against_reference(handles, r);
  }
  SECTION("E = 1 and E not a power of two with one id per token") {
    Routing one = fixed_routing(dtype, 5000, 1, 1, 4, MixedIds{&rng, 1, 4});
    check_against_reference(handles, one);
    Routing odd = fixed_routing(dtype, 5000, 1, 1000, 0, MixedIds{&rng, 1000, 0});
    check_against_reference(handles, odd);
  }
}

TEST_CASE("dispatch: general routing with 0..5 pairs per token", "[sanitize][gpu][dispatch]") {
  Handles handles;
  std::mt19937_64 rng(7004);
  std::uniform_int_distribution<int64_t> per_token(0, 5);
  int variant = 0;
  for (int64_t tokens : {1, 7, 4096, 32768})
    for (int64_t experts : {3, 128, 4096}) {
      ++variant;
      moekit_dtype_t dtype = variant % 2 ? MOEKIT_DTYPE_INT64 : MOEKIT_DTYPE_INT32;
      int64_t expert_begin = variant % 3 == 0 ? 0 : 2 * experts;
      std::vector<int64_t> counts(static_cast<size_t>(tokens));
      for (auto& c : counts) c = per_token(rng);
      counts[0] = tokens > 1 ? 0 : 3;  // a leading token with no pairs, when there are several
      int64_t slack = variant % 2 ? 0 : 1 + variant * 37;
      INFO("T=" << tokens << " E=" << experts << " e0=" << expert_begin << " slack " << slack << " dtype " << dtype);
      Routing r = general_routing(dtype, counts, experts, expert_begin, slack, MixedIds{&rng, experts, expert_begin});
      int64_t valid = check_against_reference(handles, r);
      if (tokens >= 4096) REQUIRE(valid > 0);
    }
}

TEST_CASE("dispatch: bitwise identical over reruns and across two streams", "[gpu][dispatch]") {
  Handles handles;
  std::mt19937_64 rng(7005);
  Routing fixed = fixed_routing(MOEKIT_DTYPE_INT32, 8192, 8, 128, 0, MixedIds{&rng, 128, 0});
  std::vector<int64_t> counts(5000);
  std::uniform_int_distribution<int64_t> per_token(0, 5);
  for (auto& c : counts) c = per_token(rng);
  Routing general = general_routing(MOEKIT_DTYPE_INT64, counts, 256, 256, 100, MixedIds{&rng, 256, 256});
  for (Routing* r : {&fixed, &general}) {
    INFO((r->desc.top_k > 0 ? "fixed routing" : "general routing"));
    Outputs want = run_reference(handles.reference, *r);
    CudaRun run(handles.cuda, *r);
    for (int rerun = 0; rerun < 3; ++rerun) {
      INFO("rerun " << rerun);
      run.enqueue(nullptr);
      CUDA_REQUIRE(cudaDeviceSynchronize());
      require_identical(run.download(), want);
    }
    cudaStream_t streams[2] = {nullptr, nullptr};
    for (auto& s : streams) CUDA_REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CudaRun first(handles.cuda, *r), second(handles.cuda, *r);
    for (int rerun = 0; rerun < 3; ++rerun) {
      first.enqueue(streams[0]);
      second.enqueue(streams[1]);
    }
    CUDA_REQUIRE(cudaDeviceSynchronize());
    for (auto& s : streams) cudaStreamDestroy(s);
    require_identical(first.download(), want);
    require_identical(second.download(), want);
  }
}

TEST_CASE("dispatch: more experts than the shared-memory counters hold is NOT_SUPPORTED", "[gpu][dispatch]") {
  Handles handles;
  moekit_dispatch_desc_t desc = make_desc(16, 2, 100000, 0);
  moekit_plan_t plan = nullptr;
  REQUIRE(moekit_dispatch_plan_create(handles.cuda, &desc, &plan) == MOEKIT_STATUS_NOT_SUPPORTED);
  REQUIRE(last_error().find("experts") != std::string::npos);
  MOEKIT_REQUIRE_OK(moekit_dispatch_plan_create(handles.reference, &desc, &plan));
  moekit_plan_destroy(plan);
}
