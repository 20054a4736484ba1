// The expert-parallel forward of one rank: route, group by destination, exchange counts and rows, run the local
// experts on the rows received, send the results back, combine.
#include <string>

#include "src/ep/ep_views.h"

namespace moekit {
inline namespace v0 {
namespace ep {

RowLayout row_layout(const moekit_ep_plan& p, const int32_t* send_counts, const int32_t* recv_counts, void* stream) {
  size_t R = static_cast<size_t>(p.shape.ranks);
  RowLayout l{std::vector<int64_t>(R), std::vector<int64_t>(R), std::vector<int64_t>(R), std::vector<int64_t>(R)};
  if (p.shape.capacity > 0) {
    for (size_t r = 0; r < R; ++r) {
      l.send_base[r] = l.recv_base[r] = static_cast<int64_t>(r) * p.shape.capacity;
      l.send_rows[r] = l.recv_rows[r] = p.shape.capacity;
    }
    return l;
  }
  std::vector<int32_t> counts(2 * R * static_cast<size_t>(p.experts));
  p.ops->to_host(counts.data(), send_counts, static_cast<int64_t>(R) * p.experts, stream);
  p.ops->to_host(counts.data() + R * static_cast<size_t>(p.experts), recv_counts, static_cast<int64_t>(R) * p.experts,
                 stream);
  int64_t send_at = 0, recv_at = 0;
  for (size_t r = 0; r < R; ++r) {
    int64_t sent = 0, received = 0;
    for (int64_t e = 0; e < p.experts; ++e) {
      sent += counts[r * static_cast<size_t>(p.experts) + static_cast<size_t>(e)];
      received += counts[(R + r) * static_cast<size_t>(p.experts) + static_cast<size_t>(e)];
    }
    l.send_base[r] = send_at;
    l.send_rows[r] = sent;
    l.recv_base[r] = recv_at;
    l.recv_rows[r] = received;
    send_at += sent;
    recv_at += received;
  }
  if (recv_at > p.max_recv)
    throw EpError(MOEKIT_STATUS_INTERNAL_ERROR, "exchange: " + std::to_string(recv_at) +
                                                    " rows received, past the plan's bound " +
                                                    std::to_string(p.max_recv));
  return l;
}

void send_to_experts(const moekit_ep_plan& p, const Route& r, const Staging& buf, const void* src, const int32_t* pick,
                     void* owner, size_t row_bytes, void* stream) {
  p.ops->gather(buf.grouped, src, pick, r.pairs, r.valid, row_bytes, stream);
  p.ops->scatter(buf.send, buf.grouped, r.slot, r.pairs, r.valid, row_bytes, stream);
  p.exchange->all_to_allv(buf.send, r.rows.send_base.data(), r.rows.send_rows.data(), buf.recv,
                          r.rows.recv_base.data(), r.rows.recv_rows.data(), row_bytes, stream);
  p.ops->scatter(owner, buf.recv, r.perm, p.max_recv, nullptr, row_bytes, stream);
}

void return_to_sources(const moekit_ep_plan& p, const Route& r, const Staging& buf, const void* owner,
                       size_t row_bytes, void* stream) {
  p.ops->gather(buf.recv, owner, r.perm, p.max_recv, nullptr, row_bytes, stream);
  p.exchange->all_to_allv(buf.recv, r.rows.recv_base.data(), r.rows.recv_rows.data(), buf.send,
                          r.rows.send_base.data(), r.rows.send_rows.data(), row_bytes, stream);
  p.ops->gather(buf.grouped, buf.send, r.slot, r.pairs, r.valid, row_bytes, stream);
}

void run_forward(const moekit_ep_plan& p, const moekit_ep_fwd_args_t& args, void* saved, void* workspace,
                 void* stream) {
  const SavedLayout& sv = p.saved;
  const WorkspaceLayout& w = p.workspace;
  const Plans& q = p.plans;
  RowOps& ops = *p.ops;
  Exchange& ex = *p.exchange;
  moekit_device_t dev = args.x.device;
  int64_t T = args.x.shape[0], K = p.top_k, H = p.hidden, E = p.experts, RE = p.router_experts, M = p.max_recv,
          TK = T * K;
  size_t row = static_cast<size_t>(H) * p.element_bytes;
  void* inner = at(workspace, w.inner);
  size_t inner_bytes = w.total - w.inner;
  int32_t* single_group = reinterpret_cast<int32_t*>(at(workspace, w.single_group));
  int32_t* expert_offsets = reinterpret_cast<int32_t*>(at(saved, sv.expert_offsets));
  const int32_t* valid = expert_offsets + RE;  // the routed pairs: every pair has a global expert

  ops.single_group(single_group, T, stream);
  ops.iota(reinterpret_cast<int32_t*>(at(workspace, w.iota)), M, stream);

  // Route this rank's tokens.
  moekit_gemm_args_t logits;
  moekit_gemm_args_init(&logits);
  logits.a = args.x;
  logits.b = as_one_group(args.w_router);
  logits.offsets = view(single_group, MOEKIT_DTYPE_INT32, {2}, dev);
  logits.c = view(at(saved, sv.logits), p.dtype, {T, RE}, dev);
  check_inner(moekit_gemm(q.router_gemm, &logits, inner, inner_bytes, stream), "router logits (moekit_gemm)");
  moekit_router_fwd_args_t route;
  moekit_router_fwd_args_init(&route);
  route.logits = logits.c;
  route.bias = args.router_bias;
  route.scores = view(at(saved, sv.scores), p.score_dtype, {T, K}, dev);
  route.indices = view(at(saved, sv.indices), MOEKIT_DTYPE_INT32, {T, K}, dev);
  route.counts = args.counts;
  check_inner(moekit_router_forward(q.router, &route, inner, inner_bytes, stream), "moekit_router_forward");

  // Group the pairs by expert over all R*E experts: the rows bound for one rank are then contiguous.
  moekit_dispatch_args_t group;
  moekit_dispatch_args_init(&group);
  group.indices = route.indices;
  group.expert_offsets = view(expert_offsets, MOEKIT_DTYPE_INT32, {RE + 1}, dev);
  group.gather_idx = view(at(saved, sv.gather_idx), MOEKIT_DTYPE_INT32, {TK}, dev);
  group.pair_idx = view(at(saved, sv.pair_idx), MOEKIT_DTYPE_INT32, {TK}, dev);
  group.grouped_pos = view(at(saved, sv.grouped_pos), MOEKIT_DTYPE_INT32, {TK}, dev);
  check_inner(moekit_dispatch(q.dispatch, &group, inner, inner_bytes, stream), "moekit_dispatch");

  const int32_t* gather_idx = reinterpret_cast<const int32_t*>(at(saved, sv.gather_idx));
  const int32_t* pair_idx = reinterpret_cast<const int32_t*>(at(saved, sv.pair_idx));
  int32_t* slot = reinterpret_cast<int32_t*>(at(saved, sv.slot));
  int32_t* kept_pos = reinterpret_cast<int32_t*>(at(saved, sv.kept_pos));
  int32_t* send_counts = reinterpret_cast<int32_t*>(at(saved, sv.send_counts));
  int32_t* recv_counts = reinterpret_cast<int32_t*>(at(saved, sv.recv_counts));
  int32_t* perm = reinterpret_cast<int32_t*>(at(saved, sv.perm));
  int32_t* dropped = args.dropped.data ? static_cast<int32_t*>(args.dropped.data)
                                           : reinterpret_cast<int32_t*>(at(workspace, w.dropped));
  ops.send_layout(p.shape, expert_offsets, reinterpret_cast<const int32_t*>(at(saved, sv.grouped_pos)), TK, slot,
                  kept_pos, send_counts, dropped, stream);
  ex.all_to_all(send_counts, recv_counts, E, stream);
  RowLayout rows = row_layout(p, send_counts, recv_counts, stream);
  int32_t* owner_offsets = reinterpret_cast<int32_t*>(at(saved, sv.owner_offsets));
  ops.recv_layout(p.shape, recv_counts, M, perm, owner_offsets, stream);

  // Send each pair's token row and score to the rank of its expert; place them among the local experts' rows.
  Route pairs{slot, perm, valid, TK, rows};
  Staging row_buf{at(workspace, w.grouped), at(workspace, w.send_rows), at(workspace, w.recv_rows)};
  Staging score_buf{at(workspace, w.grouped_s), at(workspace, w.send_s), at(workspace, w.recv_s)};
  char* x_owner = at(saved, sv.x_owner);
  send_to_experts(p, pairs, row_buf, args.x.data, gather_idx, x_owner, row, stream);
  send_to_experts(p, pairs, score_buf, at(saved, sv.scores), pair_idx, at(saved, sv.s_owner), p.score_bytes,
                  stream);

  // The local experts on their rows.
  moekit_tensor_t offsets = view(owner_offsets, MOEKIT_DTYPE_INT32, {E + 1}, dev);
  moekit_gemm_args_t up;
  moekit_gemm_args_init(&up);
  up.a = view(x_owner, p.dtype, {M, H}, dev);
  up.b = args.w1;
  up.offsets = offsets;
  if (p.desc.layer.has_b1) up.bias = args.b1;
  up.c = view(at(saved, sv.h), p.dtype, {M, p.width}, dev);
  up.act = view(at(workspace, w.act), p.dtype, {M, p.intermediate}, dev);
  check_inner(moekit_gemm(q.gated, &up, inner, inner_bytes, stream), "up projection (moekit_gemm)");
  moekit_gemm_args_t down;
  moekit_gemm_args_init(&down);
  down.a = up.act;
  down.b = args.w2;
  down.offsets = offsets;
  if (p.desc.layer.has_b2) down.bias = args.b2;
  char* y_owner = at(workspace, w.owner_a);
  down.c = view(y_owner, p.dtype, {M, H}, dev);
  check_inner(moekit_gemm(q.down, &down, inner, inner_bytes, stream), "down projection (moekit_gemm)");

  // Back to the ranks the rows came from, in their grouped order, and combine.
  return_to_sources(p, pairs, row_buf, y_owner, row, stream);
  moekit_combine_args_t combine;
  moekit_combine_args_init(&combine);
  combine.grouped = view(row_buf.grouped, p.dtype, {TK, H}, dev);
  combine.scores = route.scores;
  combine.grouped_pos = view(kept_pos, MOEKIT_DTYPE_INT32, {TK}, dev);
  combine.out = args.out;
  combine.beta = args.beta_out;
  check_inner(moekit_combine(q.combine, &combine, inner, inner_bytes, stream), "moekit_combine");

  if (args.scores.data) ops.gather(args.scores.data, route.scores.data, nullptr, TK, nullptr, p.score_bytes, stream);
  if (args.indices.data) ops.gather(args.indices.data, route.indices.data, nullptr, TK, nullptr, 4, stream);
  ops.write_header(reinterpret_cast<SavedHeader*>(at(saved, sv.header)), SavedHeader{kSavedMagic, p.id, T, 0}, stream);
}

}  // namespace ep
}  // namespace v0
}  // namespace moekit
