// Top-k selection shared by the router (docs/math.md section 1) and the sparse FFN's group selection (section 7).
// The order is a contract: value-descending on fp32 keys, ties to the lower position, -inf never chosen.
#include <algorithm>
#include <cmath>
#include <vector>

#include "src/reference/blocks.h"

namespace moekit {
inline namespace v0 {
namespace ref {

void topk_descending(const float* keys, int64_t n, int64_t k, int64_t* out) {
  // NOTE: NaN keys are invalid input; they are left out with -inf so the comparison below stays a strict weak
  // order (std::partial_sort needs one), and the output still holds in-range positions.
  std::vector<int64_t> candidates;
  std::vector<int64_t> excluded;
  candidates.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    bool selectable = !std::isnan(keys[i]) && keys[i] != -INFINITY;
    (selectable ? candidates : excluded).push_back(i);
  }
  auto before = [keys](int64_t a, int64_t b) { return keys[a] > keys[b] || (keys[a] == keys[b] && a < b); };
  int64_t taken = std::min<int64_t>(k, static_cast<int64_t>(candidates.size()));
  std::partial_sort(candidates.begin(), candidates.begin() + taken, candidates.end(), before);
  for (int64_t j = 0; j < taken; ++j) out[j] = candidates[static_cast<size_t>(j)];
  // Fewer than k selectable keys breaks the caller's precondition; fill with the lowest excluded positions so
  // nothing downstream indexes out of range.
  for (int64_t j = taken; j < k; ++j) out[j] = excluded[static_cast<size_t>(j - taken)];
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
