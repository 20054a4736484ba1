// The reference math of the building blocks (docs/math.md sections 1, 2, 6, 7) on dense row-major float64 / int64
// host arrays. The reference backend's level-1 operations wrap these around tensor I/O (reference/dense.h);
// the reference layers call them directly. Nothing here rounds unless it says so.
#pragma once

#include <cstdint>
#include <vector>

namespace moekit {
inline namespace v0 {
namespace ref {

// Writes to out[0..k) the positions of the k largest keys, value-descending, ties to the lower position.
// keys equal to -inf are never chosen (the caller guarantees at least k finite keys).
void topk_descending(const float* keys, int64_t n, int64_t k, int64_t* out);

struct RouterSpec {
  int64_t experts;
  int64_t top_k;
  int32_t kind;  // moekit_router_kind_t
  bool renormalize;
  double scale;  // SIGMOID kind
};

// docs/math.md section 1 forward. logits [T, E] (the stored values), bias [E] or nullptr (SIGMOID kind).
// Writes scores [T, K] (float64, unrounded), indices [T, K] (global ids), and, if counts != nullptr, counts [E]
// (overwritten with the number of pairs selecting each expert).
void router_forward(const RouterSpec& spec, int64_t tokens, const double* logits, const double* bias,
                    double* scores, int64_t* indices, int64_t* counts);

// docs/math.md section 1 backward. dscores [T, K]; overwrites dlogits [T, E] with the gradient.
void router_backward(const RouterSpec& spec, int64_t tokens, const double* logits, const int64_t* indices,
                     const double* dscores, double* dlogits);

// docs/math.md section 2. grouped_pos has one entry per pair; expert_offsets E+1; gather_idx / pair_idx have one entry
// per VALID pair (size expert_offsets[E]).
struct Csr {
  std::vector<int64_t> expert_offsets;
  std::vector<int64_t> gather_idx;
  std::vector<int64_t> pair_idx;
  std::vector<int64_t> grouped_pos;
};

// Fixed routing: indices [T, K] global expert ids; local expert e is id expert_begin + e.
Csr dispatch_fixed(int64_t tokens, int64_t top_k, int64_t experts, int64_t expert_begin, const int64_t* indices);
// General routing: token t owns pairs tok_offsets[t] .. tok_offsets[t+1]; expert_ids [tok_offsets[T]].
Csr dispatch_general(int64_t tokens, const int64_t* tok_offsets, int64_t experts, int64_t expert_begin,
                     const int64_t* expert_ids);

// out[t] = beta * out[t] + sum over pairs p of t, ascending, with grouped_pos[p] >= 0, of w_p * grouped[grouped_pos[p]].
// Pairs of t: [t*K, t*K + K) when tok_offsets == nullptr, else [tok_offsets[t], tok_offsets[t+1]).
// weights [pairs] or nullptr for 1. grouped [rows, H], out [T, H]; with beta == 0 out is not read.
void combine(int64_t tokens, int64_t hidden, int64_t top_k, const int64_t* tok_offsets, const double* grouped,
             const double* weights, const int64_t* grouped_pos, double beta, double* out);

// db1[e] = beta * db1[e] + sum over rows i of expert e (ascending) of dh[i]; dh [rows, W], db1 [E, W].
void db1(int64_t experts, int64_t width, const int64_t* expert_offsets, const double* dh, double beta, double* db1);

// For each grouped row i of expert e, token t = gather_idx[i], pair p = pair_idx[i]:
//   db2[e] = beta * db2[e] + sum_i scores[p] * dout[t]   (skipped when db2 == nullptr)
//   ds[p] += dout[t] . b2[e]                            (skipped when b2 == nullptr)
void db2_ds(int64_t experts, int64_t hidden, const int64_t* expert_offsets, const int64_t* gather_idx,
            const int64_t* pair_idx, const double* dout, const double* scores, const double* b2, double beta,
            double* db2, double* ds);

struct GroupSelectSpec {
  int64_t d_model;
  int64_t d_ff;
  int64_t group_size;
  int64_t top_groups;
  int64_t subsample;  // rows per group; 0 = all
  int32_t dtype;      // storage dtype the gate pre-activation is rounded to
};

// docs/math.md section 7 selection. x [T, D], w_gate [F, D], subsample_rows [NG, spg] global ids (nullptr iff spg = 0),
// lb_bias [NG] or nullptr. Writes groups [T, kg] and, if counts != nullptr, counts [NG] (overwritten).
void group_select(const GroupSelectSpec& spec, int64_t tokens, const double* x, const double* w_gate,
                  const int64_t* subsample_rows, const double* lb_bias, int64_t* groups, int64_t* counts);

}  // namespace ref
}  // namespace v0
}  // namespace moekit
