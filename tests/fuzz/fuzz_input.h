// How every fuzz target reads its input: a byte stream that reads as zeros once it is used up, so that a short
// input (the seeds in corpus/) means "the default case" and every byte the fuzzer adds refines it.
//
// The layout every target shares (make_corpus.py writes seeds in it):
//   byte 0            the case: which descriptor kind or run call
//   bytes 1..8        the configuration block (kConfigBytes): dimensions and variants of the case, 0 = default
//   then Edits        kEditBytes each, until the input ends: target, kind, arg, then 8 bytes of value (little endian)
// What an edit's target and kind mean is the target's business; Edit::int64() and Edit::real() turn its value into
// a number, biased towards the ones that break code: 0, -1, the int32 and int64 limits, NaN, the infinities.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace moekit_fuzz {

constexpr size_t kConfigBytes = 8;
constexpr size_t kEditBytes = 11;

struct Edit {
  uint8_t target;
  uint8_t kind;
  uint8_t arg;
  uint64_t raw;

  // arg selects the form: a value from a table of boundary values, near + a small signed delta, or raw as is.
  int64_t int64(int64_t near) const;
  // arg selects a value from a table (0, +-1, NaN, +-inf, the largest and smallest doubles, ...) or raw's bits.
  double real() const;
};

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  uint8_t byte();
  std::array<uint8_t, kConfigBytes> config();
  bool more() const { return pos_ < size_; }
  Edit edit();

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// The configuration block read as small numbers: `choose(i, n)` is byte i mod n, 0 when the byte is 0.
struct Config {
  std::array<uint8_t, kConfigBytes> bytes;
  int64_t choose(size_t i, int64_t n) const { return n <= 1 ? 0 : bytes[i] % n; }
  bool bit(size_t i, int b) const { return (bytes[i] >> b) & 1; }
  // A dimension: `fallback` when byte i is 0, else lo + (byte i - 1) mod (hi - lo + 1).
  int64_t dim(size_t i, int64_t fallback, int64_t lo, int64_t hi) const {
    return bytes[i] == 0 ? fallback : lo + (bytes[i] - 1) % (hi - lo + 1);
  }
};

// The boundary values of Edit::int64 (make_corpus.py names some by their index), also used for boundary contents.
const std::vector<int64_t>& boundary_int64s();

}  // namespace moekit_fuzz
