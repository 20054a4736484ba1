// Reading a benchmark config file (JSON): the cases it lists, validated field by field. The schema is documented in
// docs/benchmark.md.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "case_config.h"

namespace moekit_bench {

// A config that cannot be used. The message names the file, the case (its name and position) and the field, e.g.
// "smoke.json: case 'router_fwd' (#1): field 'tokens': expected an integer >= 1, got -4". moekit-bench exits 2.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct BenchConfig {
  std::string path;
  std::string description;
  std::vector<CaseConfig> cases;
};

// Reads and validates the whole file; throws ConfigError on the first problem.
BenchConfig load_config(const std::string& path);

// The shape --check runs a case at when its config gives no `check` block: the case's shape with tokens capped
// at 256, the widths (hidden, d_model, n, k, width) at 256, intermediate at 128 and d_ff at 1024 (top_groups
// scaled with d_ff, so the density is kept); experts, top_k, group_size and subsample are kept.
Shape capped_check_shape(const Shape& shape);

}  // namespace moekit_bench
