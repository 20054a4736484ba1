// The results' `meta` block: what ran, where, when, and against which ceilings.
#pragma once

#include <string>
#include <vector>

#include "platform.h"

namespace moekit_bench {

struct RunMeta {
  std::string moekit_version;  // of the library linked in ("0.2.0")
  std::string git_sha;         // of the source tree at configure time ("unknown" outside a git checkout)
  std::string backend;         // "cuda" or "reference"
  std::string backend_note;    // why this backend (e.g. the automatic fallback's reason)
  DeviceDescription device;
  double gemm_ceiling_tflops = 0;  // measured in this run (CUDA backend); 0 = none
  double copy_ceiling_gbps = 0;
  std::string timing_method;
  std::string date;  // UTC, ISO 8601
  std::string config_path;
  std::string config_description;
  std::string command_line;
};

std::string moekit_version_text();  // moekit_get_version() as "MAJOR.MINOR.PATCH"
std::string configure_time_git_sha();
std::string utc_now();

}  // namespace moekit_bench
