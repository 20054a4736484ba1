// Shared test helpers: owning host tensors that hand out moekit_tensor_t views, random fills, poisoning, the
// three error metrics of docs/math.md section 9, a REQUIRE that prints the library's last error on failure, and owners
// of a reference handle, a plan and an aligned buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "moekit/moekit.h"

namespace moekit_test {

// A contiguous host tensor of any moekit dtype; values go in and out as double / int64.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(moekit_dtype_t dtype, std::vector<int64_t> shape);

  moekit_tensor_t view();  // a moekit_tensor_t on the CPU device
  moekit_dtype_t dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  int64_t rows() const { return shape_.empty() ? 1 : shape_[0]; }
  int64_t row_width() const { return rows() == 0 ? 0 : numel() / rows(); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }

  double get(int64_t i) const;           // element i (row-major), converted to double
  void set(int64_t i, double v);         // rounds v to the dtype
  std::vector<double> values() const;    // all elements as double
  void set_values(const std::vector<double>& v);

  // Uniform in [-scale, scale] (rounded to the dtype); integer dtypes get integers in [0, scale).
  void fill_uniform(std::mt19937_64& rng, double scale);
  // Uniform in [lo, hi) (rounded to the dtype), for float dtypes.
  void fill_uniform(std::mt19937_64& rng, double lo, double hi);
  // A recognisable garbage pattern (NaN for floats, 0x7eadbeef-ish for integers): outputs are poisoned before a call.
  void poison();
  bool bytes_equal(const HostTensor& other) const;

 private:
  moekit_dtype_t dtype_ = MOEKIT_DTYPE_INVALID;
  std::vector<int64_t> shape_;
  std::vector<uint8_t> bytes_;
};

size_t dtype_size(moekit_dtype_t dtype);

// docs/math.md section 9 metrics between `out` and `ref`, both dense row-major with rows of `width` elements.
// segments: row offsets [S+1] of the segments for the per-segment metric (empty = one segment, the whole tensor).
struct ErrorMetrics {
  double whole;        // ||out - ref|| / ||ref||
  double worst_segment; // max over non-empty segments of the same ratio
  double worst_row;    // max over rows of ||row - ref_row|| / (||ref_row|| + 1e-3 * rms(ref))
  bool any_nan;
};
ErrorMetrics compare(const std::vector<double>& out, const std::vector<double>& ref, int64_t width,
                     const std::vector<int64_t>& segments = {});
// The same metrics from per-row sums over rows of `width` values: row_diff[r] = sum (out - ref)^2,
// row_ref[r] = sum ref^2; any_nan says whether `out` held a NaN.
ErrorMetrics metrics_from_row_sums(const std::vector<double>& row_diff, const std::vector<double>& row_ref,
                                   int64_t width, const std::vector<int64_t>& segments, bool any_nan);

struct Bounds {
  double whole, segment, row;
};
Bounds bounds_for(moekit_dtype_t dtype);  // bf16 1e-2/2e-2/5e-2, fp16 2e-3/4e-3/1e-2, fp32 1e-5, fp64 1e-12
bool within(const ErrorMetrics& m, const Bounds& b);
std::string describe(const ErrorMetrics& m);

std::string last_error();                         // moekit_get_last_error as a std::string
std::string plan_description(moekit_plan_t plan);  // moekit_plan_describe as a std::string

// Sets (value != nullptr) or unsets the environment variable `name` for the object's life, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_old_;
};

std::vector<int64_t> as_integers(const HostTensor& t);  // every element, truncated to int64
double max_abs(const HostTensor& t);                     // 0 for an empty tensor
double rms(const HostTensor& t);                         // 0 for an empty tensor

// A reference-backend handle, destroyed with the owner; creating it REQUIREs success.
// num_threads 0 is the library's default (hardware concurrency).
class ReferenceHandle {
 public:
  explicit ReferenceHandle(int32_t num_threads = 0);
  ~ReferenceHandle();
  ReferenceHandle(const ReferenceHandle&) = delete;
  ReferenceHandle& operator=(const ReferenceHandle&) = delete;

  moekit_handle_t handle = nullptr;
};

// A plan, destroyed with the owner, and its workspace once size_workspace() has asked the plan for the size.
struct PlanOwner {
  PlanOwner() = default;
  ~PlanOwner();
  PlanOwner(const PlanOwner&) = delete;
  PlanOwner& operator=(const PlanOwner&) = delete;

  void size_workspace();  // REQUIREs moekit_plan_workspace_size to succeed
  void* ws() { return workspace.empty() ? nullptr : workspace.data(); }  // NULL when no workspace is needed

  moekit_plan_t plan = nullptr;
  std::vector<uint8_t> workspace;
};

// Host bytes aligned to 256, as the library asks of saved buffers and workspaces (device memory's alignment).
// data() is NULL for an empty buffer, as a caller with nothing to pass would pass; non_null() keeps a real
// block behind an empty one, so a size check can be tested apart from the NULL check.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes = 0) : chunks_((bytes + sizeof(Chunk) - 1) / sizeof(Chunk)), bytes_(bytes) {}
  static AlignedBuffer non_null(size_t bytes);

  void* data() { return chunks_.empty() ? nullptr : chunks_.data(); }
  size_t size() const { return bytes_; }

 private:
  struct alignas(256) Chunk {
    unsigned char bytes[256];
  };
  std::vector<Chunk> chunks_;
  size_t bytes_;
};

// The saved buffer and the workspace of the sizes a plan asks for; each REQUIREs the size query to succeed.
AlignedBuffer saved_buffer(moekit_plan_t plan);
AlignedBuffer workspace_buffer(moekit_plan_t plan);

// A layer plan's workspace per direction (moekit_plan_layer_workspace_sizes); CHECKs that the plan's workspace
// size is the larger of the two.
struct LayerWorkspaceSizes {
  size_t forward = 0, backward = 0;
};
LayerWorkspaceSizes layer_workspace_sizes(moekit_plan_t plan);

}  // namespace moekit_test

// REQUIRE that a moekit call succeeded, printing the status and the last error otherwise.
#define MOEKIT_REQUIRE_OK(call)                                                                           \
  do {                                                                                                    \
    moekit_status_t moekit_require_status_ = (call);                                                      \
    INFO(#call << " -> " << moekit_status_string(moekit_require_status_) << ": " << moekit_test::last_error()); \
    REQUIRE(moekit_require_status_ == MOEKIT_SUCCESS);                                                    \
  } while (0)
