#include "random_fill.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "src/numeric.h"

namespace moekit_bench {

void store_element(moekit_dtype_t dtype, float v, unsigned char* out) {
  if (dtype == MOEKIT_DTYPE_FP64) {
    const double d = v;
    std::memcpy(out, &d, 8);
  } else if (dtype == MOEKIT_DTYPE_FP32) {
    std::memcpy(out, &v, 4);
  } else {
    const uint16_t h = dtype == MOEKIT_DTYPE_BF16 ? moekit::float_to_bf16(v) : moekit::float_to_fp16(v);
    std::memcpy(out, &h, 2);
  }
}

void fill_random(Platform& platform, void* dst, moekit_dtype_t dtype, int64_t count, float scale, uint64_t seed) {
  if (count <= 0) return;
  const int64_t drawn = std::min<int64_t>(count, int64_t{1} << 24);
  const size_t element = dtype == MOEKIT_DTYPE_FP64 ? 8 : dtype == MOEKIT_DTYPE_FP32 ? 4 : 2;
  std::vector<unsigned char> host(static_cast<size_t>(drawn) * element);
  uint64_t state = seed;
  for (int64_t i = 0; i < drawn; ++i) {
    // 24 random bits -> [-1, 1): exact in every dtype before the scale.
    const float unit = static_cast<float>(splitmix64(state) >> 40) * (2.0f / 16777216.0f) - 1.0f;
    store_element(dtype, unit * scale, host.data() + static_cast<size_t>(i) * element);
  }
  const size_t tile = host.size(), total = static_cast<size_t>(count) * element;
  auto* bytes = static_cast<unsigned char*>(dst);
  platform.upload(bytes, host.data(), tile);
  // Doubling: copy everything filled so far after itself.
  for (size_t done = tile; done < total; done += std::min(done, total - done))
    platform.copy(bytes + done, bytes, std::min(done, total - done));
}

}  // namespace moekit_bench
