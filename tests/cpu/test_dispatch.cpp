// Dispatch metadata (docs/math.md section 2) through the C ABI on the reference backend, against a brute-force stable
// sort of the pairs by local expert: fixed and general routing, dropped pairs, a local expert range, and rows
// past the valid count left untouched.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <vector>

#include "common/test_util.h"

using moekit_test::HostTensor;
using moekit_test::ReferenceHandle;
using moekit_test::as_integers;

namespace {

// The expected layout, built the obvious way: stable-sort the valid pairs by local expert.
struct Layout {
  std::vector<int64_t> expert_offsets, gather_idx, pair_idx, grouped_pos;
};

Layout brute_force(const std::vector<int64_t>& pair_token, const std::vector<int64_t>& ids, int64_t experts,
                   int64_t expert_begin, int64_t pair_slots) {
  std::vector<int64_t> valid;
  for (size_t p = 0; p < ids.size(); ++p)
    if (ids[p] >= expert_begin && ids[p] < expert_begin + experts) valid.push_back(static_cast<int64_t>(p));
  std::stable_sort(valid.begin(), valid.end(), [&](int64_t a, int64_t b) {
    return ids[static_cast<size_t>(a)] < ids[static_cast<size_t>(b)];
  });
  Layout out;
  out.expert_offsets.assign(static_cast<size_t>(experts + 1), 0);
  out.grouped_pos.assign(static_cast<size_t>(pair_slots), -1);
  for (size_t i = 0; i < valid.size(); ++i) {
    int64_t p = valid[i];
    out.gather_idx.push_back(pair_token[static_cast<size_t>(p)]);
    out.pair_idx.push_back(p);
    out.grouped_pos[static_cast<size_t>(p)] = static_cast<int64_t>(i);
  }
  for (int64_t e = 0; e < experts; ++e)
    out.expert_offsets[static_cast<size_t>(e + 1)] =
        out.expert_offsets[static_cast<size_t>(e)] +
        std::count(ids.begin(), ids.end(), expert_begin + e);
  return out;
}

// A view that is never NULL, even for an empty tensor (NULL would read as "absent").
moekit_tensor_t view_of(HostTensor& t) {
  static int64_t dummy[1];
  moekit_tensor_t v = t.view();
  if (v.data == nullptr) v.data = dummy;
  return v;
}

// Runs dispatch and checks every output against the brute force, including that grouped rows >= Pv keep their
// poison.
void run_and_check(moekit_handle_t handle, const moekit_dispatch_desc_t& desc, HostTensor& indices,
                   HostTensor* tok_offsets, const std::vector<int64_t>& pair_token, int64_t pairs) {
  int64_t slots = desc.top_k > 0 ? indices.numel() : indices.rows();  // P = T*K, or P_max
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_dispatch_plan_create(handle, &desc, &plan));
  size_t workspace_bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &workspace_bytes));
  std::vector<uint8_t> workspace(workspace_bytes);

  HostTensor expert_offsets(MOEKIT_DTYPE_INT32, {desc.experts + 1});
  HostTensor gather_idx(MOEKIT_DTYPE_INT32, {slots}), pair_idx(MOEKIT_DTYPE_INT32, {slots});
  HostTensor grouped_pos(MOEKIT_DTYPE_INT32, {slots});
  for (HostTensor* t : {&expert_offsets, &gather_idx, &pair_idx, &grouped_pos}) t->poison();
  moekit_dispatch_args_t args;
  moekit_dispatch_args_init(&args);
  args.indices = view_of(indices);
  if (tok_offsets) args.tok_offsets = view_of(*tok_offsets);
  args.expert_offsets = view_of(expert_offsets);
  args.gather_idx = view_of(gather_idx);
  args.pair_idx = view_of(pair_idx);
  args.grouped_pos = view_of(grouped_pos);
  MOEKIT_REQUIRE_OK(moekit_dispatch(plan, &args, workspace.empty() ? nullptr : workspace.data(), workspace.size(),
                                    nullptr));
  moekit_plan_destroy(plan);

  std::vector<int64_t> ids = as_integers(indices);
  ids.resize(static_cast<size_t>(pairs));
  Layout want = brute_force(pair_token, ids, desc.experts, desc.expert_begin, slots);
  int64_t valid = want.expert_offsets.back();
  REQUIRE(as_integers(expert_offsets) == want.expert_offsets);
  REQUIRE(as_integers(grouped_pos) == want.grouped_pos);
  std::vector<int64_t> gathered = as_integers(gather_idx), paired = as_integers(pair_idx);
  REQUIRE(std::vector<int64_t>(gathered.begin(), gathered.begin() + valid) == want.gather_idx);
  REQUIRE(std::vector<int64_t>(paired.begin(), paired.begin() + valid) == want.pair_idx);
  HostTensor untouched(MOEKIT_DTYPE_INT32, {1});
  untouched.poison();
  for (int64_t i = valid; i < slots; ++i) {
    INFO("grouped row " << i << " past the " << valid << " valid pairs");
    REQUIRE(gather_idx.get(i) == untouched.get(0));
    REQUIRE(pair_idx.get(i) == untouched.get(0));
  }
}

struct FixedCase {
  const char* name;
  int64_t tokens, top_k, experts, expert_begin;
  int64_t id_lo, id_hi;  // ids drawn uniformly from [id_lo, id_hi)
};

}  // namespace

TEST_CASE("dispatch with fixed top-k is a stable sort of the valid pairs by local expert", "[dispatch]") {
  ReferenceHandle h;
  std::mt19937_64 rng(31337);
  const FixedCase cases[] = {
      {"whole range", 53, 4, 8, 0, 0, 8},
      {"negative ids dropped", 40, 3, 6, 0, -3, 6},
      {"local slice e0 > 0, other ranks dropped", 61, 5, 7, 9, 0, 24},
      {"more experts than pairs: empty experts", 3, 2, 17, 0, 0, 17},
      {"one expert takes every token", 29, 1, 5, 2, 4, 5},
      {"a single token", 1, 6, 9, 3, 0, 12},
      {"every pair dropped", 12, 2, 4, 100, 0, 50},
      {"no tokens", 0, 2, 4, 0, 0, 4},
  };
  for (const FixedCase& c : cases)
    for (moekit_dtype_t index_dtype : {MOEKIT_DTYPE_INT32, MOEKIT_DTYPE_INT64}) {
      INFO(c.name << ", indices dtype " << index_dtype);
      moekit_dispatch_desc_t desc;
      moekit_dispatch_desc_init(&desc);
      desc.max_tokens = std::max<int64_t>(c.tokens, 1);
      desc.top_k = c.top_k;
      desc.experts = c.experts;
      desc.expert_begin = c.expert_begin;
      HostTensor indices(index_dtype, {c.tokens, c.top_k});
      std::uniform_int_distribution<int64_t> id(c.id_lo, c.id_hi - 1);
      for (int64_t p = 0; p < indices.numel(); ++p) indices.set(p, static_cast<double>(id(rng)));
      std::vector<int64_t> pair_token(static_cast<size_t>(c.tokens * c.top_k));
      for (size_t p = 0; p < pair_token.size(); ++p) pair_token[p] = static_cast<int64_t>(p) / c.top_k;
      run_and_check(h.handle, desc, indices, nullptr, pair_token, c.tokens * c.top_k);
    }
}

TEST_CASE("dispatch drops int64 ids at the ends of the int64 range", "[dispatch]") {
  // NOTE: an id near INT64_MIN minus expert_begin does not fit int64; the local expert must be found without it.
  ReferenceHandle h;
  const double ids[] = {-9223372036854775808.0, 4.0, -4611686018427387904.0, 9.0, 4611686018427387904.0, 5.0,
                        -1.0,                   3.0, 9007199254740992.0,   6.0};
  moekit_dispatch_desc_t desc;
  moekit_dispatch_desc_init(&desc);
  desc.max_tokens = 5;
  desc.top_k = 2;
  desc.experts = 4;
  desc.expert_begin = 3;
  HostTensor indices(MOEKIT_DTYPE_INT64, {5, 2});
  for (int64_t p = 0; p < indices.numel(); ++p) indices.set(p, ids[p]);
  std::vector<int64_t> pair_token(10);
  for (size_t p = 0; p < pair_token.size(); ++p) pair_token[p] = static_cast<int64_t>(p) / 2;
  run_and_check(h.handle, desc, indices, nullptr, pair_token, 10);
}

TEST_CASE("dispatch with general routing: any number of pairs per token, including none", "[dispatch]") {
  ReferenceHandle h;
  std::mt19937_64 rng(8086);
  for (moekit_dtype_t index_dtype : {MOEKIT_DTYPE_INT32, MOEKIT_DTYPE_INT64})
    for (int64_t expert_begin : {0, 5}) {
      INFO("indices dtype " << index_dtype << ", e0 " << expert_begin);
      const int64_t T = 23, E = 6, max_pairs = 90;
      moekit_dispatch_desc_t desc;
      moekit_dispatch_desc_init(&desc);
      desc.max_tokens = T;
      desc.top_k = 0;
      desc.max_pairs = max_pairs;
      desc.experts = E;
      desc.expert_begin = expert_begin;
      // 0..5 pairs per token (tokens 0 and 7 get none), fewer than max_pairs in all.
      HostTensor tok_offsets(MOEKIT_DTYPE_INT32, {T + 1});
      std::uniform_int_distribution<int64_t> per_token(0, 5);
      std::vector<int64_t> pair_token;
      tok_offsets.set(0, 0);
      for (int64_t t = 0; t < T; ++t) {
        int64_t n = (t == 0 || t == 7) ? 0 : per_token(rng);
        for (int64_t j = 0; j < n; ++j) pair_token.push_back(t);
        tok_offsets.set(t + 1, static_cast<double>(pair_token.size()));
      }
      int64_t pairs = static_cast<int64_t>(pair_token.size());
      REQUIRE(pairs < max_pairs);
      HostTensor indices(index_dtype, {max_pairs});
      indices.poison();  // slots past tok_offsets[T] are no pairs and must not count
      std::uniform_int_distribution<int64_t> id(expert_begin - 2, expert_begin + E + 1);
      for (int64_t p = 0; p < pairs; ++p) indices.set(p, static_cast<double>(id(rng)));
      run_and_check(h.handle, desc, indices, &tok_offsets, pair_token, pairs);
    }
}

TEST_CASE("dispatch with general routing rejects more pairs than P_max", "[dispatch]") {
  ReferenceHandle h;
  const int64_t T = 4, E = 3, max_pairs = 6;
  moekit_dispatch_desc_t desc;
  moekit_dispatch_desc_init(&desc);
  desc.max_tokens = T;
  desc.top_k = 0;
  desc.max_pairs = max_pairs;
  desc.experts = E;
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_dispatch_plan_create(h.handle, &desc, &plan));
  size_t workspace_bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &workspace_bytes));
  std::vector<uint8_t> workspace(workspace_bytes);
  HostTensor tok_offsets(MOEKIT_DTYPE_INT32, {T + 1});
  tok_offsets.set_values({0, 2, 4, 6, 8});
  HostTensor indices(MOEKIT_DTYPE_INT32, {max_pairs});
  indices.set_values({0, 1, 2, 0, 1, 2});
  HostTensor expert_offsets(MOEKIT_DTYPE_INT32, {E + 1}), gather_idx(MOEKIT_DTYPE_INT32, {max_pairs}),
      pair_idx(MOEKIT_DTYPE_INT32, {max_pairs}), grouped_pos(MOEKIT_DTYPE_INT32, {max_pairs});
  for (HostTensor* t : {&expert_offsets, &gather_idx, &pair_idx, &grouped_pos}) t->poison();
  HostTensor poisoned = expert_offsets;
  moekit_dispatch_args_t args;
  moekit_dispatch_args_init(&args);
  args.indices = indices.view();
  args.tok_offsets = tok_offsets.view();
  args.expert_offsets = expert_offsets.view();
  args.gather_idx = gather_idx.view();
  args.pair_idx = pair_idx.view();
  args.grouped_pos = grouped_pos.view();
  moekit_status_t status =
      moekit_dispatch(plan, &args, workspace.empty() ? nullptr : workspace.data(), workspace.size(), nullptr);
  moekit_plan_destroy(plan);
  REQUIRE(status == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(moekit_test::last_error().find("tok_offsets") != std::string::npos);
  REQUIRE(expert_offsets.bytes_equal(poisoned));  // nothing written on failure
}
