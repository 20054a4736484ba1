// The grouped GEMM's table of measured winners (cuda/gemm/gemm_tuning.h): the table built into the library parses
// and holds only choices the kernels can run; a table's text parses row by row, and each malformed field is refused
// with its line and column; a descriptor finds the first row whose class holds it; choose_gemm_config takes a row's
// tile, cluster and schedule on compute capability 9.0, and the environment's overrides over it.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/gemm/gemm_config.h"
#include "cuda/gemm/gemm_tuning.h"
#include "plan_descs.h"

using moekit::GemmConfig;
using moekit::GemmDevice;
using moekit::GemmOverrides;
using moekit::GemmPath;
using moekit::GemmPathOverride;
using moekit::GemmSchedule;
using moekit::GemmTile;
using moekit::GemmTuningRow;

namespace {

const std::string kHeader =
    "mode\tepilogue\tgather\tb_layout\tn_min\tn_max\tk_min\tk_max\trows_min\trows_max\ttile\tcluster\tschedule\t"
    "measured\n";

// The up-projection's descriptor (plan_descs.h) at another shape.
moekit_gemm_desc_t up_projection(int64_t groups, int64_t rows, int64_t n, int64_t k) {
  moekit_gemm_desc_t d = plan_descs::gated_gemm_desc();
  d.groups = groups;
  d.max_rows = d.gather_rows = rows;
  d.n = n;
  d.k = k;
  return d;
}

std::string parse_error(const std::string& text) {
  try {
    moekit::parse_gemm_tuning_table(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("gemm tuning: the built-in table parses and holds runnable choices", "[gemm]") {
  const std::vector<GemmTuningRow>& table = moekit::builtin_gemm_tuning_table();
  for (const GemmTuningRow& r : table) {
    CHECK((r.cluster == 1 || r.cluster == 2));
    CHECK((r.schedule == GemmSchedule::cooperative || r.tile == GemmTile::m128_n128));
    CHECK(r.n_min <= r.n_max);
  }
  CHECK(&table == &moekit::builtin_gemm_tuning_table());  // parsed once
}

TEST_CASE("gemm tuning: a table's rows, comments and header", "[gemm]") {
  const std::string text = "# a comment\n" + kHeader +
                           "varlen_m\tgated\ta\tnk\t512\t512\t768\t2048\t1000\t5000\t128x128\t2\tpingpong\tcase x 1.04\n"
                           "varlen_k\tstore\tb\tany\t0\t9999\t1\t9999\t0\t99999\t128x256\t1\tcooperative\t-\n";
  const std::vector<GemmTuningRow> rows = moekit::parse_gemm_tuning_table(text);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].mode == MOEKIT_GEMM_VARLEN_M);
  CHECK(rows[0].epilogue == MOEKIT_EPILOGUE_GATED);
  CHECK(rows[0].gather == MOEKIT_GEMM_GATHER_A);
  CHECK(rows[0].b_layout == MOEKIT_GEMM_B_NK);
  CHECK((rows[0].n_min == 512 && rows[0].n_max == 512 && rows[0].k_min == 768 && rows[0].k_max == 2048));
  CHECK((rows[0].rows_min == 1000 && rows[0].rows_max == 5000));
  CHECK(rows[0].tile == GemmTile::m128_n128);
  CHECK(rows[0].cluster == 2);
  CHECK(rows[0].schedule == GemmSchedule::pingpong);
  CHECK(rows[1].b_layout == -1);
  CHECK(rows[1].gather == MOEKIT_GEMM_GATHER_B);
  CHECK(moekit::parse_gemm_tuning_table(kHeader).empty());
}

TEST_CASE("gemm tuning: a malformed table is refused with its line and column", "[gemm]") {
  const std::string good = "varlen_m\tstore\tnone\tkn\t1\t2\t3\t4\t5\t6\t128x256\t1\tcooperative\tm\n";
  CHECK(parse_error(kHeader + good).empty());
  CHECK(parse_error(good).find("line 1, column mode") != std::string::npos);  // no header first
  CHECK(parse_error("").find("no header") != std::string::npos);
  const auto with = [&](int column, const std::string& value) {
    std::vector<std::string> f;
    size_t at = 0;
    for (size_t tab; (tab = good.find_first_of("\t\n", at)) != std::string::npos; at = tab + 1)
      f.push_back(good.substr(at, tab - at));
    f[static_cast<size_t>(column)] = value;
    std::string line;
    for (size_t i = 0; i < f.size(); ++i) line += (i ? "\t" : "") + f[i];
    return parse_error(kHeader + line + "\n");
  };
  CHECK(with(0, "varlen_x").find("line 2, column mode: \"varlen_x\" is not varlen_m or varlen_k") !=
        std::string::npos);
  CHECK(with(1, "gelu").find("column epilogue") != std::string::npos);
  CHECK(with(2, "c").find("column gather") != std::string::npos);
  CHECK(with(3, "mn").find("column b_layout") != std::string::npos);
  CHECK(with(4, "-1").find("column n_min") != std::string::npos);
  CHECK(with(5, "x").find("column n_max") != std::string::npos);
  CHECK(with(7, "2").find("column k_max: \"2\" is not at least k_min") != std::string::npos);
  CHECK(with(10, "64x64").find("column tile") != std::string::npos);
  CHECK(with(11, "4").find("column cluster") != std::string::npos);
  CHECK(with(12, "pingpong").find("ping-pong runs varlen M at 128x128") != std::string::npos);  // at 128x256
  CHECK(parse_error(kHeader + "varlen_m\tstore\n").find("line 2: 2 tab-separated fields") != std::string::npos);
}

TEST_CASE("gemm tuning: the first row whose class holds the descriptor", "[gemm]") {
  const std::vector<GemmTuningRow> table = moekit::parse_gemm_tuning_table(
      kHeader + "varlen_m\tgated\ta\tnk\t256\t256\t768\t768\t256\t1024\t128x128\t1\tpingpong\tfirst\n" +
      "varlen_m\tgated\ta\tany\t0\t99999\t0\t99999\t0\t99999\t128x256\t2\tcooperative\tsecond\n");
  const moekit_gemm_desc_t d = up_projection(128, 128 * 512, 256, 768);
  CHECK(moekit::find_gemm_tuning_row(table, d) == &table[0]);
  CHECK(moekit::find_gemm_tuning_row(table, up_projection(128, 128 * 1024, 256, 768)) == &table[0]);  // bounds
  CHECK(moekit::find_gemm_tuning_row(table, up_projection(128, 128 * 1025, 256, 768)) == &table[1]);
  CHECK(moekit::find_gemm_tuning_row(table, up_projection(128, 128 * 512, 264, 768)) == &table[1]);
  CHECK(moekit::find_gemm_tuning_row(table, up_projection(128, 128 * 512, 256, 776)) == &table[1]);
  moekit_gemm_desc_t other = d;
  other.gather = MOEKIT_GEMM_GATHER_NONE;
  CHECK(moekit::find_gemm_tuning_row(table, other) == nullptr);
  other = d;
  other.epilogue = MOEKIT_EPILOGUE_STORE;
  CHECK(moekit::find_gemm_tuning_row(table, other) == nullptr);
  other = d;
  other.b_layout = MOEKIT_GEMM_B_KN;  // only the "any" row
  CHECK(moekit::find_gemm_tuning_row(table, other) == &table[1]);
}

TEST_CASE("gemm tuning: choose_gemm_config takes a row's choice on sm_90, the overrides over it", "[gemm]") {
  const std::vector<GemmTuningRow> table = moekit::parse_gemm_tuning_table(
      kHeader + "varlen_m\tgated\ta\tany\t0\t99999\t0\t99999\t0\t99999\t128x128\t2\tpingpong\trow\n");
  const moekit_gemm_desc_t d = up_projection(128, 128 * 1024, 4096, 1024);
  const GemmDevice h200{132, 9, 0}, sm80{108, 8, 0};
  const GemmConfig heuristic = choose_gemm_config(d, h200, GemmOverrides{}, {});
  CHECK(heuristic.variants[0].kernel.tile == GemmTile::m128_n256);
  CHECK(heuristic.variants[0].kernel.cluster == 1);
  const GemmConfig tuned = choose_gemm_config(d, h200, GemmOverrides{}, table);
  for (int i = 0; i < tuned.count; ++i) {
    CHECK(tuned.variants[i].kernel.tile == GemmTile::m128_n128);
    CHECK(tuned.variants[i].kernel.cluster == 2);
    CHECK(tuned.variants[i].kernel.schedule == GemmSchedule::pingpong);
  }
  CHECK(tuned.workspace.n_tiles == 4096 / 128);  // the layout follows the row's tile
  // Another device keeps the heuristic (the table is measured on compute capability 9.0).
  CHECK(choose_gemm_config(d, sm80, GemmOverrides{}, table).variants[0].kernel.path == GemmPath::mma_sync);
  // A path override drops the row; a tile or schedule override wins over it.
  GemmOverrides path{};
  path.path = GemmPathOverride::wgmma_single;
  const GemmConfig single = choose_gemm_config(d, h200, path, table);
  CHECK(single.variants[0].kernel.tile == GemmTile::m128_n256);
  CHECK(single.variants[0].kernel.cluster == 1);
  GemmOverrides schedule{};
  schedule.schedule_forced = true;
  schedule.schedule = GemmSchedule::cooperative;
  const GemmConfig cooperative = choose_gemm_config(d, h200, schedule, table);
  CHECK(cooperative.variants[0].kernel.schedule == GemmSchedule::cooperative);
  CHECK(cooperative.variants[0].kernel.tile == GemmTile::m128_n128);
  CHECK(cooperative.variants[0].kernel.cluster == 2);
}
