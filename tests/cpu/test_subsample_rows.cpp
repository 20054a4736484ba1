// moekit_subsample_rows (docs/math.md section 7): the documented SplitMix64 + partial Fisher-Yates steps,
// re-implemented here from moekit.h's comment, and the properties the sparse FFN relies on.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "common/test_util.h"

namespace {

// The steps exactly as moekit.h writes them.
std::vector<int32_t> documented_rows(uint64_t seed, int64_t groups, int64_t G, int64_t spg) {
  std::vector<int32_t> out(static_cast<size_t>(groups * spg));
  uint64_t state = seed;
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<int64_t> perm(static_cast<size_t>(G));
    for (int64_t i = 0; i < G; ++i) perm[static_cast<size_t>(i)] = i;
    for (int64_t j = 0; j < spg; ++j) {
      state += 0x9E3779B97F4A7C15ull;
      uint64_t z = state;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      int64_t r = j + static_cast<int64_t>(z % static_cast<uint64_t>(G - j));
      std::swap(perm[static_cast<size_t>(j)], perm[static_cast<size_t>(r)]);
      out[static_cast<size_t>(g * spg + j)] = static_cast<int32_t>(g * G + perm[static_cast<size_t>(j)]);
    }
  }
  return out;
}

std::vector<int32_t> drawn_rows(uint64_t seed, int64_t groups, int64_t G, int64_t spg) {
  std::vector<int32_t> out(static_cast<size_t>(groups * spg), -7);
  MOEKIT_REQUIRE_OK(moekit_subsample_rows(seed, groups, G, spg, out.data()));
  return out;
}

}  // namespace

TEST_CASE("subsample rows follow the documented steps", "[subsample_rows]") {
  struct Case {
    uint64_t seed;
    int64_t groups, G, spg;
  };
  const Case cases[] = {{0, 4, 16, 4},          {12345, 32, 64, 16}, {~0ull, 5, 128, 128},
                        {7, 1, 32, 1},          {0xDEADBEEF, 9, 16, 15}, {3, 2, 1 << 20, 5}};
  for (const Case& c : cases) {
    INFO("seed " << c.seed << ", groups " << c.groups << ", G " << c.G << ", spg " << c.spg);
    std::vector<int32_t> got = drawn_rows(c.seed, c.groups, c.G, c.spg);
    REQUIRE(got == documented_rows(c.seed, c.groups, c.G, c.spg));
    // Distinct rows inside each group, all of them the group's own neurons.
    for (int64_t g = 0; g < c.groups; ++g) {
      std::set<int32_t> seen(got.begin() + g * c.spg, got.begin() + (g + 1) * c.spg);
      REQUIRE(static_cast<int64_t>(seen.size()) == c.spg);
      REQUIRE(*seen.begin() >= g * c.G);
      REQUIRE(*seen.rbegin() < (g + 1) * c.G);
    }
  }
}

TEST_CASE("subsample rows are reproducible for a seed and change with it", "[subsample_rows]") {
  std::vector<int32_t> first = drawn_rows(2024, 16, 64, 8);
  REQUIRE(drawn_rows(2024, 16, 64, 8) == first);
  REQUIRE(drawn_rows(2025, 16, 64, 8) != first);
  // Groups are drawn in order from one stream: a prefix of the groups does not depend on how many follow.
  std::vector<int32_t> fewer = drawn_rows(2024, 3, 64, 8);
  REQUIRE(std::equal(fewer.begin(), fewer.end(), first.begin()));
}

TEST_CASE("subsample rows reject a row count outside 1..group_size", "[subsample_rows]") {
  std::vector<int32_t> out(64, -7);
  REQUIRE(moekit_subsample_rows(1, 2, 16, 0, out.data()) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(moekit_subsample_rows(1, 2, 16, 17, out.data()) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(std::all_of(out.begin(), out.end(), [](int32_t v) { return v == -7; }));
}

TEST_CASE("subsample rows of a huge group cost the rows drawn, not the group", "[subsample_rows]") {
  // Drawing 4 of 2^31 - 1 neurons once took a [group_size] int64 permutation: 16 GiB, filled.
  const int64_t G = std::numeric_limits<int32_t>::max();
  std::vector<int32_t> got = drawn_rows(99, 1, G, 4);
  REQUIRE(std::set<int32_t>(got.begin(), got.end()).size() == 4);
  for (int32_t id : got) REQUIRE(id >= 0);
}

TEST_CASE("subsample rows reject more neuron ids than int32 holds, however many groups", "[subsample_rows]") {
  std::vector<int32_t> out(64, -7);
  // (2^63 - 2) * 16 wraps to -32 in 64 bits: the count must be checked without the product.
  for (int64_t groups : {std::numeric_limits<int64_t>::max() - 1, std::numeric_limits<int64_t>::max() / 16 + 1,
                         int64_t{1} << 27}) {
    INFO("num_groups " << groups);
    REQUIRE(moekit_subsample_rows(1, groups, 16, 1, out.data()) == MOEKIT_STATUS_INVALID_VALUE);
    REQUIRE_THAT(moekit_test::last_error(), Catch::StartsWith("num_groups:"));
  }
  REQUIRE(std::all_of(out.begin(), out.end(), [](int32_t v) { return v == -7; }));
}
