// The tensors of one benchmark case, declared once (TensorSpec) and allocated as many times as the measurement
// rotates input sets (TensorSet). Declarations also carry what the byte count and --check need to know.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moekit/moekit.h"
#include "platform.h"

namespace moekit_bench {

// How the timed call touches a tensor, for the byte count (docs/benchmark.md): each read-only or write-only
// tensor counts its size once, a tensor read and written twice, an untouched one (e.g. the forward's output in a
// backward-only case) not at all.
enum class Access { none, read, write, read_write };

// What --check does with an output.
enum class Compare {
  none,
  values,     // floats: whole-tensor relative error against the reference, bounded by docs/math.md section 9
  exact,      // integers that must be identical (dispatch metadata, counts)
  selection,  // integers chosen from computed values (router indices in a layer, groups): rows may differ at
              // near-ties (docs/math.md section 9); they are counted and the rows of outputs keyed on them are skipped
};

struct TensorSpec {
  std::string name;
  moekit_dtype_t dtype = MOEKIT_DTYPE_INVALID;  // INVALID: raw bytes, shape {bytes} (the saved buffer)
  std::vector<int64_t> shape;
  Access access = Access::read;
  // Initial contents: uniform random in [-scale, scale] for floats (scale 0: zeros), or `data` (host bytes,
  // identical in every set: routing metadata).
  float scale = 0.0f;
  std::shared_ptr<const std::vector<unsigned char>> data;
  Compare compare = Compare::none;
  std::string rows_keyed_on;  // values: skip rows where this selection tensor's rows differ

  int64_t elements() const;
  size_t bytes() const;
};

size_t dtype_bytes(moekit_dtype_t dtype);  // 1 for INVALID (raw bytes)

// Host bytes of a vector, for TensorSpec::data.
template <class T>
std::shared_ptr<const std::vector<unsigned char>> host_bytes(const std::vector<T>& values) {
  const auto* p = reinterpret_cast<const unsigned char*>(values.data());
  return std::make_shared<const std::vector<unsigned char>>(p, p + values.size() * sizeof(T));
}

// One copy of every tensor of a case on a platform, filled. Random contents depend on (seed, tensor index) only,
// so two platforms given the same specs and seed hold the same bits.
class TensorSet {
 public:
  TensorSet(Platform& platform, const std::vector<TensorSpec>& specs, uint64_t seed);

  moekit_tensor_t view(size_t index) const;
  void* data(size_t index) const { return buffers_[index].data(); }
  std::vector<unsigned char> download(size_t index) const;

 private:
  Platform& platform_;
  std::vector<TensorSpec> specs_;
  std::vector<Buffer> buffers_;
};

}  // namespace moekit_bench
