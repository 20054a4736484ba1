#include "capi/value_checks.h"

#include <limits>
#include <string>

#include "capi/validate.h"
#include "cuda/common/status_error.h"
#include "cuda/common/value_check_code.h"

namespace moekit {
inline namespace v0 {
namespace capi {

namespace {

ValueCheck make_check(const char* name, const moekit_tensor_t& t, ValueRule rule, RowBound rows) {
  ValueCheck c;
  c.name = name;
  c.tensor = t;
  c.rule = rule;
  c.rows = rows.bound;
  c.rows_entry = rows.entry;
  return c;
}

// Row-major coordinates of element `position` of t: "[3, 1]".
std::string coordinates(const moekit_tensor_t& t, uint64_t position) {
  std::string text;
  for (int32_t i = t.rank - 1; i >= 0; --i) {
    const uint64_t extent = t.shape[i] > 0 ? static_cast<uint64_t>(t.shape[i]) : 1;
    const std::string part = std::to_string(i == 0 ? position : position % extent);
    text = i == t.rank - 1 ? part : part + ", " + text;
    position /= extent;
  }
  return "[" + text + "]";
}

std::string fault_text(const ValueCheck& c, uint64_t position, uint32_t fault) {
  const std::string at = "element " + coordinates(c.tensor, position);
  switch (fault) {
    case kFaultNaN: return at + " is NaN";
    case kFaultPositiveInf: return at + " is +inf";
    case kFaultNegativeInf: return at + " is -inf";
    case kFaultBelowRange:
    case kFaultAboveRange: {
      int64_t row_width = 1;
      for (int32_t i = 1; i < c.tensor.rank; ++i) row_width *= c.tensor.shape[i];
      const int64_t row = static_cast<int64_t>(position) / (row_width > 0 ? row_width : 1);
      const std::string lo = std::to_string(c.lo + row * c.shift);
      if (c.hi == std::numeric_limits<int64_t>::max()) return at + " is below " + lo;
      return at + " is outside [" + lo + ", " + std::to_string(c.hi + row * c.shift) + ")";
    }
    case kFaultFirstNotZero: return "entry 0 is not 0 (offsets start at 0)";
    case kFaultDecreasing:
      return "entry " + std::to_string(position) + " is below entry " + std::to_string(position - 1) +
             " (offsets never decrease)";
    case kFaultPastBound:
      return "last entry " + std::to_string(position) + " exceeds the " + std::to_string(c.hi) +
             " rows the offsets index";
  }
  return at + " failed an unknown check";
}

}  // namespace

void add_finite(std::vector<ValueCheck>& list, const char* name, const moekit_tensor_t& t, RowBound rows) {
  if (is_present(t)) list.push_back(make_check(name, t, ValueRule::finite, rows));
}

void add_finite_or_masked(std::vector<ValueCheck>& list, const char* name, const moekit_tensor_t& t) {
  if (is_present(t)) list.push_back(make_check(name, t, ValueRule::finite_or_masked, {}));
}

void add_finite_via(std::vector<ValueCheck>& list, const char* name, const moekit_tensor_t& t,
                    const moekit_tensor_t& via, RowBound rows) {
  if (!is_present(t)) return;
  ValueCheck c = make_check(name, t, ValueRule::finite, rows);
  c.via = via;
  list.push_back(c);
}

void add_index_range(std::vector<ValueCheck>& list, const char* name, const moekit_tensor_t& t, int64_t lo, int64_t hi,
                     RowBound rows, int64_t shift) {
  if (!is_present(t)) return;
  ValueCheck c = make_check(name, t, ValueRule::index_range, rows);
  c.lo = lo;
  c.hi = hi;
  c.shift = shift;
  list.push_back(c);
}

void add_offsets(std::vector<ValueCheck>& list, const char* name, const moekit_tensor_t& t, int64_t bound) {
  if (!is_present(t)) return;
  ValueCheck c = make_check(name, t, ValueRule::offsets, {});
  c.hi = bound;
  list.push_back(c);
}

void add_gradient(CallChecks& checks, const char* name, const moekit_tensor_t& t, bool used, double beta,
                  RowBound rows) {
  if (!used) return;
  if (beta != 0) add_finite(checks.inputs, name, t, rows);
  add_finite(checks.outputs, name, t, rows);
}

moekit_tensor_t flat_tensor(const moekit_tensor_t& t) {
  int64_t count = 1;
  for (int32_t i = 0; i < t.rank; ++i) count *= t.shape[i];
  moekit_tensor_t flat = t;
  flat.rank = 1;
  flat.shape[0] = count;
  flat.stride[0] = 1;
  for (int32_t i = 1; i < MOEKIT_MAX_RANK; ++i) flat.shape[i] = flat.stride[i] = 0;
  return flat;
}

RowBound last_entry(const moekit_tensor_t& offsets) { return RowBound{offsets, offsets.shape[0] - 1}; }

bool validating(const moekit_handle& handle) { return (handle.desc.flags & MOEKIT_HANDLE_VALIDATE) != 0; }

std::string value_failure_message(const CallChecks& checks, uint64_t code) {
  const size_t index = value_failure_check(code);
  const size_t inputs = checks.inputs.size();
  if (index >= inputs + checks.outputs.size()) return "internal: a value check reported an unknown tensor";
  const ValueCheck& c = index < inputs ? checks.inputs[index] : checks.outputs[index - inputs];
  return c.name + ": " + fault_text(c, value_failure_position(code), value_failure_fault(code)) +
         (index < inputs ? kInputFailureEnding : kOutputFailureEnding);
}

void run_validated(Backend& backend, const CallChecks& checks, void* stream, const std::function<void()>& run) {
  uint64_t code = backend.check_values(checks.inputs, 0, stream);
  if (code == kNoValueFailure) {
    run();
    code = backend.check_values(checks.outputs, static_cast<uint32_t>(checks.inputs.size()), stream);
  }
  if (code != kNoValueFailure) throw Error(MOEKIT_STATUS_VALIDATION_FAILED, value_failure_message(checks, code));
}

}  // namespace capi
}  // namespace v0
}  // namespace moekit
