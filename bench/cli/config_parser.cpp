#include "config_parser.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "cuda/common/activation_kind.h"

namespace moekit_bench {

namespace {

using nlohmann::json;

// Built-in call counts: the CUDA backend times with CUDA events, the reference backend with the wall clock on
// calls that take milliseconds to seconds, hence fewer.
constexpr CallCounts kCudaCounts{10, 100, 3};
constexpr CallCounts kReferenceCounts{1, 3, 2};

// Fields every case may carry.
const std::vector<std::string> kCommonFields = {"name",    "op",    "dtype",     "seed",  "warmup", "iterations",
                                                "repeats", "graph", "reference", "check", "note"};

// The fields each operation reads: required first, then optional ones.
struct OpFields {
  std::vector<std::string> required;
  std::vector<std::string> optional;
};

const std::vector<std::string> kRouterOptions = {"router", "renormalize", "router_scale"};
// The operations that get real routing (routing.h) read these.
const std::vector<std::string> kRoutingOptions = {"routing", "routing_sigma", "routing_empty"};

std::vector<std::string> with_routing(std::vector<std::string> optional) {
  optional.insert(optional.end(), kRoutingOptions.begin(), kRoutingOptions.end());
  return optional;
}

OpFields fields_of(Op op) {
  switch (op) {
    case Op::router_forward: return {{"tokens", "experts", "top_k"}, kRouterOptions};
    case Op::router_backward: return {{"tokens", "experts", "top_k"}, with_routing(kRouterOptions)};
    case Op::dispatch: return {{"tokens", "experts", "top_k"}, with_routing({})};
    case Op::gemm:
      return {{"tokens", "experts", "top_k", "mode", "n", "k"},
              with_routing({"epilogue", "gather", "b_layout", "activation", "glu_layout", "out_dtype", "beta"})};
    case Op::combine:
    case Op::broadcast_backward: return {{"tokens", "experts", "top_k", "hidden"}, with_routing({})};
    case Op::db1: return {{"tokens", "experts", "top_k", "width"}, with_routing({"out_dtype"})};
    case Op::db2_ds: return {{"tokens", "experts", "top_k", "hidden"}, with_routing({"out_dtype", "with_db2"})};
    case Op::group_select:
      return {{"tokens", "d_model", "d_ff", "group_size"}, {"top_groups", "density", "subsample"}};
    case Op::moe_forward:
    case Op::moe_backward:
    case Op::moe_forward_backward: {
      OpFields f{{"tokens", "hidden", "intermediate", "experts", "top_k"},
                 {"activation", "glu_layout", "has_b1", "has_b2", "weight_grad_dtype"}};
      f.optional.insert(f.optional.end(), kRouterOptions.begin(), kRouterOptions.end());
      return f;
    }
    case Op::sparse_ffn_forward:
    case Op::sparse_ffn_backward:
    case Op::sparse_ffn_forward_backward:
      return {{"tokens", "d_model", "d_ff", "group_size"}, {"top_groups", "density", "subsample", "weight_grad_dtype"}};
  }
  return {};
}

bool is_sparse_ffn_like(Op op) {
  return op == Op::group_select || op == Op::sparse_ffn_forward || op == Op::sparse_ffn_backward ||
         op == Op::sparse_ffn_forward_backward;
}

// Shape fields a `check` block may override.
const std::vector<std::string> kShapeFields = {"tokens", "experts",  "top_k",      "hidden",     "intermediate",
                                               "n",      "k",        "width",      "d_model",    "d_ff",
                                               "group_size", "top_groups", "density", "subsample"};

const std::map<std::string, moekit_dtype_t> kDtypes = {
    {"bf16", MOEKIT_DTYPE_BF16}, {"fp16", MOEKIT_DTYPE_FP16}, {"fp32", MOEKIT_DTYPE_FP32}, {"fp64", MOEKIT_DTYPE_FP64}};
const std::map<std::string, moekit_router_kind_t> kRouters = {{"softmax_topk", MOEKIT_ROUTER_SOFTMAX_TOPK},
                                                              {"topk_softmax", MOEKIT_ROUTER_TOPK_SOFTMAX},
                                                              {"topk", MOEKIT_ROUTER_TOPK},
                                                              {"sigmoid", MOEKIT_ROUTER_SIGMOID}};
const std::map<std::string, moekit_activation_t> kActivations = {
    {"swiglu", MOEKIT_ACT_SWIGLU}, {"geglu", MOEKIT_ACT_GEGLU}, {"reglu", MOEKIT_ACT_REGLU},
    {"swiglu_oai", MOEKIT_ACT_SWIGLU_OAI}, {"gelu", MOEKIT_ACT_GELU}, {"relu", MOEKIT_ACT_RELU},
    {"silu", MOEKIT_ACT_SILU}, {"relu2", MOEKIT_ACT_RELU2}};
const std::map<std::string, moekit_glu_layout_t> kGluLayouts = {{"concat", MOEKIT_GLU_CONCAT},
                                                                {"interleaved", MOEKIT_GLU_INTERLEAVED}};
const std::map<std::string, moekit_gemm_mode_t> kModes = {{"varlen_m", MOEKIT_GEMM_VARLEN_M},
                                                          {"varlen_k", MOEKIT_GEMM_VARLEN_K}};
const std::map<std::string, moekit_gemm_epilogue_t> kEpilogues = {{"store", MOEKIT_EPILOGUE_STORE},
                                                                  {"bias", MOEKIT_EPILOGUE_BIAS},
                                                                  {"gated", MOEKIT_EPILOGUE_GATED},
                                                                  {"dgated", MOEKIT_EPILOGUE_DGATED}};
const std::map<std::string, moekit_gemm_gather_t> kGathers = {
    {"none", MOEKIT_GEMM_GATHER_NONE}, {"a", MOEKIT_GEMM_GATHER_A}, {"b", MOEKIT_GEMM_GATHER_B}};
const std::map<std::string, moekit_gemm_b_layout_t> kBLayouts = {{"nk", MOEKIT_GEMM_B_NK}, {"kn", MOEKIT_GEMM_B_KN}};
const std::map<std::string, RoutingKind> kRoutingKinds = {{"uniform", RoutingKind::uniform},
                                                          {"lognormal", RoutingKind::lognormal}};

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

template <class Map>
std::string choices(const Map& map) {
  std::string s;
  for (const auto& entry : map) s += (s.empty() ? "" : ", ") + ("\"" + entry.first + "\"");
  return s;
}

// Reads the fields of one JSON object; every error names the context (file and case) and the field.
class Fields {
 public:
  Fields(const json& object, std::string context) : object_(object), context_(std::move(context)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& problem) const {
    throw ConfigError(context_ + ": field '" + field + "': " + problem);
  }
  [[noreturn]] void fail(const std::string& problem) const { throw ConfigError(context_ + ": " + problem); }

  bool has(const std::string& field) const { return object_.contains(field); }
  const json& at(const std::string& field) const { return object_.at(field); }

  void require(const std::string& field) const {
    if (!has(field)) fail(field, "missing (required by this operation)");
  }

  void only(const std::vector<std::string>& allowed) const {
    for (const auto& item : object_.items())
      if (std::find(allowed.begin(), allowed.end(), item.key()) == allowed.end())
        fail(item.key(), "unknown field (allowed here: " + join(allowed) + ")");
  }

  int64_t integer(const std::string& field, int64_t min, int64_t fallback) const {
    if (!has(field)) return fallback;
    const json& v = at(field);
    if (!v.is_number_integer() || v.get<int64_t>() < min)
      fail(field, "expected an integer >= " + std::to_string(min) + ", got " + v.dump());
    return v.get<int64_t>();
  }

  double number(const std::string& field, double fallback) const {
    if (!has(field)) return fallback;
    const json& v = at(field);
    if (!v.is_number()) fail(field, "expected a number, got " + v.dump());
    return v.get<double>();
  }

  bool boolean(const std::string& field, bool fallback) const {
    if (!has(field)) return fallback;
    const json& v = at(field);
    if (!v.is_boolean()) fail(field, "expected true or false, got " + v.dump());
    return v.get<bool>();
  }

  std::string string(const std::string& field) const {
    const json& v = at(field);
    if (!v.is_string()) fail(field, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }

  template <class Map>
  typename Map::mapped_type choice(const std::string& field, const Map& map,
                                   typename Map::mapped_type fallback) const {
    if (!has(field)) return fallback;
    const json& v = at(field);
    const auto it = v.is_string() ? map.find(v.get<std::string>()) : map.end();
    if (it == map.end()) fail(field, "expected one of " + choices(map) + ", got " + v.dump());
    return it->second;
  }

  const std::string& context() const { return context_; }

 private:
  const json& object_;
  std::string context_;
};

bool valid_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '=' || c == '+' || c == '-';
  });
}

CallCounts read_counts(const Fields& f, CallCounts fallback) {
  CallCounts c;
  c.warmup = static_cast<int>(f.integer("warmup", 0, fallback.warmup));
  c.iterations = static_cast<int>(f.integer("iterations", 1, fallback.iterations));
  c.repeats = static_cast<int>(f.integer("repeats", 1, fallback.repeats));
  return c;
}

// Reads the shape fields of `f` over `shape` (fields not given keep their value), then checks the sizes against
// each other for `op`.
void read_shape(const Fields& f, Op op, Shape& shape) {
  shape.tokens = f.integer("tokens", 1, shape.tokens);
  shape.experts = f.integer("experts", 1, shape.experts);
  shape.top_k = f.integer("top_k", 1, shape.top_k);
  shape.hidden = f.integer("hidden", 1, shape.hidden);
  shape.intermediate = f.integer("intermediate", 1, shape.intermediate);
  shape.n = f.integer("n", 1, shape.n);
  shape.k = f.integer("k", 1, shape.k);
  shape.width = f.integer("width", 1, shape.width);
  shape.d_model = f.integer("d_model", 1, shape.d_model);
  shape.d_ff = f.integer("d_ff", 1, shape.d_ff);
  shape.group_size = f.integer("group_size", 1, shape.group_size);
  shape.subsample = f.integer("subsample", 0, shape.subsample);
  if (f.has("top_groups") && f.has("density")) f.fail("top_groups", "give top_groups or density, not both");
  shape.top_groups = f.integer("top_groups", 1, shape.top_groups);
  if (f.has("density")) {
    const double density = f.number("density", 0.0);
    if (!(density > 0.0 && density <= 1.0)) f.fail("density", "expected a fraction in (0, 1]");
    if (shape.group_size > 0 && shape.d_ff % shape.group_size == 0)
      shape.top_groups = std::max<int64_t>(1, std::llround(density * static_cast<double>(shape.d_ff / shape.group_size)));
  }

  if (shape.experts > 0 && shape.top_k > shape.experts)
    f.fail("top_k", "top_k = " + std::to_string(shape.top_k) + " exceeds experts = " + std::to_string(shape.experts));
  if (is_sparse_ffn_like(op)) {
    if (shape.d_ff % shape.group_size != 0)
      f.fail("d_ff", "d_ff = " + std::to_string(shape.d_ff) + " is not a multiple of group_size = " +
                         std::to_string(shape.group_size));
    if (shape.top_groups == 0) f.fail("top_groups", "missing (give top_groups or density)");
    if (shape.top_groups > shape.d_ff / shape.group_size)
      f.fail("top_groups", "top_groups = " + std::to_string(shape.top_groups) + " exceeds the " +
                               std::to_string(shape.d_ff / shape.group_size) + " groups");
    if (shape.subsample > shape.group_size)
      f.fail("subsample", "subsample = " + std::to_string(shape.subsample) + " exceeds group_size");
  }
}


void read_gemm_options(const Fields& f, CaseConfig& c) {
  c.mode = f.choice("mode", kModes, c.mode);
  c.epilogue = f.choice("epilogue", kEpilogues, c.epilogue);
  c.gather = f.choice("gather", kGathers, c.gather);
  c.b_layout = f.choice("b_layout", kBLayouts, c.b_layout);
  c.activation = f.choice("activation", kActivations, c.activation);
  c.glu_layout = f.choice("glu_layout", kGluLayouts, c.glu_layout);
  if (c.mode == MOEKIT_GEMM_VARLEN_K) {
    if (c.epilogue != MOEKIT_EPILOGUE_STORE) f.fail("epilogue", "varlen_k supports \"store\" only");
    if (f.has("b_layout")) f.fail("b_layout", "varlen_k has no b_layout (B is [rows, n])");
  } else if (c.gather == MOEKIT_GEMM_GATHER_B) {
    f.fail("gather", "varlen_m gathers A only (\"none\" or \"a\")");
  }
  const bool activated = c.epilogue == MOEKIT_EPILOGUE_GATED || c.epilogue == MOEKIT_EPILOGUE_DGATED;
  if (activated && moekit::is_gated_activation(c.activation) && c.shape.n % 2 != 0)
    f.fail("n", "a gated activation needs an even n (h holds both GLU halves), got " + std::to_string(c.shape.n));
  c.beta = f.number("beta", 0.0);
  if (!std::isfinite(c.beta)) f.fail("beta", "expected a finite number, got " + f.at("beta").dump());
  if (c.beta != 0 && activated)
    f.fail("beta", "the \"" + f.string("epilogue") + "\" epilogue never reads its output; beta applies to varlen_k and "
                   "to varlen_m with epilogue \"store\" or \"bias\"");
}

// Routing options of the operations with real routing. routing_sigma and routing_empty shape lognormal routing
// only: a case that gives them itself with uniform routing is told so (a defaults block may carry them for others).
void read_routing_options(const Fields& f, const json& own, CaseConfig& c) {
  RoutingOptions& r = c.routing;
  r.kind = f.choice("routing", kRoutingKinds, r.kind);
  r.sigma = f.number("routing_sigma", r.sigma);
  if (!(std::isfinite(r.sigma) && r.sigma >= 0)) f.fail("routing_sigma", "expected a number >= 0, got " + f.at("routing_sigma").dump());
  r.empty_fraction = f.number("routing_empty", r.empty_fraction);
  if (!(r.empty_fraction >= 0 && r.empty_fraction < 1))
    f.fail("routing_empty", "expected a fraction of the experts in [0, 1), got " + f.at("routing_empty").dump());
  if (r.kind != RoutingKind::lognormal)
    for (const char* field : {"routing_sigma", "routing_empty"})
      if (own.contains(field)) f.fail(field, "applies to \"routing\": \"lognormal\" only");
}

// Lognormal routing must leave every token top_k experts to route to.
void check_routing_shape(const Fields& f, const CaseConfig& c, const Shape& shape) {
  const int64_t empty = c.routing.empty_experts(shape.experts);
  if (empty > 0 && shape.experts - empty < shape.top_k)
    f.fail("routing_empty", std::to_string(empty) + " of the " + std::to_string(shape.experts) +
                                " experts empty leaves fewer than top_k = " + std::to_string(shape.top_k));
}

CaseConfig read_case(const json& object, const json& defaults, const std::string& path, size_t index,
                     std::set<std::string>& names) {
  const std::string position = "(#" + std::to_string(index + 1) + ")";
  if (!object.is_object()) throw ConfigError(path + ": case " + position + ": expected an object, got " + object.dump());
  json merged = object;
  for (const auto& item : defaults.items())
    if (!merged.contains(item.key())) merged[item.key()] = item.value();

  CaseConfig c;
  const Fields untitled(merged, path + ": case " + position);
  untitled.require("name");
  c.name = untitled.string("name");
  if (!valid_name(c.name)) untitled.fail("name", "use letters, digits and _ . = + - only, got \"" + c.name + "\"");
  const Fields f(merged, path + ": case '" + c.name + "' " + position);
  if (!names.insert(c.name).second) f.fail("name", "another case has the same name");

  f.require("op");
  c.op_name = f.string("op");
  const auto& ops = op_names();
  const auto op_it = std::find(ops.begin(), ops.end(), c.op_name);
  if (op_it == ops.end()) f.fail("op", "unknown operation \"" + c.op_name + "\" (known: " + join(ops) + ")");
  c.op = static_cast<Op>(op_it - ops.begin());

  // Fields the case itself gives must belong to its operation; fields from `defaults` that it does not read are
  // ignored (one defaults block serves cases of several operations).
  const OpFields op_fields = fields_of(c.op);
  std::vector<std::string> allowed = kCommonFields;
  allowed.insert(allowed.end(), op_fields.required.begin(), op_fields.required.end());
  allowed.insert(allowed.end(), op_fields.optional.begin(), op_fields.optional.end());
  Fields(object, f.context()).only(allowed);
  for (auto it = merged.begin(); it != merged.end();) {
    if (std::find(allowed.begin(), allowed.end(), it.key()) == allowed.end())
      it = merged.erase(it);
    else
      ++it;
  }
  for (const auto& field : op_fields.required) f.require(field);

  c.dtype = f.choice("dtype", kDtypes, c.dtype);
  c.seed = static_cast<uint64_t>(f.integer("seed", 0, 1));
  read_shape(f, c.op, c.shape);
  c.router = f.choice("router", kRouters, c.router);
  c.renormalize = f.boolean("renormalize", false);
  c.router_scale = f.number("router_scale", 1.0);
  c.activation = f.choice("activation", kActivations, c.activation);
  c.glu_layout = f.choice("glu_layout", kGluLayouts, c.glu_layout);
  c.has_b1 = f.boolean("has_b1", false);
  c.has_b2 = f.boolean("has_b2", false);
  c.weight_grad_dtype = f.choice("weight_grad_dtype", kDtypes, MOEKIT_DTYPE_INVALID);
  c.out_dtype = f.choice("out_dtype", kDtypes, MOEKIT_DTYPE_INVALID);
  c.with_db2 = f.boolean("with_db2", true);
  if (c.op == Op::gemm) read_gemm_options(f, c);
  const bool routed = std::find(allowed.begin(), allowed.end(), "routing") != allowed.end();
  if (routed) {
    read_routing_options(f, object, c);
    check_routing_shape(f, c, c.shape);
  }

  c.cuda_counts = read_counts(f, kCudaCounts);
  c.reference_counts = kReferenceCounts;
  if (f.has("reference")) {
    if (!f.at("reference").is_object()) f.fail("reference", "expected an object {warmup, iterations, repeats}");
    const Fields r(f.at("reference"), f.context() + ": field 'reference'");
    r.only({"warmup", "iterations", "repeats"});
    c.reference_counts = read_counts(r, kReferenceCounts);
  }
  c.graph = f.boolean("graph", false);
  if (f.has("note")) f.string("note");

  c.check_shape = capped_check_shape(c.shape);
  if (f.has("check")) {
    if (!f.at("check").is_object()) f.fail("check", "expected an object of shape fields");
    const Fields k(f.at("check"), f.context() + ": field 'check'");
    std::vector<std::string> shape_fields;
    for (const auto& name : kShapeFields)
      if (std::find(allowed.begin(), allowed.end(), name) != allowed.end()) shape_fields.push_back(name);
    k.only(shape_fields);
    read_shape(k, c.op, c.check_shape);
    if (routed) check_routing_shape(k, c, c.check_shape);
  }
  c.json = merged.dump();
  return c;
}

}  // namespace

Shape capped_check_shape(const Shape& shape) {
  Shape s = shape;
  s.tokens = std::min<int64_t>(s.tokens, 256);
  for (int64_t* width : {&s.hidden, &s.d_model, &s.n, &s.k, &s.width}) *width = std::min<int64_t>(*width, 256);
  s.intermediate = std::min<int64_t>(s.intermediate, 128);
  if (s.d_ff > 1024 && s.group_size > 0) {
    s.d_ff = std::max<int64_t>(1024 / s.group_size, 1) * s.group_size;
    const double density = static_cast<double>(shape.top_groups) / static_cast<double>(shape.d_ff / shape.group_size);
    s.top_groups = std::max<int64_t>(1, std::llround(density * static_cast<double>(s.d_ff / s.group_size)));
  }
  return s;
}

BenchConfig load_config(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw ConfigError(path + ": cannot open the file");
  json root;
  try {
    root = json::parse(file);
  } catch (const json::parse_error& e) {
    throw ConfigError(path + ": not valid JSON: " + e.what());
  }
  const Fields top(root, path);
  if (!root.is_object()) top.fail("expected a JSON object with a \"cases\" array");
  top.only({"description", "defaults", "cases"});

  BenchConfig config;
  config.path = path;
  if (top.has("description")) config.description = top.string("description");

  json defaults = json::object();
  if (top.has("defaults")) {
    defaults = top.at("defaults");
    if (!defaults.is_object()) top.fail("defaults", "expected an object of case fields");
    std::set<std::string> known(kCommonFields.begin(), kCommonFields.end());
    for (size_t op = 0; op < op_names().size(); ++op) {
      const OpFields f = fields_of(static_cast<Op>(op));
      known.insert(f.required.begin(), f.required.end());
      known.insert(f.optional.begin(), f.optional.end());
    }
    known.erase("name");
    Fields(defaults, path + ": defaults").only(std::vector<std::string>(known.begin(), known.end()));
  }

  if (!top.has("cases") || !top.at("cases").is_array() || top.at("cases").empty())
    top.fail("cases", "expected a non-empty array of cases");
  std::set<std::string> names;
  const json& cases = top.at("cases");
  for (size_t i = 0; i < cases.size(); ++i) config.cases.push_back(read_case(cases[i], defaults, path, i, names));
  return config;
}

}  // namespace moekit_bench
