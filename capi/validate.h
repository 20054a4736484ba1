// Checks of one tensor argument against what an operation expects of it: presence, dtype, rank, shape (with the
// header's symbolic names, so a message reads "w1: expected shape [E, 2I, H] = [8, 512, 1024], got [...]"),
// strides, alignment, device and reserved fields. Every run function of capi/ checks its tensors through
// TensorCheck before the backend is called, so nothing is read or written when an argument is wrong.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "moekit/moekit.h"
#include "src/dtype_bytes.h"

namespace moekit {
inline namespace v0 {
namespace capi {

// What tensors of one call are checked against: the device of the plan's handle and its alignment rules.
struct TensorRules {
  moekit_device_t device;
  bool cuda;  // a CUDA handle: 16-byte aligned float matrices
};

// One dimension as the header writes it: its value and its symbol ("2I", "T+1").
struct Extent {
  int64_t value;
  std::string symbol;
};

const char* dtype_name(int32_t dtype);
using ::moekit::dtype_bytes;
bool is_float_dtype(int32_t dtype);

// A tensor is present when it has data, or when it has a shape with no element (PyTorch hands out NULL for
// empty tensors); a zeroed view (rank 0, data NULL) is absent.
bool is_present(const moekit_tensor_t& t);

// The run-time extent `symbol` taken from dimension 0 of `t` minus `minus` (1 for a [T+1] offsets tensor): the
// tensor must be present with rank >= 1, and the extent must lie in 0..bound (the plan's `bound_name`).
int64_t leading_extent(const char* name, const moekit_tensor_t& t, const char* symbol, int64_t bound,
                       const char* bound_name, int64_t minus = 0);

class TensorCheck {
 public:
  TensorCheck(const TensorRules& rules, const char* name, const moekit_tensor_t& t);

  TensorCheck& dtype(int32_t dtype);
  TensorCheck& dtype_in(std::initializer_list<int32_t> dtypes);
  TensorCheck& index_dtype();  // int32 or int64
  // Scores and their gradients: fp32, or also fp64 in an fp64 plan (finite-difference checks on the reference).
  TensorCheck& score_dtype(int32_t plan_dtype);
  TensorCheck& shape(std::initializer_list<Extent> dims);
  // Any rank, contiguous, exactly `count` elements: a [T, K] tensor may be passed where [P] is read flat.
  TensorCheck& flat(Extent count);

  // Presence rules; the default is required.
  TensorCheck& optional();
  TensorCheck& required_iff(bool needed, const std::string& why_absent);  // absent otherwise, with the reason
  TensorCheck& optional_iff(bool allowed, const std::string& why_absent);
  TensorCheck& required_if(bool needed);  // when needed, required; otherwise the rule so far stays
  // When not used (e.g. a gradient the call does not compute), the tensor is neither checked nor touched.
  TensorCheck& used_if(bool used);
  // When needed, the elements must follow each other without a gap (the memory is also used as one flat buffer).
  TensorCheck& contiguous_if(bool needed, const std::string& why);

  // Runs every check; throws INVALID_VALUE naming the tensor. Returns whether the tensor is present and used.
  bool check() const;

 private:
  enum class Need { required, optional, forbidden, ignored };
  void check_dtype() const;
  void check_shape() const;
  void check_flat() const;
  void check_contiguous() const;
  void check_strides() const;
  void check_extent() const;
  void check_alignment() const;
  void check_device() const;
  void check_reserved() const;
  [[noreturn]] void fail(const std::string& what) const;

  const TensorRules& rules_;
  const char* name_;
  const moekit_tensor_t& t_;
  std::vector<int32_t> dtypes_;
  std::vector<Extent> dims_;
  bool flat_ = false;
  std::string why_contiguous_;  // empty: strides with gaps are fine
  Need need_ = Need::required;
  std::string why_absent_;
};

}  // namespace capi
}  // namespace v0
}  // namespace moekit
