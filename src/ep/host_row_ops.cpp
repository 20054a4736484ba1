// RowOps on host memory: the reference of what the CUDA kernels compute, in the same order.
#include <algorithm>
#include <cstring>

#include "src/ep/row_ops.h"

namespace moekit {
inline namespace v0 {
namespace ep {
namespace {

class HostRowOps final : public RowOps {
 public:
  void fill(int32_t* p, int64_t n, int32_t value, void*) override { std::fill(p, p + n, value); }
  void iota(int32_t* p, int64_t n, void*) override {
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(i);
  }
  void single_group(int32_t* p, int64_t rows, void*) override {
    p[0] = 0;
    p[1] = static_cast<int32_t>(rows);
  }

  void send_layout(const EpShape& s, const int32_t* expert_offsets, const int32_t* grouped_pos, int64_t pairs,
                   int32_t* slot, int32_t* kept_pos, int32_t* send_counts, int32_t* dropped, void*) override {
    int64_t e_all = s.ranks * s.experts;
    int64_t valid = expert_offsets[e_all];
    int64_t drops = 0;
    for (int d = 0; d < s.ranks; ++d) {
      int64_t begin = expert_offsets[d * s.experts], end = expert_offsets[(d + 1) * s.experts];
      for (int64_t i = begin; i < end; ++i) {
        int64_t j = i - begin;
        bool kept = s.capacity == 0 || j < s.capacity;
        slot[i] = kept ? static_cast<int32_t>(s.capacity == 0 ? i : d * s.capacity + j) : -1;
      }
      if (s.capacity > 0) drops += std::max<int64_t>(0, end - begin - s.capacity);
      for (int64_t e = 0; e < s.experts; ++e) {
        int64_t lo = expert_offsets[d * s.experts + e] - begin, hi = expert_offsets[d * s.experts + e + 1] - begin;
        if (s.capacity > 0) {
          lo = std::min(lo, s.capacity);
          hi = std::min(hi, s.capacity);
        }
        send_counts[d * s.experts + e] = static_cast<int32_t>(hi - lo);
      }
    }
    for (int64_t i = valid; i < pairs; ++i) slot[i] = -1;
    for (int64_t p = 0; p < pairs; ++p) {
      int32_t g = grouped_pos[p];
      kept_pos[p] = g >= 0 && slot[g] >= 0 ? g : -1;
    }
    *dropped = static_cast<int32_t>(drops);
  }

  void recv_layout(const EpShape& s, const int32_t* recv_counts, int64_t max_rows, int32_t* perm,
                   int32_t* owner_offsets, void*) override {
    std::fill(perm, perm + max_rows, -1);
    owner_offsets[0] = 0;
    for (int64_t e = 0; e < s.experts; ++e) {
      int64_t rows = 0;
      for (int r = 0; r < s.ranks; ++r) rows += recv_counts[r * s.experts + e];
      owner_offsets[e + 1] = static_cast<int32_t>(owner_offsets[e] + rows);
    }
    int64_t source_base = 0;
    for (int r = 0; r < s.ranks; ++r) {
      int64_t row = s.capacity > 0 ? r * s.capacity : source_base;
      for (int64_t e = 0; e < s.experts; ++e) {
        int64_t before = 0;  // rows of expert e from lower ranks
        for (int q = 0; q < r; ++q) before += recv_counts[q * s.experts + e];
        int64_t n = recv_counts[r * s.experts + e];
        for (int64_t j = 0; j < n; ++j) perm[row + j] = static_cast<int32_t>(owner_offsets[e] + before + j);
        row += n;
      }
      source_base = row;
    }
  }

  void gather(void* dst, const void* src, const int32_t* index, int64_t n, const int32_t* valid, size_t row_bytes,
              void*) override {
    int64_t rows = valid ? std::min<int64_t>(n, *valid) : n;
    for (int64_t i = 0; i < rows; ++i)
      if (!index || index[i] >= 0)
        std::memcpy(static_cast<char*>(dst) + static_cast<size_t>(i) * row_bytes,
                    static_cast<const char*>(src) + static_cast<size_t>(index ? index[i] : i) * row_bytes,
                    row_bytes);
  }
  void scatter(void* dst, const void* src, const int32_t* index, int64_t n, const int32_t* valid, size_t row_bytes,
               void*) override {
    int64_t rows = valid ? std::min<int64_t>(n, *valid) : n;
    for (int64_t i = 0; i < rows; ++i)
      if (index[i] >= 0)
        std::memcpy(static_cast<char*>(dst) + static_cast<size_t>(index[i]) * row_bytes,
                    static_cast<const char*>(src) + static_cast<size_t>(i) * row_bytes, row_bytes);
  }

  void to_host(int32_t* host, const int32_t* src, int64_t n, void*) override { std::copy(src, src + n, host); }

  void write_header(SavedHeader* dst, const SavedHeader& header, void*) override { *dst = header; }
  const SavedHeader* readable_header(const SavedHeader* saved) override { return saved; }
};

}  // namespace

std::unique_ptr<RowOps> make_host_row_ops() { return std::make_unique<HostRowOps>(); }

}  // namespace ep
}  // namespace v0
}  // namespace moekit
