// The expert half of a routed layer on the CUDA backend: its plans, its buffers and its steps (routed_experts.h).
#include "src/cuda_backend/routed_experts.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/common/cuda_check.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

namespace {

constexpr int64_t kMaxDxChunks = 4;

// The columns of each dxe GEMM and dx combine: all of H, or, where the backward keeps a' and dxe in dW1 and a
// [P, H] dxe does not fit there, H in the fewest equal chunks (at most kMaxDxChunks, whole 16-byte vectors) that let
// the [P, max(I, chunk)] section fit. Each dx element has the same reduction either way: the chunks change no bits.
int64_t dx_chunk_columns(const moekit_moe_desc_t& d) {
  const int64_t P = d.max_tokens * d.top_k;
  const size_t es = storage_bytes(d.dtype);
  for (int64_t chunks = 1; chunks <= kMaxDxChunks && d.hidden % (8 * chunks) == 0; chunks *= 2) {
    const int64_t columns = d.hidden / chunks;
    if (scratch_fits_dw1(d, static_cast<size_t>(P * std::max(d.intermediate, columns)) * es)) return columns;
  }
  return d.hidden;
}

}  // namespace

std::vector<std::pair<const char*, moekit_plan*>> RoutedPlans::used(bool backward) {
  if (backward) {
    std::vector<std::pair<const char*, moekit_plan*>> all = mlp.used(true);
    all.emplace_back("dx combine", &dx_combine);
    return all;
  }
  std::vector<std::pair<const char*, moekit_plan*>> all{{"dispatch", &dispatch}, {"combine", &combine}};
  for (const auto& named : mlp.used(false)) all.push_back(named);
  return all;
}

RoutedPlans routed_plans(const moekit_plan& layer) {
  const moekit_moe_desc_t& d = layer.moe;
  RoutedPlans p;
  p.dispatch = dispatch_plan(layer, d.max_tokens, d.top_k, d.experts, d.expert_begin);
  p.combine = combine_plan(layer, d.max_tokens, d.top_k, d.hidden, d.dtype);
  p.mlp = expert_mlp_plans(layer, GroupedRows{d.max_tokens * d.top_k, d.max_tokens}, true);
  const int64_t dx_columns = dx_chunk_columns(d);
  p.mlp.dxe.gemm.n = dx_columns;
  p.dx_combine = combine_plan(layer, d.max_tokens, d.top_k, dx_columns, d.dtype);
  return p;
}

void take_routed_saved(Carve& kept, const moekit_moe_desc_t& d, RoutedBuffers& b) {
  const int64_t P = d.max_tokens * d.top_k;
  b.routing = take_routing(kept, d.experts, P);
  b.h = kept.take(static_cast<size_t>(P * h_width(d)) * storage_bytes(d.dtype));
}

void take_routed_scratch(Carve& ws, const moekit_moe_desc_t& d, bool backward, RoutedBuffers& b) {
  const int64_t P = d.max_tokens * d.top_k;
  const size_t es = storage_bytes(d.dtype);
  if (!backward) {
    b.a = ws.take(static_cast<size_t>(P * d.intermediate) * es);
    b.y = ws.take(static_cast<size_t>(P * d.hidden) * es);
    return;
  }
  b.ds = ws.take<float>(P);
  b.dh = take_dh(ws, b.h, d, static_cast<size_t>(P * h_width(d)) * es);
  // One section for a' and dxe: dW2 reads a' last and runs before the dxe GEMM writes (routed_backward).
  const size_t a_dxe_bytes = static_cast<size_t>(P * std::max(d.intermediate, dx_chunk_columns(d))) * es;
  b.scratch_in_dw1 = scratch_fits_dw1(d, a_dxe_bytes);
  if (!b.scratch_in_dw1) b.a_dxe = ws.take(a_dxe_bytes);
}

RoutedCall routed_call(CudaBackend& backend, const moekit_plan& layer, const RoutedPlans& plans,
                       const RoutedBuffers& buffers, const moekit_tensor_t& ids, Workspace scratch,
                       cudaStream_t stream, int device) {
  return RoutedCall{backend, layer.moe, plans, buffers, dispatch_args(ids, buffers.routing, layer.moe.experts, device),
                    scratch, stream, device};
}

void routed_forward(const RoutedCall& call, const RoutedForward& f) {
  const moekit_moe_desc_t& d = call.desc;
  const RoutedPlans& p = call.plans;
  const RoutedBuffers& b = call.buffers;
  const moekit_dispatch_args_t& g = call.routing;
  const int64_t P = g.gather_idx.shape[0];
  const int dev = call.device;
  call.backend.dispatch(p.dispatch, g, call.scratch, call.stream);

  moekit_gemm_args_t up = gemm_args(f.x, f.w1, g.expert_offsets, device_view(b.h, d.dtype, {P, h_width(d)}, dev));
  up.gather_idx = g.gather_idx;
  up.bias = f.b1;
  up.act = device_view(b.a, d.dtype, {P, d.intermediate}, dev);
  call.backend.gemm(p.mlp.up, up, call.scratch, call.stream);

  moekit_gemm_args_t down =
      gemm_args(up.act, f.w2, g.expert_offsets, device_view(b.y, d.dtype, {P, d.hidden}, dev));
  down.bias = f.b2;
  call.backend.gemm(p.mlp.down, down, call.scratch, call.stream);

  call.backend.combine(p.combine, combine_args(down.c, f.weights, g.grouped_pos, f.out, f.beta_out), call.scratch,
                       call.stream);
}

void routed_backward(const RoutedCall& call, const RoutedBackward& a) {
  const moekit_moe_desc_t& d = call.desc;
  const RoutedPlans& p = call.plans;
  const RoutedBuffers& b = call.buffers;
  const moekit_dispatch_args_t& g = call.routing;
  const int64_t T = g.indices.shape[0], K = g.indices.shape[1], P = T * K, hw = h_width(d);
  const int dev = call.device;
  CudaBackend& run = call.backend;
  void* const a_dxe = b.scratch_in_dw1 ? a.dw1.data : b.a_dxe;

  // ds of a dropped pair stays 0: the dgated epilogue writes only the grouped rows' pairs.
  if (P > 0)
    check_cuda(cudaMemsetAsync(b.ds, 0, static_cast<size_t>(P) * sizeof(float), call.stream), "ds clear");
  moekit_gemm_args_t dg = gemm_args(a.dout, a.w2, g.expert_offsets, device_view(b.dh, d.dtype, {P, hw}, dev));
  dg.gather_idx = g.gather_idx;
  dg.h = device_view(b.h, d.dtype, {P, hw}, dev);
  dg.act = device_view(a_dxe, d.dtype, {P, d.intermediate}, dev);
  dg.row_scale = device_view(a.weights.data, MOEKIT_DTYPE_FP32, {P}, dev);
  dg.pair_idx = g.pair_idx;
  dg.dscores = device_view(b.ds, MOEKIT_DTYPE_FP32, {P}, dev);
  run.gemm(p.mlp.dgated, dg, call.scratch, call.stream);

  if (d.has_b2) {
    moekit_db2_ds_args_t bd;
    moekit_db2_ds_args_init(&bd);
    bd.dout = a.dout;
    bd.scores = device_view(a.weights.data, MOEKIT_DTYPE_FP32, {T, K}, dev);
    bd.b2 = a.b2;
    bd.offsets = g.expert_offsets;
    bd.gather_idx = g.gather_idx;
    bd.pair_idx = g.pair_idx;
    if (a.weight_grad) bd.db2 = a.db2;
    bd.dscores = device_view(b.ds, MOEKIT_DTYPE_FP32, {T, K}, dev);
    bd.beta = a.beta_db2;
    run.db2_ds(p.mlp.db2, bd, call.scratch, call.stream);
  }

  // dW2 before the input gradient: dxe takes a''s memory.
  if (a.weight_grad) {
    moekit_gemm_args_t w2g = gemm_args(a.dout, dg.act, g.expert_offsets, a.dw2, a.beta_dw2);
    w2g.gather_idx = g.gather_idx;
    run.gemm(p.mlp.dw2, w2g, call.scratch, call.stream);
  }

  if (a.input_grad) {
    const int64_t columns = p.dx_combine.combine.hidden;
    for (int64_t first = 0; first < d.hidden; first += columns) {
      const moekit_gemm_args_t dx_e = gemm_args(dg.c, column_slice(a.w1, first, columns), g.expert_offsets,
                                                device_view(a_dxe, d.dtype, {P, columns}, dev));
      run.gemm(p.mlp.dxe, dx_e, call.scratch, call.stream);
      run.combine(p.dx_combine,
                  combine_args(dx_e.c, moekit_tensor_t{}, g.grouped_pos, column_slice(a.dx, first, columns),
                               a.beta_dx),
                  call.scratch, call.stream);
    }
  }

  if (a.weight_grad) {
    moekit_gemm_args_t w1g = gemm_args(dg.c, a.x, g.expert_offsets, a.dw1, a.beta_dw1);
    w1g.gather_idx = g.gather_idx;
    run.gemm(p.mlp.dw1, w1g, call.scratch, call.stream);
    if (d.has_b1)
      run.db1(p.mlp.db1, row_sum_args(dg.c, g.expert_offsets, a.db1, a.beta_db1), call.scratch, call.stream);
  }
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
