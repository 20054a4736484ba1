// Plan creation of the expert-parallel layer: the shape of one rank, the inner plans, the buffer layouts.
#include "src/ep/ep_plan.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "src/dtype_bytes.h"

namespace moekit {
inline namespace v0 {
namespace ep {
namespace {

bool gated(int32_t activation) { return activation < MOEKIT_ACT_GELU; }

// Appends 256-aligned sections.
class Layout {
 public:
  size_t add(size_t bytes) {
    size_t at = end_;
    end_ = (end_ + bytes + 255) / 256 * 256;
    return at;
  }
  size_t end() const { return end_; }

 private:
  size_t end_ = 0;
};

void invalid(const std::string& message) { throw EpError(MOEKIT_STATUS_INVALID_VALUE, message); }

moekit_gemm_desc_t gemm_desc(const moekit_ep_plan& p, int32_t mode, int32_t b_layout, int32_t epilogue,
                             int64_t groups, int64_t max_rows, int64_t n, int64_t k, int32_t out_dtype) {
  moekit_gemm_desc_t d;
  moekit_gemm_desc_init(&d);
  d.mode = mode;
  d.b_layout = b_layout;
  d.epilogue = epilogue;
  d.activation = p.desc.layer.activation;
  d.glu_layout = p.desc.layer.glu_layout;
  d.glu_limit = p.desc.layer.glu_limit;
  d.groups = groups;
  d.max_rows = max_rows;
  d.n = n;
  d.k = k;
  d.dtype = p.dtype;
  d.out_dtype = out_dtype;
  return d;
}

moekit_plan_t make_gemm(const moekit_ep_plan& p, const moekit_gemm_desc_t& d, const char* what) {
  moekit_plan_t plan = nullptr;
  check_inner(moekit_gemm_plan_create(p.handle, &d, &plan), what);
  return plan;
}

void build_inner_plans(moekit_ep_plan& p) {
  const moekit_moe_desc_t& l = p.desc.layer;
  Plans& q = p.plans;
  int64_t E = p.experts, M = p.max_recv, T = p.tokens, H = p.hidden, W = p.width, RE = p.router_experts;
  q.router_gemm = make_gemm(p, gemm_desc(p, MOEKIT_GEMM_VARLEN_M, MOEKIT_GEMM_B_NK, MOEKIT_EPILOGUE_STORE, 1, T, RE,
                                         H, p.dtype),
                            "router logits, n = desc.layer.router_experts (moekit_gemm_plan_create)");
  moekit_router_desc_t rd;
  moekit_router_desc_init(&rd);
  rd.max_tokens = T;
  rd.experts = RE;
  rd.top_k = p.top_k;
  rd.kind = l.router;
  rd.renormalize = l.renormalize;
  rd.scale = l.router_scale;
  rd.dtype = p.dtype;
  check_inner(moekit_router_plan_create(p.handle, &rd, &q.router), "router (moekit_router_plan_create)");
  moekit_dispatch_desc_t dd;
  moekit_dispatch_desc_init(&dd);
  dd.max_tokens = T;
  dd.top_k = p.top_k;
  dd.experts = RE;
  check_inner(moekit_dispatch_plan_create(p.handle, &dd, &q.dispatch), "dispatch (moekit_dispatch_plan_create)");
  q.gated = make_gemm(p, gemm_desc(p, MOEKIT_GEMM_VARLEN_M, MOEKIT_GEMM_B_NK, MOEKIT_EPILOGUE_GATED, E, M, W, H,
                                   p.dtype), "up projection (moekit_gemm_plan_create)");
  q.down = make_gemm(p, gemm_desc(p, MOEKIT_GEMM_VARLEN_M, MOEKIT_GEMM_B_NK,
                                  l.has_b2 ? MOEKIT_EPILOGUE_BIAS : MOEKIT_EPILOGUE_STORE, E, M, H, p.intermediate,
                                  p.dtype), "down projection (moekit_gemm_plan_create)");
  moekit_combine_desc_t cd;
  moekit_combine_desc_init(&cd);
  cd.max_tokens = T;
  cd.top_k = p.top_k;
  cd.hidden = H;
  cd.dtype = p.dtype;
  check_inner(moekit_combine_plan_create(p.handle, &cd, &q.combine), "combine (moekit_combine_plan_create)");
  q.dgated = make_gemm(p, gemm_desc(p, MOEKIT_GEMM_VARLEN_M, MOEKIT_GEMM_B_KN, MOEKIT_EPILOGUE_DGATED, E, M, W, H,
                                    p.dtype), "dgated (moekit_gemm_plan_create)");
  moekit_bias_grad_desc_t bd;
  moekit_bias_grad_desc_init(&bd);
  bd.experts = E;
  bd.max_rows = M;
  bd.max_tokens = M;
  bd.dtype = p.dtype;
  bd.out_dtype = p.grad_dtype;
  bd.width = H;
  check_inner(moekit_bias_grad_plan_create(p.handle, &bd, &q.db2), "db2 (moekit_bias_grad_plan_create)");
  bd.width = W;
  check_inner(moekit_bias_grad_plan_create(p.handle, &bd, &q.db1), "db1 (moekit_bias_grad_plan_create)");
  q.dw2 = make_gemm(p, gemm_desc(p, MOEKIT_GEMM_VARLEN_K, MOEKIT_GEMM_B_NK, MOEKIT_EPILOGUE_STORE, E, M,
                                 p.intermediate, H, p.grad_dtype), "dw2 (moekit_gemm_plan_create)");
  q.dw1 = make_gemm(p, gemm_desc(p, MOEKIT_GEMM_VARLEN_K, MOEKIT_GEMM_B_NK, MOEKIT_EPILOGUE_STORE, E, M, H, W,
                                 p.grad_dtype), "dw1 (moekit_gemm_plan_create)");
  q.dxe = make_gemm(p, gemm_desc(p, MOEKIT_GEMM_VARLEN_M, MOEKIT_GEMM_B_KN, MOEKIT_EPILOGUE_STORE, E, M, H, W,
                                 p.dtype), "expert input gradient (moekit_gemm_plan_create)");
  q.dx_router = make_gemm(p, gemm_desc(p, MOEKIT_GEMM_VARLEN_M, MOEKIT_GEMM_B_KN, MOEKIT_EPILOGUE_STORE, 1, T, H, RE,
                                       p.dtype),
                          "router input gradient, k = desc.layer.router_experts (moekit_gemm_plan_create)");
  q.dw_router = make_gemm(p, gemm_desc(p, MOEKIT_GEMM_VARLEN_K, MOEKIT_GEMM_B_NK, MOEKIT_EPILOGUE_STORE, 1, T, H, RE,
                                       p.grad_dtype),
                          "dw_router, n = desc.layer.router_experts (moekit_gemm_plan_create)");
}

size_t inner_workspace(const Plans& q) {
  size_t most = 0;
  for (moekit_plan_t plan : {q.router_gemm, q.router, q.dispatch, q.gated, q.down, q.combine, q.dgated, q.db2, q.db1,
                             q.dw2, q.dw1, q.dxe, q.dx_router, q.dw_router}) {
    size_t bytes = 0;
    check_inner(moekit_plan_workspace_size(plan, &bytes), "moekit_plan_workspace_size");
    most = std::max(most, bytes);
  }
  return most;
}

void lay_out(moekit_ep_plan& p) {
  size_t e = p.element_bytes, s = p.score_bytes, i4 = sizeof(int32_t);
  size_t T = static_cast<size_t>(p.tokens), P = static_cast<size_t>(p.pairs), M = static_cast<size_t>(p.max_recv),
         S = static_cast<size_t>(p.send_slots), H = static_cast<size_t>(p.hidden),
         W = static_cast<size_t>(p.width), I = static_cast<size_t>(p.intermediate),
         RE = static_cast<size_t>(p.router_experts), E = static_cast<size_t>(p.experts);
  Layout sv;
  SavedLayout& a = p.saved;
  a.header = sv.add(kSavedHeaderBytes);
  a.logits = sv.add(T * RE * e);
  a.scores = sv.add(P * s);
  a.indices = sv.add(P * i4);
  a.expert_offsets = sv.add((RE + 1) * i4);
  a.gather_idx = sv.add(P * i4);
  a.pair_idx = sv.add(P * i4);
  a.grouped_pos = sv.add(P * i4);
  a.slot = sv.add(P * i4);
  a.kept_pos = sv.add(P * i4);
  a.send_counts = sv.add(RE * i4);
  a.recv_counts = sv.add(RE * i4);
  a.perm = sv.add(M * i4);
  a.owner_offsets = sv.add((E + 1) * i4);
  a.x_owner = sv.add(M * H * e);
  a.s_owner = sv.add(M * s);
  a.h = sv.add(M * W * e);
  a.total = sv.end();

  Layout ws;
  WorkspaceLayout& w = p.workspace;
  w.single_group = ws.add(2 * i4);
  w.iota = ws.add(M * i4);
  w.dropped = ws.add(i4);
  w.grouped = ws.add(P * H * e);
  w.grouped_s = ws.add(P * s);
  w.send_rows = ws.add(S * H * e);
  w.send_s = ws.add(S * s);
  w.recv_rows = ws.add(M * H * e);
  w.recv_s = ws.add(M * s);
  w.owner_a = ws.add(M * H * e);
  w.owner_b = ws.add(M * H * e);
  w.act = ws.add(M * I * e);
  w.dh = ws.add(M * W * e);
  w.ds_owner = ws.add(M * s);
  w.ds = ws.add(P * s);
  w.dlogits = ws.add(T * RE * e);
  w.inner = ws.add(inner_workspace(p.plans));
  w.total = ws.end();
}

}  // namespace

void check_inner(moekit_status_t status, const char* what) {
  if (status == MOEKIT_SUCCESS) return;
  size_t length = moekit_get_last_error(nullptr, 0);
  std::string message(length, '\0');
  moekit_get_last_error(&message[0], length + 1);
  throw EpError(status, std::string(what) + ": " + message);
}

Plans::~Plans() {
  for (moekit_plan_t plan : {router_gemm, router, dispatch, gated, down, combine, dgated, db2, db1, dw2, dw1, dxe,
                             dx_router, dw_router})
    moekit_plan_destroy(plan);
}

void build_plan(moekit_ep_plan& p) {
  static std::atomic<uint64_t> last_id{0};
  p.id = ++last_id;
  const moekit_ep_desc_t& d = p.desc;
  const moekit_moe_desc_t& l = d.layer;
  int ranks = p.exchange->ranks();
  if (l.experts < 1) invalid("desc.layer.experts: the experts per rank must be >= 1, got " + std::to_string(l.experts));
  if (l.router_experts != ranks * l.experts)
    invalid("desc.layer.router_experts: expected ranks * experts = " + std::to_string(ranks) + " * " +
            std::to_string(l.experts) + " = " + std::to_string(ranks * l.experts) + ", got " +
            std::to_string(l.router_experts));
  if (l.max_tokens < 1) invalid("desc.layer.max_tokens: must be >= 1, got " + std::to_string(l.max_tokens));
  if (l.top_k < 1 || l.top_k > l.router_experts)
    invalid("desc.layer.top_k: expected 1..router_experts = " + std::to_string(l.router_experts) + ", got " +
            std::to_string(l.top_k));
  if (l.hidden < 1) invalid("desc.layer.hidden: must be >= 1, got " + std::to_string(l.hidden));
  if (l.intermediate < 1) invalid("desc.layer.intermediate: must be >= 1, got " + std::to_string(l.intermediate));
  if (l.inference != 0) invalid("desc.layer.inference: the expert-parallel layer is for training; must be 0");
  if (d.mode != MOEKIT_EP_EXACT && d.mode != MOEKIT_EP_CAPACITY)
    invalid("desc.mode: expected MOEKIT_EP_EXACT (0) or MOEKIT_EP_CAPACITY (1), got " + std::to_string(d.mode));
  if (d.mode == MOEKIT_EP_CAPACITY && d.capacity < 1)
    invalid("desc.capacity: the capacity mode needs capacity >= 1, got " + std::to_string(d.capacity));
  if (d.mode == MOEKIT_EP_CAPACITY && d.capacity > (int64_t{1} << 30) / ranks)
    invalid("desc.capacity: ranks * capacity must fit in 2^30 rows, got " + std::to_string(d.capacity));
  if (l.dtype != MOEKIT_DTYPE_BF16 && l.dtype != MOEKIT_DTYPE_FP16 && l.dtype != MOEKIT_DTYPE_FP32 &&
      l.dtype != MOEKIT_DTYPE_FP64)
    invalid("desc.layer.dtype: expected bf16, fp16, fp32 or fp64, got " + std::to_string(l.dtype));
  p.dtype = l.dtype;
  p.element_bytes = dtype_bytes(l.dtype);
  p.score_dtype = l.dtype == MOEKIT_DTYPE_FP64 ? MOEKIT_DTYPE_FP64 : MOEKIT_DTYPE_FP32;
  p.score_bytes = dtype_bytes(p.score_dtype);
  p.grad_dtype = l.weight_grad_dtype == MOEKIT_DTYPE_INVALID ? l.dtype : l.weight_grad_dtype;

  p.tokens = l.max_tokens;
  p.top_k = l.top_k;
  p.hidden = l.hidden;
  p.intermediate = l.intermediate;
  p.width = gated(l.activation) ? 2 * l.intermediate : l.intermediate;
  p.experts = l.experts;
  p.router_experts = l.router_experts;
  p.pairs = l.max_tokens * l.top_k;
  p.shape = EpShape{ranks, l.experts, d.mode == MOEKIT_EP_CAPACITY ? d.capacity : 0};
  p.send_slots = d.mode == MOEKIT_EP_CAPACITY ? ranks * d.capacity : p.pairs;
  // A token sends at most min(K, E) pairs to one rank.
  p.max_recv = d.mode == MOEKIT_EP_CAPACITY ? ranks * d.capacity : ranks * l.max_tokens * std::min(l.top_k, l.experts);
  if (p.max_recv > (int64_t{1} << 31) - 1 || p.pairs > (int64_t{1} << 31) - 1)
    invalid("desc.layer.max_tokens: the rows a rank may receive must fit in int32, got " +
            std::to_string(p.max_recv));
  build_inner_plans(p);
  lay_out(p);
}

}  // namespace ep
}  // namespace v0
}  // namespace moekit
