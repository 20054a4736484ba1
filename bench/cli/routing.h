// Real routing for the cases that take routing as input (router backward, dispatch, grouped GEMM, combine, ...):
// moekit's own router (SOFTMAX_TOPK) on random logits, then moekit's dispatch, both run once on a reference
// handle on the host, so a case sees the same routing whichever backend it is timed on. The logits are uniform in
// [-1, 1), or for lognormal routing (case_config.h) those same values plus a per-expert offset: log w_e with
// w_e ~ lognormal(0, sigma) (i.e. sigma * N(0, 1)), and -1e4 for the experts left empty.
#pragma once

#include <cstdint>
#include <vector>

#include "case_config.h"
#include "case_result.h"
#include "moekit/moekit.h"

namespace moekit_bench {

struct Routing {
  int64_t tokens = 0, experts = 0, top_k = 0;
  moekit_dtype_t logits_dtype = MOEKIT_DTYPE_BF16;
  RoutingOptions options;
  int64_t forced_empty = 0;           // lognormal: the experts whose logits got -1e4
  std::vector<unsigned char> logits;  // [T, E] in logits_dtype: uniform in [-1, 1) + the expert's offset
  std::vector<float> scores;          // [T, K] softmax over each token's top-K logits
  std::vector<int32_t> indices;       // [T, K] expert ids, value-descending
  std::vector<int32_t> counts;        // [E] pairs per expert
  std::vector<int32_t> expert_offsets;                // [E + 1]
  std::vector<int32_t> gather_idx, pair_idx, grouped_pos;  // [P = T * K]

  int64_t pairs() const { return tokens * top_k; }
};

// The routing of T tokens over E experts, top-K, from logits drawn with `seed` (cached: cases of one shape and
// options share it). Throws CaseFailure when the reference backend refuses the shape.
const Routing& routing_for(int64_t tokens, int64_t experts, int64_t top_k, moekit_dtype_t logits_dtype, uint64_t seed,
                           const RoutingOptions& options);

// What a case's record reports of its routing: the options and the per-expert counts.
RoutingSummary summarize(const Routing& routing);

}  // namespace moekit_bench
