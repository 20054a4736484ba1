// The expert-parallel backward of one rank, the forward's mirror: send dout's rows to the experts' ranks, run the
// experts' backward there (dgated with the scores, as the MoE layer does), send the input-row gradients and score
// gradients back, sum them per token, then the router's backward.
#include "src/ep/ep_views.h"

namespace moekit {
inline namespace v0 {
namespace ep {

void run_backward(const moekit_ep_plan& p, const moekit_ep_bwd_args_t& args, const void* saved_in, void* workspace,
                  void* stream) {
  bool input_grad = args.compute_input_grad != 0, weight_grad = args.compute_weight_grad != 0;
  if (!input_grad && !weight_grad) return;
  void* saved = const_cast<void*>(saved_in);  // read only: views of it are inputs
  const SavedLayout& sv = p.saved;
  const WorkspaceLayout& w = p.workspace;
  const Plans& q = p.plans;
  RowOps& ops = *p.ops;
  const moekit_moe_desc_t& l = p.desc.layer;
  moekit_device_t dev = args.x.device;
  int64_t T = args.x.shape[0], K = p.top_k, H = p.hidden, E = p.experts, RE = p.router_experts, M = p.max_recv,
          W = p.width, TK = T * K;
  size_t row = static_cast<size_t>(H) * p.element_bytes;
  void* inner = at(workspace, w.inner);
  size_t inner_bytes = w.total - w.inner;
  int32_t* single_group = reinterpret_cast<int32_t*>(at(workspace, w.single_group));
  int32_t* iota = reinterpret_cast<int32_t*>(at(workspace, w.iota));
  const int32_t* valid = reinterpret_cast<const int32_t*>(at(saved, sv.expert_offsets)) + RE;
  const int32_t* gather_idx = reinterpret_cast<const int32_t*>(at(saved, sv.gather_idx));
  const int32_t* pair_idx = reinterpret_cast<const int32_t*>(at(saved, sv.pair_idx));
  const int32_t* slot = reinterpret_cast<const int32_t*>(at(saved, sv.slot));
  const int32_t* perm = reinterpret_cast<const int32_t*>(at(saved, sv.perm));
  ops.single_group(single_group, T, stream);
  ops.iota(iota, M, stream);
  RowLayout rows = row_layout(p, reinterpret_cast<const int32_t*>(at(saved, sv.send_counts)),
                              reinterpret_cast<const int32_t*>(at(saved, sv.recv_counts)), stream);

  // dout's row of every kept pair to the expert's rank.
  Route route{slot, perm, valid, TK, rows};
  Staging row_buf{at(workspace, w.grouped), at(workspace, w.send_rows), at(workspace, w.recv_rows)};
  Staging score_buf{at(workspace, w.grouped_s), at(workspace, w.send_s), at(workspace, w.recv_s)};
  char* dout_owner = at(workspace, w.owner_a);
  send_to_experts(p, route, row_buf, args.dout.data, gather_idx, dout_owner, row, stream);

  // The experts' backward on their rows (docs/math.md section 4).
  moekit_tensor_t offsets = view(at(saved, sv.owner_offsets), MOEKIT_DTYPE_INT32, {E + 1}, dev);
  moekit_tensor_t dout_rows = view(dout_owner, p.dtype, {M, H}, dev);
  moekit_tensor_t iota_m = view(iota, MOEKIT_DTYPE_INT32, {M}, dev);
  moekit_tensor_t s_owner = view(at(saved, sv.s_owner), p.score_dtype, {M}, dev);
  char* ds_owner = at(workspace, w.ds_owner);
  moekit_gemm_args_t dgated;
  moekit_gemm_args_init(&dgated);
  dgated.a = dout_rows;
  dgated.b = args.w2;
  dgated.offsets = offsets;
  dgated.c = view(at(workspace, w.dh), p.dtype, {M, W}, dev);
  dgated.h = view(at(saved, sv.h), p.dtype, {M, W}, dev);
  dgated.act = view(at(workspace, w.act), p.dtype, {M, p.intermediate}, dev);
  dgated.row_scale = s_owner;
  dgated.pair_idx = iota_m;
  dgated.dscores = view(ds_owner, p.score_dtype, {M}, dev);
  check_inner(moekit_gemm(q.dgated, &dgated, inner, inner_bytes, stream), "dgated (moekit_gemm)");
  if (l.has_b2) {
    moekit_db2_ds_args_t db2;
    moekit_db2_ds_args_init(&db2);
    db2.dout = dout_rows;
    db2.scores = s_owner;
    db2.b2 = args.b2;
    db2.offsets = offsets;
    db2.gather_idx = iota_m;
    db2.pair_idx = iota_m;
    if (weight_grad) db2.db2 = args.db2;
    db2.dscores = dgated.dscores;
    db2.beta = args.beta_db2;
    check_inner(moekit_db2_ds(q.db2, &db2, inner, inner_bytes, stream), "moekit_db2_ds");
  }
  if (weight_grad) {
    moekit_gemm_args_t dw2;
    moekit_gemm_args_init(&dw2);
    dw2.a = dout_rows;
    dw2.b = dgated.act;
    dw2.offsets = offsets;
    dw2.c = args.dw2;
    dw2.beta = args.beta_dw2;
    check_inner(moekit_gemm(q.dw2, &dw2, inner, inner_bytes, stream), "dw2 (moekit_gemm)");
    moekit_gemm_args_t dw1;
    moekit_gemm_args_init(&dw1);
    dw1.a = dgated.c;
    dw1.b = view(at(saved, sv.x_owner), p.dtype, {M, H}, dev);
    dw1.offsets = offsets;
    dw1.c = args.dw1;
    dw1.beta = args.beta_dw1;
    check_inner(moekit_gemm(q.dw1, &dw1, inner, inner_bytes, stream), "dw1 (moekit_gemm)");
    if (l.has_b1) {
      moekit_db1_args_t db1;
      moekit_db1_args_init(&db1);
      db1.dh = dgated.c;
      db1.offsets = offsets;
      db1.db1 = args.db1;
      db1.beta = args.beta_db1;
      check_inner(moekit_db1(q.db1, &db1, inner, inner_bytes, stream), "moekit_db1");
    }
  }

  // The score gradients back to the pairs' ranks; a dropped pair's stays 0.
  char* ds = at(workspace, w.ds);
  int64_t score_words = static_cast<int64_t>(p.score_bytes / sizeof(int32_t));
  ops.fill(static_cast<int32_t*>(score_buf.grouped), TK * score_words, 0, stream);
  ops.fill(reinterpret_cast<int32_t*>(ds), TK * score_words, 0, stream);
  return_to_sources(p, route, score_buf, ds_owner, p.score_bytes, stream);
  ops.scatter(ds, score_buf.grouped, pair_idx, TK, valid, p.score_bytes, stream);

  if (input_grad) {  // dx = the sum of each token's pairs' input-row gradients (the broadcast backward)
    moekit_gemm_args_t dxe;
    moekit_gemm_args_init(&dxe);
    dxe.a = dgated.c;
    dxe.b = args.w1;
    dxe.offsets = offsets;
    char* dxe_owner = at(workspace, w.owner_b);
    dxe.c = view(dxe_owner, p.dtype, {M, H}, dev);
    check_inner(moekit_gemm(q.dxe, &dxe, inner, inner_bytes, stream), "expert input gradient (moekit_gemm)");
    return_to_sources(p, route, row_buf, dxe_owner, row, stream);
    moekit_combine_args_t sum;
    moekit_combine_args_init(&sum);
    sum.grouped = view(row_buf.grouped, p.dtype, {TK, H}, dev);
    sum.grouped_pos = view(at(saved, sv.kept_pos), MOEKIT_DTYPE_INT32, {TK}, dev);
    sum.out = args.dx;
    sum.beta = args.beta_dx;
    check_inner(moekit_broadcast_backward(q.combine, &sum, inner, inner_bytes, stream), "moekit_broadcast_backward");
  }

  // The router's backward, and its terms of dx and dw_router.
  moekit_router_bwd_args_t router;
  moekit_router_bwd_args_init(&router);
  router.logits = view(at(saved, sv.logits), p.dtype, {T, RE}, dev);
  router.indices = view(at(saved, sv.indices), MOEKIT_DTYPE_INT32, {T, K}, dev);
  router.dscores = view(ds, p.score_dtype, {T, K}, dev);
  router.dlogits = view(at(workspace, w.dlogits), p.dtype, {T, RE}, dev);
  check_inner(moekit_router_backward(q.router, &router, inner, inner_bytes, stream), "moekit_router_backward");
  moekit_tensor_t single = view(single_group, MOEKIT_DTYPE_INT32, {2}, dev);
  if (input_grad) {
    moekit_gemm_args_t dx;
    moekit_gemm_args_init(&dx);
    dx.a = router.dlogits;
    dx.b = as_one_group(args.w_router);
    dx.offsets = single;
    dx.c = args.dx;
    dx.beta = 1.0;
    check_inner(moekit_gemm(q.dx_router, &dx, inner, inner_bytes, stream), "router input gradient (moekit_gemm)");
  }
  if (weight_grad) {
    moekit_gemm_args_t dwr;
    moekit_gemm_args_init(&dwr);
    dwr.a = router.dlogits;
    dwr.b = args.x;
    dwr.offsets = single;
    dwr.c = as_one_group(args.dw_router);
    dwr.beta = args.beta_dw_router;
    check_inner(moekit_gemm(q.dw_router, &dwr, inner, inner_bytes, stream), "dw_router (moekit_gemm)");
  }
}

}  // namespace ep
}  // namespace v0
}  // namespace moekit
