#include "cuda/gemm/gemm_tuning.h"

#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace moekit {
inline namespace v0 {

namespace {

// The table's text, embedded by CMake from cuda/gemm/gemm_tuning_sm90.tsv.
const char* const kBuiltinTable =
#include "cuda/gemm/gemm_tuning_sm90.inc"
    ;

constexpr int kColumns = 14;
const char* const kColumnNames[kColumns] = {"mode",     "epilogue", "gather", "b_layout", "n_min",
                                            "n_max",    "k_min",    "k_max",  "rows_min", "rows_max",
                                            "tile",     "cluster",  "schedule", "measured"};

struct Name {
  const char* text;
  int32_t value;
};

[[noreturn]] void malformed(int line, int column, const std::string& field, const char* expected) {
  throw std::invalid_argument("grouped GEMM tuning table, line " + std::to_string(line) + ", column " +
                              kColumnNames[column] + ": \"" + field + "\" is not " + expected);
}

template <size_t N>
int32_t named(const Name (&names)[N], int line, int column, const std::string& field) {
  std::string expected;
  for (const Name& n : names) {
    if (field == n.text) return n.value;
    expected += (expected.empty() ? "" : " or ") + std::string(n.text);
  }
  malformed(line, column, field, expected.c_str());
}

int64_t count(int line, int column, const std::string& field) {
  char* end = nullptr;
  const long long value = std::strtoll(field.c_str(), &end, 10);
  if (field.empty() || *end != '\0' || value < 0) malformed(line, column, field, "a count (0 or more)");
  return value;
}

}  // namespace

std::vector<GemmTuningRow> parse_gemm_tuning_table(const std::string& text) {
  static const Name modes[] = {{"varlen_m", MOEKIT_GEMM_VARLEN_M}, {"varlen_k", MOEKIT_GEMM_VARLEN_K}};
  static const Name epilogues[] = {{"store", MOEKIT_EPILOGUE_STORE},
                                   {"bias", MOEKIT_EPILOGUE_BIAS},
                                   {"gated", MOEKIT_EPILOGUE_GATED},
                                   {"dgated", MOEKIT_EPILOGUE_DGATED}};
  static const Name gathers[] = {
      {"none", MOEKIT_GEMM_GATHER_NONE}, {"a", MOEKIT_GEMM_GATHER_A}, {"b", MOEKIT_GEMM_GATHER_B}};
  static const Name layouts[] = {{"nk", MOEKIT_GEMM_B_NK}, {"kn", MOEKIT_GEMM_B_KN}, {"any", -1}};
  static const Name tiles[] = {{"128x256", static_cast<int32_t>(GemmTile::m128_n256)},
                               {"128x128", static_cast<int32_t>(GemmTile::m128_n128)}};
  static const Name clusters[] = {{"1", 1}, {"2", 2}};
  static const Name schedules[] = {{"cooperative", static_cast<int32_t>(GemmSchedule::cooperative)},
                                   {"pingpong", static_cast<int32_t>(GemmSchedule::pingpong)}};
  std::vector<GemmTuningRow> rows;
  std::istringstream lines(text);
  std::string line;
  bool header = false;
  for (int number = 1; std::getline(lines, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    std::istringstream fields(line);
    for (std::string field; std::getline(fields, field, '\t');) f.push_back(field);
    if (static_cast<int>(f.size()) != kColumns)
      throw std::invalid_argument("grouped GEMM tuning table, line " + std::to_string(number) + ": " +
                                  std::to_string(f.size()) + " tab-separated fields, not " +
                                  std::to_string(kColumns));
    if (!header) {
      for (int c = 0; c < kColumns; ++c)
        if (f[c] != kColumnNames[c]) malformed(number, c, f[c], "the header's column name");
      header = true;
      continue;
    }
    GemmTuningRow r{};
    r.mode = named(modes, number, 0, f[0]);
    r.epilogue = named(epilogues, number, 1, f[1]);
    r.gather = named(gathers, number, 2, f[2]);
    r.b_layout = named(layouts, number, 3, f[3]);
    r.n_min = count(number, 4, f[4]);
    r.n_max = count(number, 5, f[5]);
    r.k_min = count(number, 6, f[6]);
    r.k_max = count(number, 7, f[7]);
    r.rows_min = count(number, 8, f[8]);
    r.rows_max = count(number, 9, f[9]);
    r.tile = static_cast<GemmTile>(named(tiles, number, 10, f[10]));
    r.cluster = named(clusters, number, 11, f[11]);
    r.schedule = static_cast<GemmSchedule>(named(schedules, number, 12, f[12]));
    if (r.n_min > r.n_max) malformed(number, 5, f[5], "at least n_min");
    if (r.k_min > r.k_max) malformed(number, 7, f[7], "at least k_min");
    if (r.rows_min > r.rows_max) malformed(number, 9, f[9], "at least rows_min");
    if (r.schedule == GemmSchedule::pingpong && (r.mode != MOEKIT_GEMM_VARLEN_M || r.tile != GemmTile::m128_n128))
      malformed(number, 12, f[12], "possible here (ping-pong runs varlen M at 128x128)");
    rows.push_back(r);
  }
  if (!header) throw std::invalid_argument("grouped GEMM tuning table: no header line");
  return rows;
}

const std::vector<GemmTuningRow>& builtin_gemm_tuning_table() {
  static const std::vector<GemmTuningRow> table = parse_gemm_tuning_table(kBuiltinTable);
  return table;
}

const GemmTuningRow* find_gemm_tuning_row(const std::vector<GemmTuningRow>& table, const moekit_gemm_desc_t& d) {
  const int64_t rows_per_group = d.groups > 0 ? d.max_rows / d.groups : 0;
  const auto within = [](int64_t v, int64_t lo, int64_t hi) { return lo <= v && v <= hi; };
  for (const GemmTuningRow& r : table) {
    if (r.mode == d.mode && r.epilogue == d.epilogue && r.gather == d.gather &&
        (r.b_layout < 0 || r.b_layout == d.b_layout) && within(d.n, r.n_min, r.n_max) &&
        within(d.k, r.k_min, r.k_max) && within(rows_per_group, r.rows_min, r.rows_max))
      return &r;
  }
  return nullptr;
}

}  // namespace v0
}  // namespace moekit
