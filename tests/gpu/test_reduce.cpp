// CUDA token reductions (docs/math.md section 6) against the reference backend through the C ABI, with section 9's
// metrics: combine and the broadcast backward (fixed top-k over T x K, variable top-k with 0..5 pairs per token),
// db1 and db2 + ds (empty experts, one expert taking every row, dropped pairs, storage or fp32 sums), beta 0 over
// NaN-poisoned outputs and beta 1, bf16 and fp16, grouped rows past the valid count poisoned (never read), bitwise
// determinism over reruns, buffers and two streams, NOT_SUPPORTED for what the kernels cannot serve, and one
// combine whose input has more than 2^31 elements ([large]).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_util.h"

using namespace moekit_test;

namespace {

// How pairs choose experts.
enum class Spread { random, some_empty, one_takes_all };

// Routing metadata as dispatch lays it out (docs/math.md section 2), built on the host by a stable sort: grouped rows
// past the valid count are poisoned, as a caller's P-row buffers are.
struct Routing {
  int64_t tokens = 0, top_k = 0, experts = 0, pairs = 0, valid = 0;
  HostTensor tok_offsets;  // [T+1] int32, variable top-k only
  HostTensor offsets;      // [E+1] int32
  HostTensor gather_idx;   // [P] int32
  HostTensor pair_idx;     // [P] int32
  HostTensor grouped_pos;  // [P] int32, -1 for dropped pairs
  std::vector<int64_t> expert_offsets;
};

// `counts` empty: fixed top-k K; otherwise variable top-k with counts[t] pairs for token t (top_k = 0).
Routing make_routing(std::mt19937_64& rng, int64_t tokens, int64_t top_k, const std::vector<int64_t>& counts,
                     int64_t experts, double drop, Spread spread) {
  Routing r;
  r.tokens = tokens;
  r.top_k = counts.empty() ? top_k : 0;
  r.experts = experts;
  std::vector<int64_t> token_of;
  if (counts.empty()) {
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t k = 0; k < top_k; ++k) token_of.push_back(t);
  } else {
    r.tok_offsets = HostTensor(MOEKIT_DTYPE_INT32, {tokens + 1});
    r.tok_offsets.set(0, 0);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t c = 0; c < counts[static_cast<size_t>(t)]; ++c) token_of.push_back(t);
      r.tok_offsets.set(t + 1, static_cast<double>(token_of.size()));
    }
  }
  r.pairs = static_cast<int64_t>(token_of.size());
  // Experts a pair may choose: all, every third one (the others stay empty), or expert E-1 alone.
  std::vector<int64_t> allowed;
  for (int64_t e = 0; e < experts; ++e)
    if (spread == Spread::random || (spread == Spread::some_empty && e % 3 == 1) ||
        (spread == Spread::one_takes_all && e == experts - 1))
      allowed.push_back(e);
  if (allowed.empty()) allowed.push_back(0);
  std::uniform_int_distribution<size_t> pick(0, allowed.size() - 1);
  std::bernoulli_distribution dropped(drop);
  std::vector<int64_t> expert(static_cast<size_t>(r.pairs));
  for (auto& e : expert) e = dropped(rng) ? -1 : allowed[pick(rng)];

  const int64_t rows = std::max<int64_t>(r.pairs, 1);
  r.offsets = HostTensor(MOEKIT_DTYPE_INT32, {experts + 1});
  r.gather_idx = HostTensor(MOEKIT_DTYPE_INT32, {rows});
  r.pair_idx = HostTensor(MOEKIT_DTYPE_INT32, {rows});
  r.grouped_pos = HostTensor(MOEKIT_DTYPE_INT32, {rows});
  r.gather_idx.poison();
  r.pair_idx.poison();
  r.grouped_pos.poison();
  r.expert_offsets.assign(static_cast<size_t>(experts + 1), 0);
  int64_t next = 0;
  for (int64_t p = 0; p < r.pairs; ++p) r.grouped_pos.set(p, -1);
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t p = 0; p < r.pairs; ++p)
      if (expert[static_cast<size_t>(p)] == e) {
        r.gather_idx.set(next, static_cast<double>(token_of[static_cast<size_t>(p)]));
        r.pair_idx.set(next, static_cast<double>(p));
        r.grouped_pos.set(p, static_cast<double>(next));
        ++next;
      }
    r.expert_offsets[static_cast<size_t>(e + 1)] = next;
  }
  for (int64_t e = 0; e <= experts; ++e) r.offsets.set(e, static_cast<double>(r.expert_offsets[static_cast<size_t>(e)]));
  r.valid = next;
  return r;
}

// A [P, width] tensor of random rows, rows past `valid` NaN (a kernel that reads them fails the comparison).
HostTensor grouped_rows(std::mt19937_64& rng, moekit_dtype_t dtype, int64_t rows, int64_t valid, int64_t width) {
  HostTensor t(dtype, {rows, width});
  t.fill_uniform(rng, 1.0);
  for (int64_t i = valid * width; i < rows * width; ++i) t.set(i, std::numeric_limits<double>::quiet_NaN());
  return t;
}

// An output before the call: random for beta 1, NaN for beta 0 (it must not leak into the result).
HostTensor initial_output(std::mt19937_64& rng, moekit_dtype_t dtype, std::vector<int64_t> shape, double beta) {
  HostTensor t(dtype, std::move(shape));
  if (beta != 0)
    t.fill_uniform(rng, 1.0);
  else
    t.poison();
  return t;
}

void require_close(const HostTensor& out, const HostTensor& ref, int64_t width, moekit_dtype_t bounds_dtype,
                   const std::vector<int64_t>& segments = {}) {
  const ErrorMetrics m = compare(out.values(), ref.values(), width, segments);
  INFO(describe(m));
  REQUIRE_FALSE(m.any_nan);
  REQUIRE(within(m, bounds_for(bounds_dtype)));
}

void sync(cudaStream_t stream) { CUDA_REQUIRE(cudaStreamSynchronize(stream)); }

// Uploads and memsets run on the legacy stream, which a non-blocking stream does not wait for.
void finish_uploads() { CUDA_REQUIRE(cudaDeviceSynchronize()); }

// ---------------------------------------------------------------------------------------------------------------
// Combine and broadcast backward
// ---------------------------------------------------------------------------------------------------------------

struct CombineInputs {
  moekit_combine_desc_t desc;
  bool weighted = true;
  double beta = 0;
  Routing routing;
  HostTensor grouped;  // [P, H]
  HostTensor scores;   // [T, K] or [P] fp32
  HostTensor out;      // [T, H] before the call
};

CombineInputs combine_inputs(std::mt19937_64& rng, moekit_dtype_t dtype, int64_t tokens, int64_t top_k,
                             int64_t hidden, const std::vector<int64_t>& counts, double drop, bool weighted,
                             double beta) {
  CombineInputs in;
  in.routing = make_routing(rng, tokens, top_k, counts, 8, drop, Spread::random);
  const Routing& r = in.routing;
  moekit_combine_desc_init(&in.desc);
  in.desc.max_tokens = tokens;
  in.desc.top_k = r.top_k;
  in.desc.max_pairs = std::max<int64_t>(r.pairs, 1);
  in.desc.hidden = hidden;
  in.desc.dtype = dtype;
  in.weighted = weighted;
  in.beta = beta;
  in.grouped = grouped_rows(rng, dtype, r.grouped_pos.rows(), r.valid, hidden);
  in.scores = r.top_k > 0 ? HostTensor(MOEKIT_DTYPE_FP32, {tokens, top_k}) : HostTensor(MOEKIT_DTYPE_FP32, {r.pairs});
  in.scores.fill_uniform(rng, 1.0);
  in.out = initial_output(rng, dtype, {tokens, hidden}, beta);
  return in;
}

// Fills the argument views: `grouped_pos` carries only the call's P pairs.
moekit_combine_args_t combine_args(const CombineInputs& in, moekit_tensor_t grouped, moekit_tensor_t scores,
                                   moekit_tensor_t grouped_pos, moekit_tensor_t tok_offsets, moekit_tensor_t out) {
  moekit_combine_args_t args;
  moekit_combine_args_init(&args);
  grouped.shape[0] = in.routing.pairs;
  grouped_pos.shape[0] = in.routing.pairs;
  args.grouped = grouped;
  if (in.weighted) args.scores = scores;
  args.grouped_pos = grouped_pos;
  if (in.routing.top_k == 0) args.tok_offsets = tok_offsets;
  args.out = out;
  args.beta = in.beta;
  return args;
}

moekit_status_t call_combine(moekit_plan_t plan, const CombineInputs& in, const moekit_combine_args_t& args,
                             void* stream) {
  return in.weighted ? moekit_combine(plan, &args, nullptr, 0, stream)
                     : moekit_broadcast_backward(plan, &args, nullptr, 0, stream);
}

HostTensor combine_reference(moekit_handle_t handle, CombineInputs& in) {
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_combine_plan_create(handle, &in.desc, &plan));
  HostTensor out = in.out;
  HostTensor tok_offsets = in.routing.tok_offsets;
  HostTensor grouped_pos = in.routing.grouped_pos;
  const moekit_combine_args_t args =
      combine_args(in, in.grouped.view(), in.scores.view(), grouped_pos.view(),
                   in.routing.top_k == 0 ? tok_offsets.view() : moekit_tensor_t{}, out.view());
  MOEKIT_REQUIRE_OK(call_combine(plan, in, args, nullptr));
  moekit_plan_destroy(plan);
  return out;
}

// Fresh device buffers on every call, so reruns also compare different buffers.
HostTensor combine_cuda(moekit_handle_t handle, CombineInputs& in, cudaStream_t stream) {
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_combine_plan_create(handle, &in.desc, &plan));
  DeviceTensor grouped(in.grouped), scores(in.scores), grouped_pos(in.routing.grouped_pos), out(in.out);
  DeviceTensor tok_offsets;
  if (in.routing.top_k == 0) tok_offsets = DeviceTensor(in.routing.tok_offsets);
  const moekit_combine_args_t args =
      combine_args(in, grouped.view(), scores.view(), grouped_pos.view(),
                   in.routing.top_k == 0 ? tok_offsets.view() : moekit_tensor_t{}, out.view());
  finish_uploads();
  MOEKIT_REQUIRE_OK(call_combine(plan, in, args, stream));
  sync(stream);
  moekit_plan_destroy(plan);
  return out.download();
}

void check_combine(Handles& handles, CombineInputs& in) {
  const HostTensor ref = combine_reference(handles.reference, in);
  const HostTensor out = combine_cuda(handles.cuda, in, nullptr);
  require_close(out, ref, in.desc.hidden, static_cast<moekit_dtype_t>(in.desc.dtype));
}

std::vector<int64_t> random_counts(std::mt19937_64& rng, int64_t tokens, int64_t most) {
  std::uniform_int_distribution<int64_t> count(0, most);
  std::vector<int64_t> counts(static_cast<size_t>(tokens));
  for (auto& c : counts) c = count(rng);
  return counts;
}

// ---------------------------------------------------------------------------------------------------------------
// db1 and db2 + ds
// ---------------------------------------------------------------------------------------------------------------

moekit_bias_grad_desc_t bias_desc(moekit_dtype_t dtype, moekit_dtype_t out_dtype, int64_t experts, int64_t rows,
                                  int64_t width, int64_t tokens) {
  moekit_bias_grad_desc_t desc;
  moekit_bias_grad_desc_init(&desc);
  desc.experts = experts;
  desc.max_rows = std::max<int64_t>(rows, 1);
  desc.width = width;
  desc.max_tokens = tokens;
  desc.dtype = dtype;
  desc.out_dtype = out_dtype;
  return desc;
}

// The plan's workspace on the device, filled with 0xff bytes (NaN floats, -1 ints): nothing may depend on it.
DeviceBuffer poisoned_workspace(moekit_plan_t plan) {
  size_t bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &bytes));
  DeviceBuffer workspace(bytes);
  if (bytes > 0) CUDA_REQUIRE(cudaMemset(workspace.data(), 0xff, bytes));
  return workspace;
}

struct Db1Inputs {
  moekit_bias_grad_desc_t desc;
  double beta = 0;
  Routing routing;
  HostTensor dh;   // [P, W]
  HostTensor db1;  // [E, W] before the call
};

Db1Inputs db1_inputs(std::mt19937_64& rng, moekit_dtype_t dtype, moekit_dtype_t out_dtype, int64_t rows,
                     int64_t experts, int64_t width, Spread spread, double beta) {
  Db1Inputs in;
  // db1 reads grouped rows only: a routing of `rows` one-pair tokens gives the expert offsets.
  in.routing = make_routing(rng, rows, 1, {}, experts, 0.1, spread);
  in.desc = bias_desc(dtype, out_dtype, experts, rows, width, 0);
  in.beta = beta;
  in.dh = grouped_rows(rng, dtype, in.routing.gather_idx.rows(), in.routing.valid, width);
  in.db1 = initial_output(rng, out_dtype, {experts, width}, beta);
  return in;
}

HostTensor db1_reference(moekit_handle_t handle, Db1Inputs& in) {
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_bias_grad_plan_create(handle, &in.desc, &plan));
  size_t bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &bytes));
  std::vector<uint8_t> workspace(bytes);
  HostTensor out = in.db1;
  HostTensor offsets = in.routing.offsets;
  moekit_db1_args_t args;
  moekit_db1_args_init(&args);
  args.dh = in.dh.view();
  args.offsets = offsets.view();
  args.db1 = out.view();
  args.beta = in.beta;
  MOEKIT_REQUIRE_OK(moekit_db1(plan, &args, workspace.data(), bytes, nullptr));
  moekit_plan_destroy(plan);
  return out;
}

HostTensor db1_cuda(moekit_handle_t handle, Db1Inputs& in, cudaStream_t stream) {
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_bias_grad_plan_create(handle, &in.desc, &plan));
  DeviceBuffer workspace = poisoned_workspace(plan);
  DeviceTensor dh(in.dh), offsets(in.routing.offsets), out(in.db1);
  moekit_db1_args_t args;
  moekit_db1_args_init(&args);
  args.dh = dh.view();
  args.offsets = offsets.view();
  args.db1 = out.view();
  args.beta = in.beta;
  finish_uploads();
  MOEKIT_REQUIRE_OK(moekit_db1(plan, &args, workspace.data(), workspace.bytes(), stream));
  sync(stream);
  moekit_plan_destroy(plan);
  return out.download();
}

std::vector<int64_t> expert_rows_segments(int64_t experts) {
  std::vector<int64_t> segments(static_cast<size_t>(experts + 1));
  for (int64_t e = 0; e <= experts; ++e) segments[static_cast<size_t>(e)] = e;
  return segments;
}

void check_db1(Handles& handles, Db1Inputs& in) {
  const HostTensor ref = db1_reference(handles.reference, in);
  const HostTensor out = db1_cuda(handles.cuda, in, nullptr);
  // NOTE: fp32 sums of bf16 rows are held to the bf16 bounds (docs/math.md section 9).
  require_close(out, ref, in.desc.width, static_cast<moekit_dtype_t>(in.desc.dtype),
                expert_rows_segments(in.desc.experts));
}

struct Db2Inputs {
  moekit_bias_grad_desc_t desc;
  double beta = 0;
  bool with_db2 = true, with_b2 = true;
  Routing routing;
  HostTensor dout;     // [T, H]
  HostTensor scores;   // [T, K] fp32
  HostTensor b2;       // [E, H]
  HostTensor db2;      // [E, H] before the call
  HostTensor dscores;  // [T, K] fp32 before the call
};

Db2Inputs db2_inputs(std::mt19937_64& rng, moekit_dtype_t dtype, moekit_dtype_t out_dtype, int64_t tokens,
                     int64_t top_k, int64_t experts, int64_t hidden, double drop, Spread spread, double beta,
                     bool with_db2, bool with_b2) {
  Db2Inputs in;
  in.routing = make_routing(rng, tokens, top_k, {}, experts, drop, spread);
  in.desc = bias_desc(dtype, out_dtype, experts, in.routing.pairs, hidden, tokens);
  in.beta = beta;
  in.with_db2 = with_db2;
  in.with_b2 = with_b2;
  in.dout = HostTensor(dtype, {tokens, hidden});
  in.dout.fill_uniform(rng, 1.0);
  in.scores = HostTensor(MOEKIT_DTYPE_FP32, {tokens, top_k});
  in.scores.fill_uniform(rng, 1.0);
  in.b2 = HostTensor(dtype, {experts, hidden});
  in.b2.fill_uniform(rng, 1.0);
  in.db2 = initial_output(rng, out_dtype, {experts, hidden}, beta);
  in.dscores = HostTensor(MOEKIT_DTYPE_FP32, {tokens, top_k});
  in.dscores.fill_uniform(rng, 1.0);
  return in;
}

struct Db2Outputs {
  HostTensor db2, dscores;
};

moekit_db2_ds_args_t db2_args(const Db2Inputs& in, moekit_tensor_t dout, moekit_tensor_t scores, moekit_tensor_t b2,
                              moekit_tensor_t offsets, moekit_tensor_t gather_idx, moekit_tensor_t pair_idx,
                              moekit_tensor_t db2, moekit_tensor_t dscores) {
  moekit_db2_ds_args_t args;
  moekit_db2_ds_args_init(&args);
  gather_idx.shape[0] = in.routing.pairs;
  pair_idx.shape[0] = in.routing.pairs;
  args.dout = dout;
  args.scores = scores;
  if (in.with_b2) args.b2 = b2;
  args.offsets = offsets;
  args.gather_idx = gather_idx;
  args.pair_idx = pair_idx;
  if (in.with_db2) args.db2 = db2;
  args.dscores = dscores;
  args.beta = in.beta;
  return args;
}

Db2Outputs db2_reference(moekit_handle_t handle, Db2Inputs& in) {
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_bias_grad_plan_create(handle, &in.desc, &plan));
  size_t bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &bytes));
  std::vector<uint8_t> workspace(bytes);
  Db2Outputs out{in.db2, in.dscores};
  HostTensor offsets = in.routing.offsets, gather_idx = in.routing.gather_idx, pair_idx = in.routing.pair_idx;
  const moekit_db2_ds_args_t args = db2_args(in, in.dout.view(), in.scores.view(), in.b2.view(), offsets.view(),
                                             gather_idx.view(), pair_idx.view(), out.db2.view(), out.dscores.view());
  MOEKIT_REQUIRE_OK(moekit_db2_ds(plan, &args, workspace.data(), bytes, nullptr));
  moekit_plan_destroy(plan);
  return out;
}

Db2Outputs db2_cuda(moekit_handle_t handle, Db2Inputs& in, cudaStream_t stream) {
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_bias_grad_plan_create(handle, &in.desc, &plan));
  DeviceBuffer workspace = poisoned_workspace(plan);
  DeviceTensor dout(in.dout), scores(in.scores), b2(in.b2), offsets(in.routing.offsets);
  DeviceTensor gather_idx(in.routing.gather_idx), pair_idx(in.routing.pair_idx), db2(in.db2), dscores(in.dscores);
  const moekit_db2_ds_args_t args = db2_args(in, dout.view(), scores.view(), b2.view(), offsets.view(),
                                             gather_idx.view(), pair_idx.view(), db2.view(), dscores.view());
  finish_uploads();
  MOEKIT_REQUIRE_OK(moekit_db2_ds(plan, &args, workspace.data(), workspace.bytes(), stream));
  sync(stream);
  moekit_plan_destroy(plan);
  return Db2Outputs{db2.download(), dscores.download()};
}

void check_db2(Handles& handles, Db2Inputs& in) {
  const Db2Outputs ref = db2_reference(handles.reference, in);
  const Db2Outputs out = db2_cuda(handles.cuda, in, nullptr);
  const auto bounds_dtype = static_cast<moekit_dtype_t>(in.desc.dtype);
  if (in.with_db2) {
    INFO("db2");
    require_close(out.db2, ref.db2, in.desc.width, bounds_dtype, expert_rows_segments(in.desc.experts));
  } else {
    REQUIRE(out.db2.bytes_equal(in.db2));
  }
  // ds: every pair of a token is one row; a dropped pair's entry (and every entry without b2) is untouched.
  if (in.with_b2) {
    INFO("ds");
    require_close(out.dscores, ref.dscores, in.routing.top_k, bounds_dtype);
  }
  for (int64_t p = 0; p < in.routing.pairs; ++p)
    if (!in.with_b2 || in.routing.grouped_pos.get(p) < 0) {
      INFO("pair " << p);
      REQUIRE(out.dscores.get(p) == in.dscores.get(p));
    }
}

}  // namespace

TEST_CASE("combine and broadcast backward match the reference over T x K, dropped pairs, beta 0 and 1",
          "[gpu][reduce][combine]") {
  Handles handles;
  std::mt19937_64 rng(301);
  const moekit_dtype_t dtype = GENERATE(MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP16);
  const int64_t tokens = GENERATE(1, 7, 4096);
  const int64_t top_k = GENERATE(1, 2, 8, 16);
  // H = 8: one vector per row (256 tokens per block); 2056: more vectors than a block has threads; 264 otherwise.
  const int64_t hidden = tokens == 4096 ? 264 : tokens == 7 ? 2056 : 8;
  const bool weighted = GENERATE(true, false);
  const double beta = GENERATE(0.0, 1.0);
  const double drop = top_k == 2 ? 0.0 : 0.25;
  INFO("dtype " << dtype << " T " << tokens << " K " << top_k << " H " << hidden << " weighted " << weighted
                << " beta " << beta);
  CombineInputs in = combine_inputs(rng, dtype, tokens, top_k, hidden, {}, drop, weighted, beta);
  check_combine(handles, in);
}

TEST_CASE("combine matches the reference at T = 32768", "[gpu][reduce][combine]") {
  Handles handles;
  std::mt19937_64 rng(302);
  CombineInputs in = combine_inputs(rng, MOEKIT_DTYPE_BF16, 32768, 8, 128, {}, 0.1, true, 0.0);
  check_combine(handles, in);
}

// The combine's grid holds only the blocks resident at once (cuda/reduce/combine.cuh; with 132 SMs 396 many-pairs or
// 264 few-pairs blocks of 256 threads), so here each token group walks several tokens, and each token takes several
// steps: many pairs over two vector steps (H = 2056: 257 vectors in 256 threads, ~10 tokens per group), few pairs
// over two vector steps of two pair chunks each (K = 3, H = 8200: 1025 vectors, 4 per thread, ~4 tokens per group)
// and few pairs with 64 groups per block (K = 2, H = 128, ~2 tokens per group).
TEST_CASE("combine walks several tokens per token group, several steps per token", "[gpu][reduce][combine]") {
  Handles handles;
  std::mt19937_64 rng(306);
  const auto [tokens, top_k, hidden] =
      GENERATE(table<int64_t, int64_t, int64_t>({{4096, 8, 2056}, {1027, 3, 8200}, {32768, 2, 128}}));
  const double beta = GENERATE(0.0, 1.0);
  INFO("T " << tokens << " K " << top_k << " H " << hidden << " beta " << beta);
  CombineInputs in = combine_inputs(rng, MOEKIT_DTYPE_BF16, tokens, top_k, hidden, {}, 0.1, true, beta);
  check_combine(handles, in);
}

// Token groups of every kind combine_token_threads makes (cuda/reduce/combine.cuh), for both kernel variants. Many
// pairs (K = 8, one vector per thread): whole warps that are not a power of two (H = 1536: 192 threads, one token
// per block; H = 768: 96, two per block), a partial last warp (H = 776: 97 vectors in 128 threads) and a power of
// two below a warp (H = 200: 25 vectors in 32 threads, 8 tokens per block). Few pairs (K = 2, 3, 4: four vectors
// per thread, the last step of a thread partly past the row): H = 1536 in 64 threads, 768 in 32 (24 needed), 776
// in 32 (97 vectors), 200 in 8 (25 vectors); K = 3 leaves the second pair of each pass empty. A token count that
// leaves the last block partly empty.
TEST_CASE("combine over token groups of whole warps, a partial warp and below a warp", "[gpu][reduce][combine]") {
  Handles handles;
  std::mt19937_64 rng(305);
  const int64_t top_k = GENERATE(8, 4, 3, 2);
  const int64_t hidden = GENERATE(1536, 768, 776, 200);
  const bool weighted = GENERATE(true, false);
  INFO("K " << top_k << " H " << hidden << " weighted " << weighted);
  CombineInputs in = combine_inputs(rng, MOEKIT_DTYPE_BF16, 1027, top_k, hidden, {}, 0.1, weighted, 0.0);
  check_combine(handles, in);
}

TEST_CASE("variable top-k combine and broadcast backward (0..5 pairs per token) match the reference",
          "[sanitize][gpu][reduce][combine]") {
  Handles handles;
  std::mt19937_64 rng(303);
  const moekit_dtype_t dtype = GENERATE(MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP16);
  const int64_t tokens = GENERATE(1, 7, 4096);
  const bool weighted = GENERATE(true, false);
  const double beta = GENERATE(0.0, 1.0);
  INFO("dtype " << dtype << " T " << tokens << " weighted " << weighted << " beta " << beta);
  std::vector<int64_t> counts = random_counts(rng, tokens, 5);
  counts[0] = 0;  // a token without pairs gets beta * out (0 with beta = 0)
  CombineInputs in = combine_inputs(rng, dtype, tokens, 0, 1032, counts, 0.2, weighted, beta);
  check_combine(handles, in);
}

TEST_CASE("combine keeps a row stride past H and a score row stride past K", "[sanitize][gpu][reduce][combine]") {
  Handles handles;
  std::mt19937_64 rng(304);
  const int64_t tokens = 300, top_k = 4, hidden = 136, pad_h = 24, pad_k = 3;
  CombineInputs in = combine_inputs(rng, MOEKIT_DTYPE_BF16, tokens, top_k, hidden, {}, 0.2, true, 1.0);
  const HostTensor ref = combine_reference(handles.reference, in);

  // The same values in padded buffers: padding NaN (never read) and, for out, NaN it must keep.
  HostTensor grouped_padded(MOEKIT_DTYPE_BF16, {in.grouped.rows(), hidden + pad_h});
  HostTensor out_padded(MOEKIT_DTYPE_BF16, {tokens, hidden + pad_h});
  HostTensor scores_padded(MOEKIT_DTYPE_FP32, {tokens, top_k + pad_k});
  grouped_padded.poison();
  out_padded.poison();
  scores_padded.poison();
  for (int64_t r = 0; r < in.grouped.rows(); ++r)
    for (int64_t h = 0; h < hidden; ++h) grouped_padded.set(r * (hidden + pad_h) + h, in.grouped.get(r * hidden + h));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < hidden; ++h) out_padded.set(t * (hidden + pad_h) + h, in.out.get(t * hidden + h));
    for (int64_t k = 0; k < top_k; ++k) scores_padded.set(t * (top_k + pad_k) + k, in.scores.get(t * top_k + k));
  }
  DeviceTensor grouped(grouped_padded), out(out_padded), scores(scores_padded), grouped_pos(in.routing.grouped_pos);
  moekit_tensor_t grouped_view = grouped.view(), out_view = out.view(), scores_view = scores.view();
  grouped_view.shape[1] = hidden;
  out_view.shape[1] = hidden;
  scores_view.shape[1] = top_k;
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_combine_plan_create(handles.cuda, &in.desc, &plan));
  const moekit_combine_args_t args =
      combine_args(in, grouped_view, scores_view, grouped_pos.view(), moekit_tensor_t{}, out_view);
  MOEKIT_REQUIRE_OK(moekit_combine(plan, &args, nullptr, 0, nullptr));
  sync(nullptr);
  moekit_plan_destroy(plan);
  const HostTensor padded = out.download();
  HostTensor result(MOEKIT_DTYPE_BF16, {tokens, hidden});
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < hidden; ++h) result.set(t * hidden + h, padded.get(t * (hidden + pad_h) + h));
    for (int64_t h = hidden; h < hidden + pad_h; ++h) REQUIRE(std::isnan(padded.get(t * (hidden + pad_h) + h)));
  }
  require_close(result, ref, hidden, MOEKIT_DTYPE_BF16);
}

TEST_CASE("combine is bitwise deterministic over reruns, buffers and two streams", "[gpu][reduce][combine]") {
  Handles handles;
  std::mt19937_64 rng(305);
  const double beta = GENERATE(0.0, 1.0);
  const int64_t top_k = GENERATE(8, 2);  // both kernel variants
  CombineInputs in = combine_inputs(rng, MOEKIT_DTYPE_BF16, 4096, top_k, 1024, {}, 0.1, true, beta);
  const HostTensor first = combine_cuda(handles.cuda, in, nullptr);
  for (int rerun = 0; rerun < 2; ++rerun) REQUIRE(combine_cuda(handles.cuda, in, nullptr).bytes_equal(first));
  cudaStream_t a = nullptr, b = nullptr;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  REQUIRE(combine_cuda(handles.cuda, in, a).bytes_equal(first));
  REQUIRE(combine_cuda(handles.cuda, in, b).bytes_equal(first));
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST_CASE("combine reports NOT_SUPPORTED for fp32 storage and for H not a multiple of 8", "[gpu][reduce][combine]") {
  Handles handles;
  std::mt19937_64 rng(306);
  const bool fp32 = GENERATE(true, false);
  const moekit_dtype_t dtype = fp32 ? MOEKIT_DTYPE_FP32 : MOEKIT_DTYPE_BF16;
  CombineInputs in = combine_inputs(rng, dtype, 5, 2, fp32 ? 16 : 12, {}, 0.0, true, 0.0);
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_combine_plan_create(handles.cuda, &in.desc, &plan));
  DeviceTensor grouped(in.grouped), scores(in.scores), grouped_pos(in.routing.grouped_pos), out(in.out);
  const moekit_combine_args_t args =
      combine_args(in, grouped.view(), scores.view(), grouped_pos.view(), moekit_tensor_t{}, out.view());
  REQUIRE(moekit_combine(plan, &args, nullptr, 0, nullptr) == MOEKIT_STATUS_NOT_SUPPORTED);
  REQUIRE(last_error().find("grouped") == 0);
  REQUIRE(out.download().bytes_equal(in.out));
  moekit_plan_destroy(plan);
}

TEST_CASE("a combine input with more than 2^31 elements is addressed with 64-bit offsets", "[gpu][reduce][large]") {
  Handles handles;
  std::mt19937_64 rng(307);
  const int64_t tokens = 65600, top_k = 8, hidden = 4096, pairs = tokens * top_k;
  REQUIRE(pairs * hidden > (int64_t{1} << 31));
  // y is zero except the rows the checked tokens read; pair p reads row P-1-p, so token 0 reads the last rows,
  // which start past element 2^31.
  DeviceBuffer grouped(static_cast<size_t>(pairs * hidden) * 2);
  DeviceBuffer out(static_cast<size_t>(tokens * hidden) * 2);
  CUDA_REQUIRE(cudaMemset(grouped.data(), 0, grouped.bytes()));
  CUDA_REQUIRE(cudaMemset(out.data(), 0xff, out.bytes()));
  HostTensor grouped_pos(MOEKIT_DTYPE_INT32, {pairs});
  std::bernoulli_distribution dropped(0.1);
  for (int64_t p = 0; p < pairs; ++p) grouped_pos.set(p, dropped(rng) ? -1 : static_cast<double>(pairs - 1 - p));
  HostTensor scores(MOEKIT_DTYPE_FP32, {tokens, top_k});
  scores.fill_uniform(rng, 1.0);

  std::vector<int64_t> checked;
  for (int64_t t = 0; t < 16; ++t) checked.push_back(t);
  for (int64_t t = tokens - 16; t < tokens; ++t) checked.push_back(t);
  std::uniform_int_distribution<int64_t> any(16, tokens - 17);
  for (int i = 0; i < 32; ++i) checked.push_back(any(rng));
  std::vector<double> ref;
  for (int64_t t : checked) {
    std::vector<double> sum(static_cast<size_t>(hidden), 0.0);
    for (int64_t k = 0; k < top_k; ++k) {
      const int64_t p = t * top_k + k, row = static_cast<int64_t>(grouped_pos.get(p));
      if (row < 0) continue;
      HostTensor values(MOEKIT_DTYPE_BF16, {hidden});
      values.fill_uniform(rng, 1.0);
      CUDA_REQUIRE(cudaMemcpy(static_cast<char*>(grouped.data()) + row * hidden * 2, values.data(),
                              static_cast<size_t>(hidden) * 2, cudaMemcpyHostToDevice));
      for (int64_t h = 0; h < hidden; ++h) sum[static_cast<size_t>(h)] += scores.get(p) * values.get(h);
    }
    ref.insert(ref.end(), sum.begin(), sum.end());
  }

  moekit_combine_desc_t desc;
  moekit_combine_desc_init(&desc);
  desc.max_tokens = tokens;
  desc.top_k = top_k;
  desc.hidden = hidden;
  desc.dtype = MOEKIT_DTYPE_BF16;
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_combine_plan_create(handles.cuda, &desc, &plan));
  DeviceTensor scores_d(scores), grouped_pos_d(grouped_pos);
  const moekit_device_t device{MOEKIT_DEVICE_CUDA, 0};
  const int64_t grouped_shape[2] = {pairs, hidden}, out_shape[2] = {tokens, hidden};
  moekit_combine_args_t args;
  moekit_combine_args_init(&args);
  args.grouped = moekit_tensor_make(grouped.data(), MOEKIT_DTYPE_BF16, 2, grouped_shape, device);
  args.scores = scores_d.view();
  args.grouped_pos = grouped_pos_d.view();
  args.out = moekit_tensor_make(out.data(), MOEKIT_DTYPE_BF16, 2, out_shape, device);
  MOEKIT_REQUIRE_OK(moekit_combine(plan, &args, nullptr, 0, nullptr));
  sync(nullptr);
  moekit_plan_destroy(plan);

  HostTensor row(MOEKIT_DTYPE_BF16, {hidden});
  std::vector<double> result;
  for (int64_t t : checked) {
    CUDA_REQUIRE(cudaMemcpy(row.data(), static_cast<char*>(out.data()) + t * hidden * 2,
                            static_cast<size_t>(hidden) * 2, cudaMemcpyDeviceToHost));
    const std::vector<double> values = row.values();
    result.insert(result.end(), values.begin(), values.end());
  }
  const ErrorMetrics m = compare(result, ref, hidden);
  INFO(describe(m));
  REQUIRE_FALSE(m.any_nan);
  REQUIRE(within(m, bounds_for(MOEKIT_DTYPE_BF16)));
}

TEST_CASE("db1 matches the reference: empty experts, one expert with every row, storage or fp32 sums, beta 0 and 1",
          "[gpu][reduce][db1]") {
  Handles handles;
  std::mt19937_64 rng(311);
  const moekit_dtype_t dtype = GENERATE(MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP16);
  const int64_t rows = GENERATE(1, 7, 4096, 30000);
  const Spread spread = GENERATE(Spread::random, Spread::some_empty, Spread::one_takes_all);
  const double beta = GENERATE(0.0, 1.0);
  // Both sum dtypes meet both storage dtypes and both betas.
  const bool fp32_sums = (dtype == MOEKIT_DTYPE_BF16) == (beta == 0.0);
  // Widths: one vector (a 32-thread block with 31 idle), 264 (a partial block), 2048 (the layer's db1 width, 2I),
  // 520 (65 vectors: a 128-thread block, 1024-row chunks).
  const int64_t width = rows == 1 ? 8 : rows == 7 ? 264 : rows == 4096 ? 2048 : 520;
  const int64_t experts = rows == 30000 ? 37 : 8;
  INFO("dtype " << dtype << " fp32 sums " << fp32_sums << " P " << rows << " W " << width << " E " << experts
                << " spread " << static_cast<int>(spread) << " beta " << beta);
  Db1Inputs in = db1_inputs(rng, dtype, fp32_sums ? MOEKIT_DTYPE_FP32 : dtype, rows, experts, width, spread, beta);
  check_db1(handles, in);
}

TEST_CASE("db2 and ds match the reference over T x K, dropped pairs, with and without db2 or b2",
          "[gpu][reduce][db2_ds]") {
  Handles handles;
  std::mt19937_64 rng(312);
  const moekit_dtype_t dtype = GENERATE(MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP16);
  const int64_t tokens = GENERATE(1, 7, 4096);
  const int64_t top_k = GENERATE(1, 2, 8, 16);
  const int parts = GENERATE(0, 1, 2);  // 0: db2 and ds, 1: db2 only, 2: ds only
  const double beta = (parts + top_k) % 2 == 0 ? 0.0 : 1.0;
  const int64_t hidden = tokens == 4096 ? 264 : 2056;
  const Spread spread = tokens == 7 ? Spread::some_empty : Spread::random;
  INFO("dtype " << dtype << " T " << tokens << " K " << top_k << " H " << hidden << " parts " << parts << " beta "
                << beta);
  Db2Inputs in = db2_inputs(rng, dtype, dtype, tokens, top_k, 37, hidden, 0.2, spread, beta, parts != 2, parts != 1);
  check_db2(handles, in);
}

TEST_CASE("db2 in fp32 with one expert taking every pair matches the reference", "[sanitize][gpu][reduce][db2_ds]") {
  Handles handles;
  std::mt19937_64 rng(313);
  Db2Inputs in =
      db2_inputs(rng, MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP32, 2048, 8, 16, 4096, 0.0, Spread::one_takes_all, 1.0, true,
                 true);
  check_db2(handles, in);
}

TEST_CASE("db1 and db2 + ds are bitwise deterministic over reruns, buffers and two streams", "[gpu][reduce][db1]") {
  Handles handles;
  std::mt19937_64 rng(314);
  Db1Inputs d1 = db1_inputs(rng, MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP32, 20000, 16, 2048, Spread::random, 0.0);
  Db2Inputs d2 =
      db2_inputs(rng, MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_BF16, 2048, 8, 16, 1024, 0.1, Spread::random, 1.0, true, true);
  const HostTensor first1 = db1_cuda(handles.cuda, d1, nullptr);
  const Db2Outputs first2 = db2_cuda(handles.cuda, d2, nullptr);
  const auto same = [&](cudaStream_t stream) {
    REQUIRE(db1_cuda(handles.cuda, d1, stream).bytes_equal(first1));
    const Db2Outputs again = db2_cuda(handles.cuda, d2, stream);
    REQUIRE(again.db2.bytes_equal(first2.db2));
    REQUIRE(again.dscores.bytes_equal(first2.dscores));
  };
  same(nullptr);
  same(nullptr);
  cudaStream_t a = nullptr, b = nullptr;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  same(a);
  same(b);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST_CASE("the metrics catch one corrupted db1 row", "[sanitize][gpu][reduce][db1]") {
  Handles handles;
  std::mt19937_64 rng(315);
  Db1Inputs in = db1_inputs(rng, MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_BF16, 4096, 8, 264, Spread::random, 0.0);
  const HostTensor ref = db1_reference(handles.reference, in);
  HostTensor out = db1_cuda(handles.cuda, in, nullptr);
  REQUIRE(within(compare(out.values(), ref.values(), 264, expert_rows_segments(8)), bounds_for(MOEKIT_DTYPE_BF16)));
  for (int64_t h = 0; h < 264; ++h) out.set(3 * 264 + h, out.get(3 * 264 + h) * 1.1);
  REQUIRE_FALSE(
      within(compare(out.values(), ref.values(), 264, expert_rows_segments(8)), bounds_for(MOEKIT_DTYPE_BF16)));
}
