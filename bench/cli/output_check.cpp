#include "output_check.h"

#include <cmath>
#include <cstring>
#include <memory>

#include "src/numeric.h"
#include "workload.h"

namespace moekit_bench {
namespace {

// docs/math.md section 9, whole-tensor bound, by the case's storage dtype.
double tolerance(moekit_dtype_t dtype) {
  switch (dtype) {
    case MOEKIT_DTYPE_BF16: return 1e-2;
    case MOEKIT_DTYPE_FP16: return 2e-3;
    case MOEKIT_DTYPE_FP32: return 1e-5;
    default: return 1e-12;
  }
}

// One run of a case's timed calls on a platform, its outputs downloaded.
struct Outputs {
  std::vector<TensorSpec> specs;
  std::vector<std::vector<unsigned char>> bytes;  // per spec; empty for tensors not compared (or keys not needed)
};

Outputs run_once(const CaseConfig& config, Platform& platform, moekit_handle_t handle) {
  std::unique_ptr<Workload> workload = make_workload(config, config.check_shape);
  check_call(workload->create_plan(handle), "plan creation");
  TensorSet set(platform, workload->tensors(), config.seed);
  Buffer workspace(platform, workload->workspace_bytes());
  workload->bind({&set}, workspace.data(), workspace.bytes());
  for (int step : workload->timed_steps())
    check_call(workload->run_step(step, 0, platform.stream()), workload->step_name(step).c_str());
  platform.synchronize();
  Outputs out;
  out.specs = workload->tensors();
  for (size_t i = 0; i < out.specs.size(); ++i)
    out.bytes.push_back(out.specs[i].compare == Compare::none ? std::vector<unsigned char>{} : set.download(i));
  return out;
}

double element(const std::vector<unsigned char>& bytes, moekit_dtype_t dtype, int64_t i) {
  const unsigned char* p = bytes.data();
  switch (dtype) {
    case MOEKIT_DTYPE_BF16:
    case MOEKIT_DTYPE_FP16: {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return dtype == MOEKIT_DTYPE_BF16 ? moekit::bf16_to_float(v) : moekit::fp16_to_float(v);
    }
    case MOEKIT_DTYPE_FP32: {
      float v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case MOEKIT_DTYPE_INT32: {
      int32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    default: {
      double v;
      std::memcpy(&v, p + 8 * i, 8);
      return v;
    }
  }
}

int64_t rows_of(const TensorSpec& s) { return s.shape.empty() ? 1 : s.shape[0]; }

// Rows (first dimension) of tensor `index` that differ between the two runs.
std::vector<bool> differing_rows(const Outputs& a, const Outputs& b, size_t index) {
  const TensorSpec& s = a.specs[index];
  const int64_t rows = rows_of(s), width = rows > 0 ? s.elements() / rows : 0;
  const size_t row_bytes = static_cast<size_t>(width) * dtype_bytes(s.dtype);
  std::vector<bool> differ(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    differ[r] = std::memcmp(a.bytes[index].data() + r * row_bytes, b.bytes[index].data() + r * row_bytes, row_bytes) != 0;
  return differ;
}

OutputCheck compare(const Outputs& tested, const Outputs& oracle, size_t index, moekit_dtype_t case_dtype) {
  const TensorSpec& s = tested.specs[index];
  OutputCheck c;
  c.name = s.name;
  if (s.compare == Compare::exact || s.compare == Compare::selection) {
    const bool exact = s.compare == Compare::exact;
    c.kind = exact ? "exact" : "selection";
    if (exact) {
      for (int64_t i = 0; i < s.elements(); ++i)
        c.mismatches += element(tested.bytes[index], s.dtype, i) != element(oracle.bytes[index], s.dtype, i);
      c.ok = c.mismatches == 0;
    } else {
      for (bool d : differing_rows(tested, oracle, index)) c.mismatches += d;
      // Near-ties may choose differently (docs/math.md section 9): at most 1% of the rows, or one.
      c.ok = c.mismatches <= std::max<int64_t>(1, rows_of(s) / 100);
    }
    return c;
  }

  c.kind = "values";
  c.tolerance = tolerance(case_dtype);
  std::vector<bool> skip(static_cast<size_t>(rows_of(s)), false);
  if (!s.rows_keyed_on.empty()) {
    for (size_t k = 0; k < tested.specs.size(); ++k)
      if (tested.specs[k].name == s.rows_keyed_on) skip = differing_rows(tested, oracle, k);
  }
  const int64_t rows = rows_of(s), width = rows > 0 ? s.elements() / rows : 0;
  double diff = 0, norm = 0;
  bool nan = false;
  for (int64_t r = 0; r < rows; ++r) {
    if (skip[r]) {
      ++c.rows_skipped;
      continue;
    }
    for (int64_t j = r * width; j < (r + 1) * width; ++j) {
      const double x = element(tested.bytes[index], s.dtype, j), y = element(oracle.bytes[index], s.dtype, j);
      nan = nan || std::isnan(x) || std::isnan(y);
      diff += (x - y) * (x - y);
      norm += y * y;
    }
  }
  c.rel_error = nan ? kNone : norm > 0 ? std::sqrt(diff / norm) : (diff > 0 ? INFINITY : 0.0);
  c.ok = !nan && c.rel_error <= c.tolerance;
  return c;
}

}  // namespace

CheckResult check_case(const CaseConfig& config, Platform& platform, moekit_handle_t handle, Platform& reference,
                       moekit_handle_t reference_handle, const std::string& against) {
  CheckResult result;
  result.ran = true;
  result.shape = shape_text(config.check_shape);
  result.against = against;
  try {
    const Outputs tested = run_once(config, platform, handle);
    const Outputs oracle = run_once(config, reference, reference_handle);
    for (size_t i = 0; i < tested.specs.size(); ++i)
      if (tested.specs[i].compare != Compare::none) result.outputs.push_back(compare(tested, oracle, i, config.dtype));
  } catch (const CaseFailure& e) {
    result.status = e.status == MOEKIT_STATUS_NOT_SUPPORTED ? CaseStatus::not_supported : CaseStatus::failed;
    result.message = e.what();
  } catch (const std::exception& e) {
    result.status = CaseStatus::failed;
    result.message = e.what();
  }
  return result;
}

}  // namespace moekit_bench
