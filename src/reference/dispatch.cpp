// Dispatch metadata (docs/math.md section 2): a stable counting sort of the valid pairs by local expert, and the
// reference backend's dispatch operation (fixed top-k and general routing).
#include <string>
#include <vector>

#include "cuda/common/status_error.h"
#include "src/reference/blocks.h"
#include "src/reference/dense.h"
#include "src/reference/reference_backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

namespace {

// pair_token[p] is the token of pair p; expert_ids[p] its global expert id.
Csr counting_sort(int64_t pairs, const std::vector<int64_t>& pair_token, int64_t experts, int64_t expert_begin,
                  const int64_t* expert_ids) {
  // NOTE: id >= expert_begin >= 0 is checked before subtracting: an int64 id near INT64_MIN must not wrap around.
  auto local_expert = [&](int64_t p) {
    int64_t id = expert_ids[p];
    return id >= expert_begin && id - expert_begin < experts ? id - expert_begin : int64_t{-1};
  };
  Csr csr;
  csr.expert_offsets.assign(static_cast<size_t>(experts + 1), 0);
  for (int64_t p = 0; p < pairs; ++p) {
    int64_t e = local_expert(p);
    if (e >= 0) ++csr.expert_offsets[static_cast<size_t>(e + 1)];
  }
  for (int64_t e = 0; e < experts; ++e)
    csr.expert_offsets[static_cast<size_t>(e + 1)] += csr.expert_offsets[static_cast<size_t>(e)];
  int64_t valid = csr.expert_offsets[static_cast<size_t>(experts)];
  csr.gather_idx.resize(static_cast<size_t>(valid));
  csr.pair_idx.resize(static_cast<size_t>(valid));
  csr.grouped_pos.assign(static_cast<size_t>(pairs), -1);
  // Visiting pairs in ascending p makes the sort stable: ascending p inside each expert.
  std::vector<int64_t> cursor(csr.expert_offsets.begin(), csr.expert_offsets.end() - 1);
  for (int64_t p = 0; p < pairs; ++p) {
    int64_t e = local_expert(p);
    if (e < 0) continue;
    int64_t i = cursor[static_cast<size_t>(e)]++;
    csr.gather_idx[static_cast<size_t>(i)] = pair_token[static_cast<size_t>(p)];
    csr.pair_idx[static_cast<size_t>(i)] = p;
    csr.grouped_pos[static_cast<size_t>(p)] = i;
  }
  return csr;
}

void check_tok_offsets(int64_t tokens, const int64_t* tok_offsets, int64_t max_pairs) {
  if (tok_offsets[0] != 0)
    throw_invalid("tok_offsets: tok_offsets[0] must be 0, got " + std::to_string(tok_offsets[0]));
  for (int64_t t = 0; t < tokens; ++t)
    if (tok_offsets[t + 1] < tok_offsets[t])
      throw_invalid("tok_offsets: must be non-decreasing, but tok_offsets[" + std::to_string(t + 1) + "] = " +
                    std::to_string(tok_offsets[t + 1]) + " < tok_offsets[" + std::to_string(t) + "] = " +
                    std::to_string(tok_offsets[t]));
  if (tok_offsets[tokens] > max_pairs)
    throw_invalid("tok_offsets: tok_offsets[T] = " + std::to_string(tok_offsets[tokens]) +
                  " pairs exceed the pair bound P_max = " + std::to_string(max_pairs));
}

}  // namespace

Csr dispatch_fixed(int64_t tokens, int64_t top_k, int64_t experts, int64_t expert_begin, const int64_t* indices) {
  int64_t pairs = tokens * top_k;
  std::vector<int64_t> pair_token(static_cast<size_t>(pairs));
  for (int64_t p = 0; p < pairs; ++p) pair_token[static_cast<size_t>(p)] = p / top_k;
  return counting_sort(pairs, pair_token, experts, expert_begin, indices);
}

Csr dispatch_general(int64_t tokens, const int64_t* tok_offsets, int64_t experts, int64_t expert_begin,
                     const int64_t* expert_ids) {
  int64_t pairs = tok_offsets[tokens];
  std::vector<int64_t> pair_token(static_cast<size_t>(pairs));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t p = tok_offsets[t]; p < tok_offsets[t + 1]; ++p) pair_token[static_cast<size_t>(p)] = t;
  return counting_sort(pairs, pair_token, experts, expert_begin, expert_ids);
}

void ReferenceBackend::dispatch(const moekit_plan& plan, const moekit_dispatch_args_t& args, Workspace, void*) {
  const moekit_dispatch_desc_t& d = plan.dispatch;
  Csr csr;
  if (d.top_k > 0) {
    int64_t tokens = args.indices.shape[0];
    std::vector<int64_t> indices = read_indices(args.indices);
    csr = dispatch_fixed(tokens, d.top_k, d.experts, d.expert_begin, indices.data());
  } else {
    int64_t tokens = args.tok_offsets.shape[0] - 1;
    int64_t max_pairs = args.indices.shape[0];
    std::vector<int64_t> tok_offsets = read_indices(args.tok_offsets);
    check_tok_offsets(tokens, tok_offsets.data(), max_pairs);
    std::vector<int64_t> expert_ids = read_indices(args.indices, tok_offsets[static_cast<size_t>(tokens)]);
    csr = dispatch_general(tokens, tok_offsets.data(), d.experts, d.expert_begin, expert_ids.data());
    // Pair slots past tok_offsets[T] hold no pair: they read as dropped.
    csr.grouped_pos.resize(static_cast<size_t>(max_pairs), -1);
  }
  int64_t valid = csr.expert_offsets.back();
  write_indices(args.expert_offsets, csr.expert_offsets);
  write_indices(args.gather_idx, csr.gather_idx, 0, valid);
  write_indices(args.pair_idx, csr.pair_idx, 0, valid);
  write_indices(args.grouped_pos, csr.grouped_pos);
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
