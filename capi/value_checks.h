// Building the value checks of a call (MOEKIT_HANDLE_VALIDATE) and running a call between them. Each run function
// lists its tensors' checks next to its argument checks; run_validated evaluates them on the backend around the
// operation and turns the first failure into MOEKIT_STATUS_VALIDATION_FAILED with a message naming the tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moekit/moekit.h"
#include "src/backend.h"
#include "src/value_checks.h"

namespace moekit {
inline namespace v0 {
namespace capi {

// The rows of a grouped tensor that hold values: those below bound[entry] (e.g. offsets[E]); absent = all rows.
struct RowBound {
  moekit_tensor_t bound{};
  int64_t entry = 0;
};

// Appenders; an absent tensor (data == NULL and no zero extent) adds nothing. `rows` limits dim 0.
void add_finite(std::vector<ValueCheck>& list, const char* name, const moekit_tensor_t& t, RowBound rows = {});
// Logits: -inf masks an expert, so only NaN and +inf fail.
void add_finite_or_masked(std::vector<ValueCheck>& list, const char* name, const moekit_tensor_t& t);
// The rows via[i] of t for i below `rows` (entries of via outside t's rows are left to via's own range check).
void add_finite_via(std::vector<ValueCheck>& list, const char* name, const moekit_tensor_t& t,
                    const moekit_tensor_t& via, RowBound rows = {});
// lo + r*shift <= v < hi + r*shift for the element in row r.
void add_index_range(std::vector<ValueCheck>& list, const char* name, const moekit_tensor_t& t, int64_t lo, int64_t hi,
                     RowBound rows = {}, int64_t shift = 0);
// offsets[0] == 0, non-decreasing, offsets[last] <= bound.
void add_offsets(std::vector<ValueCheck>& list, const char* name, const moekit_tensor_t& t, int64_t bound);

// An output the call writes (when `used`), and reads first when its beta is not 0.
void add_gradient(CallChecks& checks, const char* name, const moekit_tensor_t& t, bool used, double beta,
                  RowBound rows = {});

// A contiguous tensor read flat, as a rank-1 view of its elements (scores [T, K] read as [P]).
moekit_tensor_t flat_tensor(const moekit_tensor_t& t);
// The rows an offsets tensor [E+1] (or tok_offsets [T+1]) makes valid: those below its last entry.
RowBound last_entry(const moekit_tensor_t& offsets);

bool validating(const moekit_handle& handle);

// Inputs first; when they pass, `run` and then the outputs. Throws VALIDATION_FAILED naming the first failure.
void run_validated(Backend& backend, const CallChecks& checks, void* stream, const std::function<void()>& run);

// The message of a failure code of `checks` (numbered inputs, then outputs): "<tensor>: <fault>" and one of these
// endings, which tell a caller whether the outputs were written.
constexpr const char* kInputFailureEnding = " (MOEKIT_HANDLE_VALIDATE; the operation was not run)";
constexpr const char* kOutputFailureEnding = " (MOEKIT_HANDLE_VALIDATE, checked after the operation)";
std::string value_failure_message(const CallChecks& checks, uint64_t code);

}  // namespace capi
}  // namespace v0
}  // namespace moekit
