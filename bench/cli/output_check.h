// --check: runs a case once at its check shape on the backend under test and on the reference backend (the same
// inputs, bit for bit) and compares every output the case declares (TensorSpec::compare): the relative error of
// float outputs against docs/math.md section 9's whole-tensor bound, integers exactly, selections up to near-ties.
#pragma once

#include "case_config.h"
#include "case_result.h"
#include "platform.h"

namespace moekit_bench {

// `platform`/`handle`: the backend under test. `reference`/`reference_handle`: the oracle (host memory, a
// reference handle; on the reference backend a second handle with one worker thread, so the check shows the
// result does not depend on the thread count). Never throws.
CheckResult check_case(const CaseConfig& config, Platform& platform, moekit_handle_t handle, Platform& reference,
                       moekit_handle_t reference_handle, const std::string& against);

}  // namespace moekit_bench
