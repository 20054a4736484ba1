#include "src/subsample_rows.h"

#include <string>
#include <unordered_map>

#include "cuda/common/status_error.h"

namespace moekit {
inline namespace v0 {

namespace {

// SplitMix64: advances the state and returns its next output (all arithmetic mod 2^64).
uint64_t splitmix64_next(uint64_t& state) {
  state += 0x9E3779B97F4A7C15ull;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

void subsample_rows(uint64_t seed, int64_t num_groups, int64_t group_size, int64_t rows_per_group, int32_t* out) {
  if (num_groups < 0) throw_invalid("num_groups: must be >= 0, got " + std::to_string(num_groups));
  if (group_size < 1) throw_invalid("group_size: must be >= 1, got " + std::to_string(group_size));
  if (rows_per_group < 1 || rows_per_group > group_size)
    throw_invalid("rows_per_group: must be in [1, group_size = " + std::to_string(group_size) + "], got " +
                  std::to_string(rows_per_group));
  if (out == nullptr && num_groups > 0) throw_invalid("out: must not be NULL");
  if (group_size > INT32_MAX || num_groups > INT32_MAX / group_size)
    throw_invalid("num_groups: " + std::to_string(num_groups) + " groups of " + std::to_string(group_size) +
                  " neuron ids do not fit int32");
  uint64_t state = seed;
  // perm as the identity plus the entries the swaps moved (at most 2 * rows_per_group): a group costs
  // O(rows_per_group), where a whole [group_size] array cost O(group_size) time and memory (16 GiB for 2^31 - 1).
  std::unordered_map<int64_t, int64_t> moved;
  const auto perm = [&moved](int64_t i) {
    auto it = moved.find(i);
    return it == moved.end() ? i : it->second;
  };
  for (int64_t g = 0; g < num_groups; ++g) {
    moved.clear();
    // A partial Fisher-Yates shuffle: the first rows_per_group entries become a uniform draw without repeats.
    for (int64_t j = 0; j < rows_per_group; ++j) {
      uint64_t z = splitmix64_next(state);
      int64_t r = j + static_cast<int64_t>(z % static_cast<uint64_t>(group_size - j));
      const int64_t at_j = perm(j), at_r = perm(r);
      moved[j] = at_r;
      moved[r] = at_j;
      out[g * rows_per_group + j] = static_cast<int32_t>(g * group_size + at_r);
    }
  }
}

}  // namespace v0
}  // namespace moekit
