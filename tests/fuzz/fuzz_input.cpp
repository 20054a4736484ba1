#include "fuzz_input.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace moekit_fuzz {

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();

}  // namespace

const std::vector<int64_t>& boundary_int64s() {
  static const std::vector<int64_t> values = {0,
                                              1,
                                              -1,
                                              2,
                                              3,
                                              7,
                                              8,
                                              16,
                                              31,
                                              32,
                                              33,
                                              255,
                                              256,
                                              4096,
                                              kI32Max,
                                              kI32Max + 1,
                                              -kI32Max - 1,
                                              int64_t{1} << 32,
                                              (int64_t{1} << 32) + 1,
                                              int64_t{1} << 40,
                                              int64_t{1} << 53,
                                              int64_t{1} << 61,
                                              int64_t{1} << 62,
                                              (int64_t{1} << 62) + 1,
                                              kMax / 2 + 1,
                                              kMax - 1,
                                              kMax,
                                              kMin,
                                              kMin + 1,
                                              -(int64_t{1} << 62)};
  return values;
}

int64_t Edit::int64(int64_t near) const {
  switch (arg % 4) {
    case 0: {
      const std::vector<int64_t>& table = boundary_int64s();
      return table[raw % table.size()];
    }
    case 1: {
      // NOTE: unsigned arithmetic, so that near + delta wraps instead of overflowing.
      const int64_t delta = static_cast<int8_t>(raw & 0xff);
      return static_cast<int64_t>(static_cast<uint64_t>(near) + static_cast<uint64_t>(delta));
    }
    case 2: return static_cast<int64_t>(raw);
    default: return static_cast<int8_t>(raw & 0xff);
  }
}

double Edit::real() const {
  static const double table[] = {0.0,
                                 1.0,
                                 -1.0,
                                 0.5,
                                 2.0,
                                 -0.0,
                                 std::numeric_limits<double>::quiet_NaN(),
                                 std::numeric_limits<double>::infinity(),
                                 -std::numeric_limits<double>::infinity(),
                                 std::numeric_limits<double>::max(),
                                 -std::numeric_limits<double>::max(),
                                 std::numeric_limits<double>::denorm_min(),
                                 std::numeric_limits<double>::min(),
                                 1e300,
                                 -1e-300,
                                 0.99,
                                 1e-3,
                                 7.0};
  if (arg % 2 == 0) return table[raw % (sizeof(table) / sizeof(table[0]))];
  double value;
  std::memcpy(&value, &raw, sizeof(value));
  return value;
}

uint8_t FuzzInput::byte() { return pos_ < size_ ? data_[pos_++] : 0; }

std::array<uint8_t, kConfigBytes> FuzzInput::config() {
  std::array<uint8_t, kConfigBytes> bytes{};
  for (uint8_t& b : bytes) b = byte();
  return bytes;
}

Edit FuzzInput::edit() {
  Edit e{};
  e.target = byte();
  e.kind = byte();
  e.arg = byte();
  for (int i = 0; i < 8; ++i) e.raw |= static_cast<uint64_t>(byte()) << (8 * i);
  return e;
}

}  // namespace moekit_fuzz
