// The grouped GEMM's table of measured winners (cuda/gemm/gemm_tuning_sm90.tsv, built into the library): product
// classes, each with the tile, cluster and schedule that ran fastest on it in bench/device/tune_gemm.sh's
// measurement. choose_gemm_config takes a row's choice over its heuristic's for a descriptor in the row's class.
// Plain C++ (tested on the CPU).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/gemm/gemm_config.h"
#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {

// One row: a class of products (inclusive ranges; b_layout -1 for any) and its measured winner.
struct GemmTuningRow {
  int32_t mode;      // moekit_gemm_mode_t
  int32_t epilogue;  // moekit_gemm_epilogue_t
  int32_t gather;    // moekit_gemm_gather_t
  int32_t b_layout;  // moekit_gemm_b_layout_t, or -1
  int64_t n_min, n_max;        // the descriptor's n
  int64_t k_min, k_max;        // the descriptor's k
  int64_t rows_min, rows_max;  // max_rows / groups
  GemmTile tile;
  int32_t cluster;  // 1 or 2
  GemmSchedule schedule;
};

// The rows of a table's text: tab-separated columns (mode, epilogue, gather, b_layout, n_min, n_max, k_min, k_max,
// rows_min, rows_max, tile, cluster, schedule, measured), '#' comment lines, one header line (starting "mode").
// Throws std::invalid_argument naming the line and the column of the first malformed field.
std::vector<GemmTuningRow> parse_gemm_tuning_table(const std::string& text);

// The table built into the library, parsed once (compute capability 9.0).
const std::vector<GemmTuningRow>& builtin_gemm_tuning_table();

// The first row whose class holds the descriptor, or nullptr.
const GemmTuningRow* find_gemm_tuning_row(const std::vector<GemmTuningRow>& table, const moekit_gemm_desc_t& desc);

}  // namespace v0
}  // namespace moekit
