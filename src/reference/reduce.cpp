// The token reductions of docs/math.md section 6: combine (and the broadcast backward, its weights-1 form), db1, and
// db2 with the dout . b2 part of ds; plus the reference backend's operations around them.
#include <string>
#include <vector>

#include "cuda/common/status_error.h"
#include "src/reference/blocks.h"
#include "src/reference/dense.h"
#include "src/reference/reference_backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

void combine(int64_t tokens, int64_t hidden, int64_t top_k, const int64_t* tok_offsets, const double* grouped,
             const double* weights, const int64_t* grouped_pos, double beta, double* out) {
  std::vector<double> sum(static_cast<size_t>(hidden));
  for (int64_t t = 0; t < tokens; ++t) {
    int64_t begin = tok_offsets ? tok_offsets[t] : t * top_k;
    int64_t end = tok_offsets ? tok_offsets[t + 1] : begin + top_k;
    sum.assign(sum.size(), 0.0);
    for (int64_t p = begin; p < end; ++p) {
      int64_t i = grouped_pos[p];
      if (i < 0) continue;
      double w = weights ? weights[p] : 1.0;
      const double* row = grouped + i * hidden;
      for (int64_t h = 0; h < hidden; ++h) sum[static_cast<size_t>(h)] += w * row[h];
    }
    double* o = out + t * hidden;
    for (int64_t h = 0; h < hidden; ++h)
      o[h] = beta != 0 ? beta * o[h] + sum[static_cast<size_t>(h)] : sum[static_cast<size_t>(h)];
  }
}

void db1(int64_t experts, int64_t width, const int64_t* expert_offsets, const double* dh, double beta, double* db1) {
  for (int64_t e = 0; e < experts; ++e) {
    double* out = db1 + e * width;
    for (int64_t c = 0; c < width; ++c) {
      double sum = 0;
      for (int64_t i = expert_offsets[e]; i < expert_offsets[e + 1]; ++i) sum += dh[i * width + c];
      out[c] = beta != 0 ? beta * out[c] + sum : sum;
    }
  }
}

void db2_ds(int64_t experts, int64_t hidden, const int64_t* expert_offsets, const int64_t* gather_idx,
            const int64_t* pair_idx, const double* dout, const double* scores, const double* b2, double beta,
            double* db2, double* ds) {
  std::vector<double> sum(static_cast<size_t>(hidden));
  for (int64_t e = 0; e < experts; ++e) {
    sum.assign(sum.size(), 0.0);
    for (int64_t i = expert_offsets[e]; i < expert_offsets[e + 1]; ++i) {
      const double* row = dout + gather_idx[i] * hidden;
      int64_t p = pair_idx[i];
      if (db2)
        for (int64_t h = 0; h < hidden; ++h) sum[static_cast<size_t>(h)] += scores[p] * row[h];
      if (b2) {
        const double* bias = b2 + e * hidden;
        double dot = 0;
        for (int64_t h = 0; h < hidden; ++h) dot += row[h] * bias[h];
        ds[p] += dot;
      }
    }
    if (!db2) continue;
    double* out = db2 + e * hidden;
    for (int64_t h = 0; h < hidden; ++h)
      out[h] = beta != 0 ? beta * out[h] + sum[static_cast<size_t>(h)] : sum[static_cast<size_t>(h)];
  }
}

namespace {

// Index tensors come from the device side of the caller's pipeline; a bad one must fail cleanly, not read out
// of bounds.
void check_range(const std::vector<int64_t>& values, int64_t lo, int64_t hi, const char* name) {
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i] < lo || values[i] >= hi)
      throw_invalid(std::string(name) + ": entry " + std::to_string(i) + " = " + std::to_string(values[i]) +
                    " outside [" + std::to_string(lo) + ", " + std::to_string(hi) + ")");
}

void check_offsets(const std::vector<int64_t>& offsets, int64_t rows, const char* name) {
  if (offsets.front() != 0) throw_invalid(std::string(name) + ": offsets[0] must be 0");
  for (size_t e = 0; e + 1 < offsets.size(); ++e)
    if (offsets[e + 1] < offsets[e])
      throw_invalid(std::string(name) + ": must be non-decreasing, but entry " + std::to_string(e + 1) + " = " +
                    std::to_string(offsets[e + 1]) + " < " + std::to_string(offsets[e]));
  if (offsets.back() > rows)
    throw_invalid(std::string(name) + ": last entry " + std::to_string(offsets.back()) + " exceeds the " +
                  std::to_string(rows) + " rows");
}

}  // namespace

void ReferenceBackend::combine(const moekit_plan& plan, const moekit_combine_args_t& args, Workspace, void*) {
  const moekit_combine_desc_t& d = plan.combine;
  int64_t tokens = args.out.shape[0];
  int64_t hidden = row_width(args.out);
  int64_t rows = args.grouped.shape[0];
  std::vector<int64_t> tok_offsets;
  if (d.top_k == 0) {
    tok_offsets = read_indices(args.tok_offsets);
    check_offsets(tok_offsets, args.grouped_pos.shape[0], "tok_offsets");
  }
  int64_t pairs = d.top_k == 0 ? tok_offsets.back() : tokens * d.top_k;
  std::vector<int64_t> grouped_pos = read_indices(args.grouped_pos, pairs);
  check_range(grouped_pos, -1, rows, "grouped_pos");
  std::vector<double> grouped = read_values(args.grouped);
  std::vector<double> weights;
  if (args.scores.data) weights = read_values(args.scores);
  std::vector<double> out = args.beta != 0 ? read_values(args.out) : std::vector<double>(static_cast<size_t>(tokens * hidden));
  ref::combine(tokens, hidden, d.top_k, d.top_k == 0 ? tok_offsets.data() : nullptr, grouped.data(),
               args.scores.data ? weights.data() : nullptr, grouped_pos.data(), args.beta, out.data());
  write_values(args.out, out);
}

void ReferenceBackend::db1(const moekit_plan& plan, const moekit_db1_args_t& args, Workspace, void*) {
  int64_t experts = plan.bias_grad.experts;
  int64_t width = row_width(args.dh);
  std::vector<int64_t> offsets = read_indices(args.offsets);
  check_offsets(offsets, args.dh.shape[0], "offsets");
  std::vector<double> dh = read_values(args.dh, offsets.back());
  std::vector<double> out = args.beta != 0 ? read_values(args.db1) : std::vector<double>(static_cast<size_t>(experts * width));
  ref::db1(experts, width, offsets.data(), dh.data(), args.beta, out.data());
  write_values(args.db1, out);
}

void ReferenceBackend::db2_ds(const moekit_plan& plan, const moekit_db2_ds_args_t& args, Workspace, void*) {
  int64_t experts = plan.bias_grad.experts;
  int64_t tokens = args.dout.shape[0];
  int64_t hidden = row_width(args.dout);
  // P twice: the grouped rows offsets index, and the pairs pair_idx indexes (scores, read flat; dscores is optional).
  int64_t rows = args.gather_idx.shape[0];
  int64_t pairs = numel(args.scores);
  std::vector<int64_t> offsets = read_indices(args.offsets);
  check_offsets(offsets, rows, "offsets");
  int64_t valid = offsets.back();
  std::vector<int64_t> gather_idx = read_indices(args.gather_idx, valid);
  std::vector<int64_t> pair_idx = read_indices(args.pair_idx, valid);
  check_range(gather_idx, 0, tokens, "gather_idx");
  check_range(pair_idx, 0, pairs, "pair_idx");
  std::vector<double> dout = read_values(args.dout);
  std::vector<double> scores = read_values(args.scores);
  bool has_db2 = args.db2.data != nullptr, has_b2 = args.b2.data != nullptr;
  std::vector<double> b2, db2, ds;
  if (has_b2) {
    b2 = read_values(args.b2);
    ds = read_values(args.dscores);
  }
  if (has_db2)
    db2 = args.beta != 0 ? read_values(args.db2) : std::vector<double>(static_cast<size_t>(experts * hidden));
  ref::db2_ds(experts, hidden, offsets.data(), gather_idx.data(), pair_idx.data(), dout.data(), scores.data(),
              has_b2 ? b2.data() : nullptr, args.beta, has_db2 ? db2.data() : nullptr, has_b2 ? ds.data() : nullptr);
  if (has_db2) write_values(args.db2, db2);
  if (has_b2) write_values(args.dscores, ds);
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
