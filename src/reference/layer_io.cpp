#include "src/reference/layer_io.h"

#include <string>

#include "cuda/common/status_error.h"
#include "src/reference/activation.h"
#include "src/reference/dense.h"
#include "cuda/layers/saved_header.h"

namespace moekit {
inline namespace v0 {
namespace ref {

namespace {

constexpr size_t kSectionAlignment = 256;

size_t doubles(int64_t count) { return static_cast<size_t>(count) * sizeof(double); }

}  // namespace

std::vector<int64_t> read_offsets(const char* name, const moekit_tensor_t& t, int64_t groups, int64_t rows) {
  std::vector<int64_t> offsets = read_indices(t, groups + 1);
  if (offsets[0] != 0) throw_invalid(std::string(name) + ": offsets[0] must be 0, got " + std::to_string(offsets[0]));
  for (int64_t e = 0; e < groups; ++e)
    if (offsets[static_cast<size_t>(e + 1)] < offsets[static_cast<size_t>(e)])
      throw_invalid(std::string(name) + ": must be non-decreasing, but entry " + std::to_string(e + 1) + " = " +
                    std::to_string(offsets[static_cast<size_t>(e + 1)]) + " < " +
                    std::to_string(offsets[static_cast<size_t>(e)]));
  if (offsets.back() > rows)
    throw_invalid(std::string(name) + ": last entry " + std::to_string(offsets.back()) + " exceeds the " +
                  std::to_string(rows) + " rows");
  return offsets;
}

void require_in_range(const char* name, const std::vector<int64_t>& values, int64_t lo, int64_t hi) {
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i] < lo || values[i] >= hi)
      throw_invalid(std::string(name) + ": entry " + std::to_string(i) + " = " + std::to_string(values[i]) +
                    " outside [" + std::to_string(lo) + ", " + std::to_string(hi) + ")");
}

moekit_tensor_t flat_view(const moekit_tensor_t& t) {
  moekit_tensor_t flat = t;
  flat.rank = 1;
  flat.shape[0] = numel(t);
  flat.stride[0] = 1;
  for (int d = 1; d < MOEKIT_MAX_RANK; ++d) {
    flat.shape[d] = 0;
    flat.stride[d] = 0;
  }
  return flat;
}

void write_accumulated(const moekit_tensor_t& t, std::vector<double>& values, double beta, int64_t row_begin,
                       int64_t row_end) {
  if (beta != 0.0) {
    int64_t width = row_width(t);
    int64_t end = row_end < 0 ? (t.rank == 0 ? 1 : t.shape[0]) : row_end;
    std::vector<double> old = read_values(t, end);
    for (int64_t i = row_begin * width; i < end * width; ++i)
      values[static_cast<size_t>(i)] += beta * old[static_cast<size_t>(i)];
  }
  write_values(t, values, row_begin, row_end);
}

int32_t score_dtype(int32_t dtype) { return dtype == MOEKIT_DTYPE_FP64 ? MOEKIT_DTYPE_FP64 : MOEKIT_DTYPE_FP32; }

size_t SavedLayout::add(size_t bytes) {
  if (!has_header_) {
    end_ = kSavedHeaderBytes;
    has_header_ = true;
  }
  size_t offset = end_;
  end_ = (offset + bytes + kSectionAlignment - 1) / kSectionAlignment * kSectionAlignment;
  return offset;
}

void write_saved_header(void* saved, uint64_t plan_id, int64_t tokens) {
  SavedHeader header{kSavedMagic, plan_id, tokens, 0};
  *static_cast<SavedHeader*>(saved) = header;
}

void check_saved_header(const void* saved, uint64_t plan_id, int64_t tokens) {
  if (saved == nullptr) throw_invalid("saved: is NULL; pass the buffer the forward of this plan filled");
  const SavedHeader& header = *static_cast<const SavedHeader*>(saved);
  if (header.magic == kSavedSpentMagic)
    throw_invalid("saved: already spent by a backward of a plan with backward_overwrites_saved = 1 (dh overwrote "
                  "h); run the forward again, or create the plan with backward_overwrites_saved = 0");
  if (header.magic != kSavedMagic)
    throw_invalid("saved: not filled by a moekit forward (bad header); pass the buffer this plan's forward filled");
  if (header.plan_id != plan_id)
    throw_invalid("saved: filled by the forward of another plan (id " + std::to_string(header.plan_id) +
                  "), not this one (id " + std::to_string(plan_id) + ")");
  if (header.tokens != tokens)
    throw_invalid("saved: the forward ran on " + std::to_string(header.tokens) + " tokens (rows), this call has " +
                  std::to_string(tokens));
}

void spend_saved(const void* saved, const moekit_moe_desc_t& desc) {
  if (desc.backward_overwrites_saved) static_cast<SavedHeader*>(const_cast<void*>(saved))->magic = kSavedSpentMagic;
}

MoeSavedLayout moe_saved_layout(const moekit_moe_desc_t& desc, int64_t tokens) {
  ActivationSpec act{desc.activation, desc.glu_layout, desc.glu_limit, desc.intermediate};
  int64_t pairs = tokens * desc.top_k;
  SavedLayout layout;
  MoeSavedLayout sections{};
  sections.logits = layout.add(doubles(tokens * desc.router_experts));
  sections.scores = layout.add(doubles(pairs));
  sections.indices = layout.add(static_cast<size_t>(pairs) * sizeof(int64_t));
  sections.h = layout.add(doubles(pairs * h_width(act)));
  sections.total = layout.total();
  return sections;
}

ExpertsSavedLayout experts_saved_layout(const moekit_moe_desc_t& desc, int64_t rows) {
  ActivationSpec act{desc.activation, desc.glu_layout, desc.glu_limit, desc.intermediate};
  SavedLayout layout;
  ExpertsSavedLayout sections{};
  sections.h = layout.add(doubles(rows * h_width(act)));
  sections.total = layout.total();
  return sections;
}

SparseFfnSavedLayout sparse_ffn_saved_layout(const moekit_sparse_ffn_desc_t& desc, int64_t tokens) {
  SavedLayout layout;
  SparseFfnSavedLayout sections{};
  sections.groups = layout.add(static_cast<size_t>(tokens * desc.top_groups) * sizeof(int64_t));
  sections.total = layout.total();
  return sections;
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
