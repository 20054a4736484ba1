// Host-callable launchers of the token combine (docs/math.md section 3, step 4) and of its weights-1 form, the
// broadcast backward (section 4, step 7), fixed or variable top-k (section 6). Plain C++:
// src/cuda_backend/reduce_ops.cpp includes it from g++.
//
//   out[t] = beta * out[t] + sum over the pairs p of token t, ascending, of w[p] * grouped[grouped_pos[p]]
//
// fp32 accumulation in that order, one rounding to the storage dtype at the end; a dropped pair
// (grouped_pos = -1) adds nothing; with beta = 0, out is never read.
//
// Launch shape: a "token group" of threads per token (as many as the row has 16-byte vectors, at most 256; below
// 32 rounded up to a power of two, from 32 on to whole warps), as many groups per block as fit in 256 threads
// (H = 1536: one group of 192 — a power-of-two group had left a quarter of its threads idle); each thread owns
// whole 16-byte column vectors of the token's output row, keeps their 8 fp32 sums in registers and issues 8 row
// loads before it multiplies any of them (8 pairs' rows of one vector, or at top-k 1 to 4 two pairs' rows of 4
// vectors, token groups then a quarter as wide), so many loads are in flight. The grid holds only as many blocks
// as are resident at once (fewer if the tokens need fewer), and each group walks tokens a grid's worth of groups
// apart, so neighbouring groups still read neighbouring tokens. Walking lets a thread load the grouped positions
// of its next step (the token's next pairs or vectors, or its next token) while the current rows are in flight, so
// a fixed top-k token costs one memory round trip rather than two (positions, then rows): a thread that combined a
// single token had nothing to overlap its position loads with (K = 8, H = 768 ran at 85% of the copy bandwidth).
// Every output element has exactly one writer and a fixed summation order: the result is the same bits on every
// run and stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace reduce {

struct CombineProblem {
  int64_t tokens;  // T >= 0
  int64_t hidden;  // H, a multiple of 8
  int64_t top_k;   // K >= 1; 0: token t owns pairs tok_offsets[t] .. tok_offsets[t+1]
  const void* grouped;     // [P, H] storage dtype, rows grouped_stride elements apart (a multiple of 8)
  int64_t grouped_stride;
  const float* scores;     // fixed top-k [T, K], rows score_stride apart; variable top-k [P]; nullptr: weights 1
  int64_t score_stride;
  const int32_t* grouped_pos;  // [P]: grouped row of pair p, -1 for a dropped pair
  const int32_t* tok_offsets;  // [T+1], variable top-k only
  // The entries of grouped_pos (P) and the rows of grouped: a grouped position outside [0, rows) is a dropped
  // pair, and tok_offsets are clamped to [0, pairs] and to a non-negative length, so no value reads out of bounds.
  int64_t pairs;
  int64_t rows;
  void* out;                   // [T, H] storage dtype, rows out_stride elements apart (a multiple of 8)
  int64_t out_stride;
  float beta;    // 0: out is never read
  int sm_count;  // the device's multiprocessors (the grid bound)
};

// One per storage dtype (combine.cu). Only enqueue on `stream`.
void combine_bf16(const CombineProblem& problem, cudaStream_t stream);
void combine_fp16(const CombineProblem& problem, cudaStream_t stream);

// Whether the combine takes its few-pairs kernel (fixed top-k of 1 to 4: 2 pairs x 4 vectors in flight per thread)
// rather than its many-pairs one (8 pairs x 1 vector).
inline bool combine_has_few_pairs(const CombineProblem& problem) { return problem.top_k >= 1 && problem.top_k <= 4; }

// The two kernel variants per dtype (combine_{many,few}_pairs_{bf16,fp16}.cu).
void combine_many_pairs_bf16(const CombineProblem& problem, cudaStream_t stream);
void combine_few_pairs_bf16(const CombineProblem& problem, cudaStream_t stream);
void combine_many_pairs_fp16(const CombineProblem& problem, cudaStream_t stream);
void combine_few_pairs_fp16(const CombineProblem& problem, cudaStream_t stream);

}  // namespace reduce
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
