// One benchmark case as the config file describes it, after validation: the operation, its shapes and options, and
// how many calls to time. config_parser.cpp fills it from JSON; docs/benchmark.md documents every field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/moekit.h"

namespace moekit_bench {

enum class Op {
  router_forward,
  router_backward,
  dispatch,
  gemm,
  combine,
  broadcast_backward,
  db1,
  db2_ds,
  group_select,
  moe_forward,
  moe_backward,
  moe_forward_backward,
  sparse_ffn_forward,
  sparse_ffn_backward,
  sparse_ffn_forward_backward,
};

// Every size a case may give; which ones an operation needs is listed in config_parser.cpp. 0 = not given.
struct Shape {
  int64_t tokens = 0;
  int64_t experts = 0;
  int64_t top_k = 0;
  int64_t hidden = 0;        // H (combine, db2_ds, MoE layer)
  int64_t intermediate = 0;  // I, one GLU half (MoE layer)
  int64_t n = 0;             // grouped GEMM output width
  int64_t k = 0;             // grouped GEMM reduction length (varlen M) or C's middle dim (varlen K)
  int64_t width = 0;         // db1 row width
  int64_t d_model = 0;       // sparse FFN D
  int64_t d_ff = 0;          // sparse FFN F
  int64_t group_size = 0;    // sparse FFN G
  int64_t top_groups = 0;    // sparse FFN kg
  int64_t subsample = 0;     // sparse FFN spg (0 = all G rows)
};

// How the routing of the cases that get real routing (routing.h) is drawn: "uniform" logits, or "lognormal" skew
// (each expert's logits shifted by log w_e, w_e ~ lognormal(0, sigma), and a fraction of the experts left empty).
enum class RoutingKind { uniform, lognormal };

struct RoutingOptions {
  RoutingKind kind = RoutingKind::uniform;
  double sigma = 1.0;                 // lognormal: the sigma of log w_e
  double empty_fraction = 1.0 / 16;   // lognormal: the fraction of experts nobody routes to
  // The experts lognormal routing leaves empty: floor(empty_fraction * E), at least 1 when E >= 16 and the
  // fraction is not 0; none for uniform routing.
  int64_t empty_experts(int64_t experts) const;
};

// Calls per measurement: `warmup` untimed calls, then `repeats` rounds of `iterations` timed calls.
struct CallCounts {
  int warmup = 0;
  int iterations = 0;
  int repeats = 0;
};

struct CaseConfig {
  std::string name;
  Op op = Op::router_forward;
  std::string op_name;  // as written in the config
  moekit_dtype_t dtype = MOEKIT_DTYPE_BF16;
  Shape shape;
  Shape check_shape;  // the shape --check runs at (the `check` block, else the shape capped; see config_parser.cpp)
  uint64_t seed = 1;

  // Router (router_* and moe_*)
  moekit_router_kind_t router = MOEKIT_ROUTER_SOFTMAX_TOPK;
  bool renormalize = false;
  double router_scale = 1.0;
  // Activation (gemm GATED/DGATED, moe_*)
  moekit_activation_t activation = MOEKIT_ACT_SWIGLU;
  moekit_glu_layout_t glu_layout = MOEKIT_GLU_CONCAT;
  // MoE layer
  bool has_b1 = false;
  bool has_b2 = false;
  // moe_*, sparse_ffn_*: weight-gradient dtype (INVALID = dtype); gemm, db1, db2_ds: output dtype (INVALID = dtype)
  moekit_dtype_t weight_grad_dtype = MOEKIT_DTYPE_INVALID;
  moekit_dtype_t out_dtype = MOEKIT_DTYPE_INVALID;
  // Grouped GEMM
  moekit_gemm_mode_t mode = MOEKIT_GEMM_VARLEN_M;
  moekit_gemm_epilogue_t epilogue = MOEKIT_EPILOGUE_STORE;
  moekit_gemm_gather_t gather = MOEKIT_GEMM_GATHER_NONE;
  moekit_gemm_b_layout_t b_layout = MOEKIT_GEMM_B_NK;
  double beta = 0;  // STORE/BIAS (varlen M) and varlen K: C = AB + beta C; nonzero: C starts random and is read
  // Operations with real routing (routing.h)
  RoutingOptions routing;
  // db2_ds: also compute db2 (else ds only)
  bool with_db2 = true;

  CallCounts cuda_counts;       // on the CUDA backend
  CallCounts reference_counts;  // on the reference backend (wall clock, smaller by default)
  bool graph = false;           // CUDA backend: replay each call from a captured CUDA graph

  std::string json;  // the case as read, defaults merged (echoed into the results)
};

// The operation names of the config file, in the order of the Op enum.
const std::vector<std::string>& op_names();
inline const std::string& op_name(Op op) { return op_names()[static_cast<size_t>(op)]; }

// "tokens=256 experts=8 top_k=2": the sizes a shape gives, in a fixed order.
std::string shape_text(const Shape& shape);

}  // namespace moekit_bench
