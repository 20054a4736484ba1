#include "case_config.h"

#include <algorithm>
#include <cmath>

namespace moekit_bench {

const std::vector<std::string>& op_names() {
  static const std::vector<std::string> names = {
      "router_forward",     "router_backward",     "dispatch",
      "gemm",               "combine",             "broadcast_backward",
      "db1",                "db2_ds",              "group_select",
      "moe_forward",        "moe_backward",        "moe_forward_backward",
      "sparse_ffn_forward", "sparse_ffn_backward", "sparse_ffn_forward_backward"};
  return names;
}

int64_t RoutingOptions::empty_experts(int64_t experts) const {
  if (kind != RoutingKind::lognormal || empty_fraction <= 0) return 0;
  const auto empty = static_cast<int64_t>(std::floor(empty_fraction * static_cast<double>(experts)));
  return experts >= 16 ? std::max<int64_t>(empty, 1) : empty;
}

std::string shape_text(const Shape& s) {
  const std::pair<const char*, int64_t> fields[] = {
      {"tokens", s.tokens},   {"hidden", s.hidden},         {"intermediate", s.intermediate},
      {"experts", s.experts}, {"top_k", s.top_k},           {"n", s.n},
      {"k", s.k},             {"width", s.width},           {"d_model", s.d_model},
      {"d_ff", s.d_ff},       {"group_size", s.group_size}, {"top_groups", s.top_groups},
      {"subsample", s.subsample}};
  std::string text;
  for (const auto& [name, value] : fields)
    if (value > 0) text += (text.empty() ? "" : " ") + std::string(name) + "=" + std::to_string(value);
  return text;
}

}  // namespace moekit_bench
