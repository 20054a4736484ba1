// The two outputs of a run: JSON for machines (the `meta` block and one record per case; docs/benchmark.md lists
// every field) and, printed last, a table for people preceded by the details a table cannot hold (check errors
// per output, kernel breakdowns, why a case did not run).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "case_result.h"
#include "run_meta.h"

namespace moekit_bench {

std::string results_json(const RunMeta& meta, const std::vector<CaseResult>& results);
void print_details(std::FILE* out, const std::vector<CaseResult>& results);
void print_table(std::FILE* out, const RunMeta& meta, const std::vector<CaseResult>& results);

}  // namespace moekit_bench
