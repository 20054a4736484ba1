// The sparse SwiGLU FFN layer (docs/math.md section 7) on the CUDA backend. After group selection the layer is an MoE
// with E = NG = F/G experts of width I = G, top-k kg and every score 1, so it chains the MoE layer's building blocks on
// the caller's stream: every buffer carved from the caller's workspace and saved buffer, nothing allocated, nothing
// waited for. The grouped arrays are [T*kg, 2G] at most: no [T, F] tensor exists, forward or backward.
//
// Forward: group selection (x, Wg -> groups [T, kg], counts) -> dispatch (the groups as expert ids) -> Wg, Wu, Wd
// copied into the expert layouts W1 [NG, 2G, D], W2 [NG, D, G] -> up GEMM (x rows gathered, gated SwiGLU epilogue
// in the concat layout: h = [gate | up] rounded, a = silu(gate) * up rounded, docs/math.md section 8's rounding points)
// -> down GEMM -> combine with weights 1 into out. Saved: the groups (int32) and h; the dispatch is recomputed in the
// backward. Backward: dispatch -> W2 copy -> dgated GEMM (dout rows gathered @ W2, scores of 1: dh = [dgate | dup] and
// a' = a) -> weight gradients: dW1 = dh^T x and dW2 = dout^T a' (fp32, expert layouts, one staging buffer in turn),
// each added into dWg, dWu / dWd with its beta -> input gradient: W1 copy, dxe = dh W1, dx = beta dx + the sum of a
// token's dxe rows. Each of the caller's tensors a GEMM reads (x, dout) is taken by a GEMM before the first write to
// a caller's output, so a GEMM that refuses an operand's layout leaves the outputs untouched.
//
// NOTE: as in moe_layer_ops.cpp, the backward trusts the saved header (checking it would need a host
// synchronisation); the forward writes it.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "cuda/common/cuda_check.h"
#include "src/cuda_backend/cuda_backend.h"
#include "src/cuda_backend/layer_chain.h"
#include "cuda/layers/layer_kernels.h"
#include "cuda/layers/sparse_ffn_weights.h"
#include "cuda/common/status_error.h"
#include "cuda/layers/saved_header.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

namespace {

// The layer as the MoE whose expert MLP plans it borrows: SwiGLU in the concat layout, no biases, and weight
// gradients in fp32 (they are staged in the expert layouts, then added into the layer's tensors, rounded once).
moekit_plan as_moe_layer(const moekit_plan& layer) {
  const moekit_sparse_ffn_desc_t& d = layer.sparse_ffn;
  moekit_plan moe = sub_plan(layer, OpKind::moe_layer);
  moekit_moe_desc_init(&moe.moe);
  moe.moe.max_tokens = d.max_tokens;
  moe.moe.hidden = d.d_model;
  moe.moe.intermediate = d.group_size;
  moe.moe.router_experts = d.d_ff / d.group_size;
  moe.moe.experts = d.d_ff / d.group_size;
  moe.moe.top_k = d.top_groups;
  moe.moe.activation = MOEKIT_ACT_SWIGLU;
  moe.moe.glu_layout = MOEKIT_GLU_CONCAT;
  moe.moe.inference = d.inference;
  moe.moe.dtype = d.dtype;
  moe.moe.weight_grad_dtype = MOEKIT_DTYPE_FP32;
  return moe;
}

struct SparseFfnPlans {
  moekit_plan select, dispatch, combine;
  ExpertMlpPlans mlp;

  // The plans a forward, or a backward, runs (the backward's dispatch and combine are the forward's).
  std::vector<std::pair<const char*, moekit_plan*>> used(bool backward) {
    if (backward) return {{"dgated", &mlp.dgated}, {"dx", &mlp.dxe}, {"dW2", &mlp.dw2}, {"dW1", &mlp.dw1}};
    return {{"group select", &select}, {"dispatch", &dispatch}, {"combine", &combine}, {"up", &mlp.up},
            {"down", &mlp.down}};
  }
};

SparseFfnPlans sparse_ffn_plans(const moekit_plan& layer) {
  const moekit_sparse_ffn_desc_t& d = layer.sparse_ffn;
  const int64_t groups = d.d_ff / d.group_size;
  SparseFfnPlans p;
  p.select = sub_plan(layer, OpKind::group_select);
  p.select.sparse_ffn = d;
  p.dispatch = dispatch_plan(layer, d.max_tokens, d.top_groups, groups, 0);
  p.combine = combine_plan(layer, d.max_tokens, d.top_groups, d.d_model, d.dtype);
  p.mlp = expert_mlp_plans(as_moe_layer(layer), GroupedRows{d.max_tokens * d.top_groups, d.max_tokens}, true);
  return p;
}

// Buffers of a call. Workspace: the scratch section (every building block's workspace in turn: they run one after
// another on the stream), the routing metadata, the expert-layout weights, and the direction's own arrays. Saved
// (workspace in inference mode): the selected groups and h. Only the saved sections must agree between a forward
// and its backward; they do not depend on the scratch size.
struct SparseFfnBuffers {
  void* scratch;
  size_t scratch_bytes;
  Routing routing;
  void* w1;  // [NG, 2G, D]
  void* w2;  // [NG, D, G]
  int32_t* groups;  // [T, kg]
  void* h;          // [P, 2G]
  // Forward only.
  int32_t* counts;  // [NG]
  void *a, *y;      // [P, G], [P, D]
  // Backward only.
  float *ones, *ds;           // [P] each: the scores of 1 and the dgated epilogue's (unused) score gradients
  void *dh, *a_scaled, *dxe;  // [P, 2G], [P, G], [P, D]; a' and dxe share one section
  float* dw;                  // fp32 staging of dW1 [NG, 2G, D], then of dW2 [NG, D, G]
  size_t workspace_end, saved_end;
};

SparseFfnBuffers sparse_ffn_buffers(const moekit_plan& layer, void* workspace, void* saved,
                                    bool backward) {
  const moekit_sparse_ffn_desc_t& d = layer.sparse_ffn;
  const int64_t T = d.max_tokens, P = T * d.top_groups, NG = d.d_ff / d.group_size, G = d.group_size;
  const int64_t D = d.d_model, F = d.d_ff;
  const size_t es = storage_bytes(d.dtype);
  SparseFfnBuffers b{};
  b.scratch_bytes = 0;
  for (const auto& [name, sub] : layer.sub_plans->list())
    b.scratch_bytes = std::max(b.scratch_bytes, sub->workspace_bytes);

  Carve ws(workspace);
  b.scratch = ws.take(b.scratch_bytes);
  b.routing = take_routing(ws, NG, P);
  b.w1 = ws.take(static_cast<size_t>(2 * F * D) * es);
  b.w2 = ws.take(static_cast<size_t>(F * D) * es);
  const bool saving = !d.inference;
  Carve sv(saved, kSavedHeaderBytes);
  Carve& kept = saving ? sv : ws;
  b.groups = kept.take<int32_t>(P);
  b.h = kept.take(static_cast<size_t>(P * 2 * G) * es);
  b.saved_end = saving ? sv.end() : 0;
  if (!backward) {
    b.counts = ws.take<int32_t>(NG);
    b.a = ws.take(static_cast<size_t>(P * G) * es);
    b.y = ws.take(static_cast<size_t>(P * D) * es);
  } else {
    b.ones = ws.take<float>(P);
    b.ds = ws.take<float>(P);
    b.dh = ws.take(static_cast<size_t>(P * 2 * G) * es);
    // One section for a' and dxe: the weight gradients read a' before the dx GEMM writes dxe.
    b.a_scaled = b.dxe = ws.take(static_cast<size_t>(P * std::max(G, D)) * es);
    b.dw = ws.take<float>(2 * F * D);
  }
  b.workspace_end = ws.end();
  return b;
}

layers::FfnGroups ffn_groups(const moekit_sparse_ffn_desc_t& d) {
  return layers::FfnGroups{d.d_model, d.d_ff / d.group_size, d.group_size};
}

layers::ConstMatrix matrix(const moekit_tensor_t& t) { return layers::ConstMatrix{t.data, row_stride(t)}; }

layers::GradMatrix grad(const moekit_tensor_t& t, double beta) {
  return layers::GradMatrix{t.data, row_stride(t), t.dtype, static_cast<float>(beta)};
}

}  // namespace

void CudaBackend::sparse_ffn_layer_sizes(moekit_plan& plan) const {
  const moekit_sparse_ffn_desc_t& d = plan.sparse_ffn;
  plan.sub_plans = std::make_shared<const LayerPlans<SparseFfnPlans>>(*this, sparse_ffn_plans(plan), !d.inference);
  set_layer_sizes(plan, d.inference,
                  [&](bool backward) { return sparse_ffn_buffers(plan, nullptr, nullptr, backward); });
}

void CudaBackend::sparse_ffn_forward(const moekit_plan& plan, const moekit_sparse_ffn_fwd_args_t& args, void* saved,
                                     Workspace ws, void* stream_ptr) {
  const moekit_sparse_ffn_desc_t& d = plan.sparse_ffn;
  const cudaStream_t stream = as_stream(stream_ptr);
  const SparseFfnPlans& p = layer_parts<SparseFfnPlans>(plan);
  const SparseFfnBuffers b = sparse_ffn_buffers(plan, ws.data, saved, false);
  const Workspace scratch{b.scratch, b.scratch_bytes};
  const int64_t T = args.x.shape[0], K = d.top_groups, P = T * K, NG = d.d_ff / d.group_size;
  const int64_t G = d.group_size, D = d.d_model;
  const int32_t dt = d.dtype;
  const int dev = device_index_;

  moekit_group_select_args_t select;
  moekit_group_select_args_init(&select);
  select.x = args.x;
  select.w_gate = args.w_gate;
  select.subsample_rows = args.subsample_rows;
  select.lb_bias = args.lb_bias;
  select.groups = device_view(b.groups, MOEKIT_DTYPE_INT32, {T, K}, dev);
  select.counts = device_view(b.counts, MOEKIT_DTYPE_INT32, {NG}, dev);
  group_select(p.select, select, scratch, stream);

  const moekit_dispatch_args_t g = dispatch_args(select.groups, b.routing, NG, dev);
  dispatch(p.dispatch, g, scratch, stream);

  layers::copy_gate_up_to_experts(ffn_groups(d), matrix(args.w_gate), matrix(args.w_up), b.w1, stream);
  layers::copy_down_to_experts(ffn_groups(d), matrix(args.w_down), b.w2, stream);

  moekit_gemm_args_t up = gemm_args(args.x, device_view(b.w1, dt, {NG, 2 * G, D}, dev), g.expert_offsets,
                                    device_view(b.h, dt, {P, 2 * G}, dev));
  up.gather_idx = g.gather_idx;
  up.act = device_view(b.a, dt, {P, G}, dev);
  gemm(p.mlp.up, up, scratch, stream);

  const moekit_gemm_args_t down = gemm_args(up.act, device_view(b.w2, dt, {NG, D, G}, dev), g.expert_offsets,
                                            device_view(b.y, dt, {P, D}, dev));
  gemm(p.mlp.down, down, scratch, stream);

  combine(p.combine, combine_args(down.c, moekit_tensor_t{}, g.grouped_pos, args.out, args.beta_out), scratch,
          stream);
  if (args.groups.data)
    copy_rows(args.groups.data, row_stride(args.groups), b.groups, T, K, sizeof(int32_t), stream,
              "sparse FFN layer forward: groups copy");
  if (args.counts.data)
    copy_rows(args.counts.data, NG, b.counts, 1, NG, sizeof(int32_t), stream, "sparse FFN layer forward: counts copy");
  if (!d.inference) layers::write_saved_header(saved, SavedHeader{kSavedMagic, plan.id, T, 0}, stream);
}

void CudaBackend::sparse_ffn_backward(const moekit_plan& plan, const moekit_sparse_ffn_bwd_args_t& args,
                                      const void* saved, Workspace ws, void* stream_ptr) {
  const moekit_sparse_ffn_desc_t& d = plan.sparse_ffn;
  const bool input_grad = args.compute_input_grad != 0, weight_grad = args.compute_weight_grad != 0;
  if (!input_grad && !weight_grad) return;
  const cudaStream_t stream = as_stream(stream_ptr);
  const SparseFfnPlans& p = layer_parts<SparseFfnPlans>(plan);
  // NOTE: the backward only reads the saved sections; the const_cast lets one carving serve both directions.
  const SparseFfnBuffers b = sparse_ffn_buffers(plan, ws.data, const_cast<void*>(saved), true);
  const Workspace scratch{b.scratch, b.scratch_bytes};
  const int64_t T = args.x.shape[0], K = d.top_groups, P = T * K, NG = d.d_ff / d.group_size;
  const int64_t G = d.group_size, D = d.d_model;
  const int32_t dt = d.dtype;
  const int dev = device_index_;

  const moekit_dispatch_args_t g =
      dispatch_args(device_view(b.groups, MOEKIT_DTYPE_INT32, {T, K}, dev), b.routing, NG, dev);
  dispatch(p.dispatch, g, scratch, stream);

  // dA = dout Wd[:, g] per grouped row, never rounded; dh = [dgate | dup] and a' = a (scores of 1), rounded.
  layers::copy_down_to_experts(ffn_groups(d), matrix(args.w_down), b.w2, stream);
  layers::fill_ones_and_iota(b.ones, nullptr, P, stream);
  moekit_gemm_args_t dg = gemm_args(args.dout, device_view(b.w2, dt, {NG, D, G}, dev), g.expert_offsets,
                                    device_view(b.dh, dt, {P, 2 * G}, dev));
  dg.gather_idx = g.gather_idx;
  dg.h = device_view(b.h, dt, {P, 2 * G}, dev);
  dg.act = device_view(b.a_scaled, dt, {P, G}, dev);
  dg.row_scale = device_view(b.ones, MOEKIT_DTYPE_FP32, {P}, dev);
  dg.pair_idx = g.pair_idx;
  dg.dscores = device_view(b.ds, MOEKIT_DTYPE_FP32, {P}, dev);
  gemm(p.mlp.dgated, dg, scratch, stream);

  if (weight_grad) {
    // An unselected group is an empty segment: its staged gradient is 0, so its rows get beta * themselves.
    moekit_gemm_args_t w1g =
        gemm_args(dg.c, args.x, g.expert_offsets, device_view(b.dw, MOEKIT_DTYPE_FP32, {NG, 2 * G, D}, dev));
    w1g.gather_idx = g.gather_idx;
    gemm(p.mlp.dw1, w1g, scratch, stream);
    layers::add_gate_up_grads(ffn_groups(d), b.dw, grad(args.dw_gate, args.beta_dw_gate),
                              grad(args.dw_up, args.beta_dw_up), stream);

    moekit_gemm_args_t w2g =
        gemm_args(args.dout, dg.act, g.expert_offsets, device_view(b.dw, MOEKIT_DTYPE_FP32, {NG, D, G}, dev));
    w2g.gather_idx = g.gather_idx;
    gemm(p.mlp.dw2, w2g, scratch, stream);
    layers::add_down_grads(ffn_groups(d), b.dw, grad(args.dw_down, args.beta_dw_down), stream);
  }

  if (input_grad) {
    layers::copy_gate_up_to_experts(ffn_groups(d), matrix(args.w_gate), matrix(args.w_up), b.w1, stream);
    const moekit_gemm_args_t dx_e = gemm_args(dg.c, device_view(b.w1, dt, {NG, 2 * G, D}, dev), g.expert_offsets,
                                              device_view(b.dxe, dt, {P, D}, dev));
    gemm(p.mlp.dxe, dx_e, scratch, stream);
    combine(p.combine, combine_args(dx_e.c, moekit_tensor_t{}, g.grouped_pos, args.dx, args.beta_dx), scratch,
            stream);
  }
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
