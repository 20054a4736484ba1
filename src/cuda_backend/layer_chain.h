// What the CUDA layers share as they chain the building blocks on one stream: sub-plans built from the layer's
// descriptor (so each block validates and sizes its own part), device tensor views of internal buffers, and the
// carving of the caller's workspace and saved buffer into 256-byte aligned sections.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "cuda/common/activation_kind.h"
#include "cuda/common/alignment.h"
#include "cuda/common/cuda_check.h"
#include "cuda/layers/layer_kernels.h"
#include "moekit/moekit.h"
#include "src/cuda_backend/cuda_backend.h"
#include "src/cuda_backend/tensor_strides.h"
#include "src/plan.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

// Sections of a buffer, one after another, each starting 256-byte aligned. With a null base it only measures,
// so one function gives both a plan's sizes and a call's addresses.
class Carve {
 public:
  explicit Carve(void* base, size_t start = 0) : base_(static_cast<char*>(base)), end_(align(start)) {}

  void* take(size_t bytes) {
    char* at = base_ ? base_ + end_ : nullptr;
    end_ = align(end_ + bytes);
    return at;
  }
  template <class T>
  T* take(int64_t count) {
    return static_cast<T*>(take(sizeof(T) * static_cast<size_t>(count)));
  }
  size_t end() const { return end_; }

 private:
  static size_t align(size_t v) { return align_to_sections(v); }
  char* base_;
  size_t end_;
};

// A layer plan's sizes from its buffer layout, `layout(backward)` measuring one direction's carving: each direction
// needs its own carving's end (an inference plan has no backward), the workspace size is the larger, and the
// forward fills the saved buffer.
template <class Layout>
void set_layer_sizes(moekit_plan& plan, bool inference, Layout layout) {
  const auto forward = layout(false);
  plan.forward_workspace_bytes = forward.workspace_end;
  plan.backward_workspace_bytes = inference ? 0 : layout(true).workspace_end;
  plan.workspace_bytes = std::max(plan.forward_workspace_bytes, plan.backward_workspace_bytes);
  plan.saved_bytes = forward.saved_end;
}

// The backward's dh: over the saved h when the plan allows it (backward_overwrites_saved: the dgated epilogue
// reads every h element before it writes the dh element at the same place, and nothing reads h after it), else a
// workspace section.
inline void* take_dh(Carve& ws, void* saved_h, const moekit_moe_desc_t& d, size_t bytes) {
  return d.backward_overwrites_saved ? saved_h : ws.take(bytes);
}

// After a backward that wrote dh over h: the header says so (the reference backend refuses a spent buffer; this
// backend never reads headers back, which would synchronise).
inline void spend_saved(const void* saved, const moekit_plan& plan, int64_t rows, cudaStream_t stream) {
  if (plan.moe.backward_overwrites_saved)
    layers::write_saved_header(const_cast<void*>(saved), SavedHeader{kSavedSpentMagic, plan.id, rows, 0}, stream);
}

// A sub-plan of `layer` for one building block; its descriptor is filled by the caller.
inline moekit_plan sub_plan(const moekit_plan& layer, OpKind kind) {
  moekit_plan p{};
  p.kind = kind;
  p.handle = layer.handle;
  return p;
}

// A contiguous device tensor view of internal memory.
inline moekit_tensor_t device_view(void* data, int32_t dtype, std::initializer_list<int64_t> shape, int device) {
  int64_t dims[MOEKIT_MAX_RANK] = {};
  int32_t rank = 0;
  for (int64_t s : shape) dims[rank++] = s;
  return moekit_tensor_make(data, static_cast<moekit_dtype_t>(dtype), rank, dims,
                            moekit_device_t{MOEKIT_DEVICE_CUDA, device});
}

// A view of the first `rows` rows of `t` (same strides).
inline moekit_tensor_t first_rows(moekit_tensor_t t, int64_t rows) {
  t.shape[0] = rows;
  return t;
}

inline size_t storage_bytes(int32_t dtype) { return dtype == MOEKIT_DTYPE_FP32 ? 4 : 2; }

// Columns [first, first + count) of `t`'s last dimension (same strides).
inline moekit_tensor_t column_slice(moekit_tensor_t t, int64_t first, int64_t count) {
  const int last = t.rank - 1;
  t.data = static_cast<char*>(t.data) + static_cast<size_t>(first * t.stride[last]) * storage_bytes(t.dtype);
  t.shape[last] = count;
  return t;
}

// The width of h: 2I for a gated activation, I otherwise.
inline int64_t h_width(const moekit_moe_desc_t& d) { return gated_input_width(d.activation, d.intermediate); }

// Whether the backward keeps `bytes` of scratch in the caller's dW1 [E, hw, H] rather than in the workspace: the
// plan allows it (backward_scratch_in_dw1: dW1 contiguous, written with beta 0 by the dW1 GEMM, the backward's
// last step that touches it) and dW1 is as large.
inline bool scratch_fits_dw1(const moekit_moe_desc_t& d, size_t bytes) {
  const size_t dw1_elements = static_cast<size_t>(d.experts * h_width(d) * d.hidden);
  const size_t dw1_bytes = dw1_elements * storage_bytes(d.weight_grad_dtype);
  return d.backward_scratch_in_dw1 != 0 && dw1_bytes >= bytes;
}

// The row bounds of a layer's grouped GEMMs: the grouped rows P and the rows of a gathered source (T).
struct GroupedRows {
  int64_t grouped, source;
};

// A grouped GEMM descriptor for one step of an expert MLP. Sub-plans skip capi, so "same as dtype" is spelled out.
inline moekit_gemm_desc_t gemm_desc(const moekit_moe_desc_t& d, GroupedRows rows, int32_t mode, int32_t gather,
                                    int32_t epilogue, int64_t n, int64_t k) {
  moekit_gemm_desc_t g;
  moekit_gemm_desc_init(&g);
  g.mode = mode;
  g.gather = gather;
  g.epilogue = epilogue;
  g.activation = d.activation;
  g.glu_layout = d.glu_layout;
  g.glu_limit = d.glu_limit;
  g.groups = d.experts;
  g.max_rows = rows.grouped;
  g.gather_rows = rows.source;
  g.n = n;
  g.k = k;
  g.dtype = d.dtype;
  g.out_dtype = mode == MOEKIT_GEMM_VARLEN_K ? d.weight_grad_dtype : d.dtype;
  return g;
}

// A bias-gradient descriptor (db1 over dh, db2 over dout) of `width` columns, in the weight-gradient dtype.
inline moekit_bias_grad_desc_t bias_grad_desc(const moekit_moe_desc_t& d, GroupedRows rows, int64_t width) {
  moekit_bias_grad_desc_t b;
  moekit_bias_grad_desc_init(&b);
  b.experts = d.experts;
  b.max_rows = rows.grouped;
  b.width = width;
  b.max_tokens = rows.source;
  b.dtype = d.dtype;
  b.out_dtype = d.weight_grad_dtype;
  return b;
}

// The grouped GEMMs and bias sums of an expert MLP (docs/math.md section 3, steps 1-3, section 4, steps 1-6) as plans.
// `gathered`: the MoE layer, whose x and dout rows are gathered by token; the experts-only layer's rows come grouped.
struct ExpertMlpPlans {
  moekit_plan up, down;                        // forward: h and a; y (+ b2)
  moekit_plan dgated, dxe, dw2, dw1, db1, db2;  // backward

  // The plans a forward, or (`backward`) a backward, runs, named for moekit_plan_describe.
  std::vector<std::pair<const char*, moekit_plan*>> used(bool backward) {
    if (!backward) return {{"up", &up}, {"down", &down}};
    return {{"dgated", &dgated}, {"dx", &dxe}, {"dW2", &dw2}, {"dW1", &dw1}, {"db1", &db1}, {"db2", &db2}};
  }
};

// A layer plan's building blocks, made and sized once by the layer's plan_sizes; `Parts` lists them as
// (name, plan) pairs by `used(backward)`, the backward's only when the layer trains.
template <class Parts>
class LayerPlans final : public SubPlans {
 public:
  LayerPlans(const CudaBackend& backend, Parts parts, bool training) : parts_(std::move(parts)) {
    for (bool backward : {false, true}) {
      if (backward && !training) continue;
      for (const auto& [name, plan] : parts_.used(backward)) {
        backend.plan_sizes(*plan);
        list_.emplace_back(name, plan);
      }
    }
  }
  // list_ points into parts_.
  LayerPlans(const LayerPlans&) = delete;
  LayerPlans& operator=(const LayerPlans&) = delete;

  const Parts& parts() const { return parts_; }
  std::vector<std::pair<const char*, const moekit_plan*>> list() const override { return list_; }

 private:
  Parts parts_;
  std::vector<std::pair<const char*, const moekit_plan*>> list_;
};

// The building blocks of `layer`, made by its plan_sizes as LayerPlans<Parts>.
template <class Parts>
const Parts& layer_parts(const moekit_plan& layer) {
  return static_cast<const LayerPlans<Parts>&>(*layer.sub_plans).parts();
}

inline ExpertMlpPlans expert_mlp_plans(const moekit_plan& layer, GroupedRows rows, bool gathered) {
  const moekit_moe_desc_t& d = layer.moe;
  const int64_t hw = h_width(d);
  const int32_t gather_a = gathered ? MOEKIT_GEMM_GATHER_A : MOEKIT_GEMM_GATHER_NONE;
  const int32_t gather_b = gathered ? MOEKIT_GEMM_GATHER_B : MOEKIT_GEMM_GATHER_NONE;
  ExpertMlpPlans p;
  for (moekit_plan* g : {&p.up, &p.down, &p.dgated, &p.dxe, &p.dw2, &p.dw1}) *g = sub_plan(layer, OpKind::gemm);
  p.up.gemm = gemm_desc(d, rows, MOEKIT_GEMM_VARLEN_M, gather_a, MOEKIT_EPILOGUE_GATED, hw, d.hidden);
  p.down.gemm = gemm_desc(d, rows, MOEKIT_GEMM_VARLEN_M, MOEKIT_GEMM_GATHER_NONE,
                          d.has_b2 ? MOEKIT_EPILOGUE_BIAS : MOEKIT_EPILOGUE_STORE, d.hidden, d.intermediate);
  // dA = dout W2[e]: B = W2 [E, H, I] read as [E, K = H, N = I].
  p.dgated.gemm = gemm_desc(d, rows, MOEKIT_GEMM_VARLEN_M, gather_a, MOEKIT_EPILOGUE_DGATED, hw, d.hidden);
  p.dgated.gemm.b_layout = MOEKIT_GEMM_B_KN;
  // dxe = dh W1[e]: B = W1 [E, hw, H] read as [E, K = hw, N = H].
  p.dxe.gemm = gemm_desc(d, rows, MOEKIT_GEMM_VARLEN_M, MOEKIT_GEMM_GATHER_NONE, MOEKIT_EPILOGUE_STORE, d.hidden, hw);
  p.dxe.gemm.b_layout = MOEKIT_GEMM_B_KN;
  // dW2[e] [H, I] = dout_e^T a'_e; dW1[e] [hw, H] = dh_e^T x_e.
  p.dw2.gemm = gemm_desc(d, rows, MOEKIT_GEMM_VARLEN_K, gather_a, MOEKIT_EPILOGUE_STORE, d.intermediate, d.hidden);
  p.dw1.gemm = gemm_desc(d, rows, MOEKIT_GEMM_VARLEN_K, gather_b, MOEKIT_EPILOGUE_STORE, d.hidden, hw);
  p.db1 = sub_plan(layer, OpKind::bias_grad);
  p.db1.bias_grad = bias_grad_desc(d, rows, hw);
  p.db2 = sub_plan(layer, OpKind::bias_grad);
  p.db2.bias_grad = bias_grad_desc(d, rows, d.hidden);
  return p;
}

// The dispatch CSR of a routed layer's call (docs/math.md section 2), carved from the workspace: E+1 offsets and
// three [P] maps.
struct Routing {
  int32_t *offsets, *gather_idx, *pair_idx, *grouped_pos;
};

inline Routing take_routing(Carve& ws, int64_t experts, int64_t pairs) {
  Routing r;
  r.offsets = ws.take<int32_t>(experts + 1);
  r.gather_idx = ws.take<int32_t>(pairs);
  r.pair_idx = ws.take<int32_t>(pairs);
  r.grouped_pos = ws.take<int32_t>(pairs);
  return r;
}

// Dispatch and combine sub-plans of a routed layer: `top_k` int32 ids per token over local experts
// [expert_begin, expert_begin + experts), and rows of `hidden` values summed back per token.
inline moekit_plan dispatch_plan(const moekit_plan& layer, int64_t max_tokens, int64_t top_k, int64_t experts,
                                 int64_t expert_begin) {
  moekit_plan p = sub_plan(layer, OpKind::dispatch);
  moekit_dispatch_desc_init(&p.dispatch);
  p.dispatch.max_tokens = max_tokens;
  p.dispatch.top_k = top_k;
  p.dispatch.max_pairs = max_tokens * top_k;
  p.dispatch.experts = experts;
  p.dispatch.expert_begin = expert_begin;
  return p;
}

inline moekit_plan combine_plan(const moekit_plan& layer, int64_t max_tokens, int64_t top_k, int64_t hidden,
                                int32_t dtype) {
  moekit_plan p = sub_plan(layer, OpKind::combine);
  moekit_combine_desc_init(&p.combine);
  p.combine.max_tokens = max_tokens;
  p.combine.top_k = top_k;
  p.combine.hidden = hidden;
  p.combine.dtype = dtype;
  return p;
}

// The dispatch of a call's ids [T, K] (int32 or int64) into the routing metadata.
inline moekit_dispatch_args_t dispatch_args(const moekit_tensor_t& indices, const Routing& r, int64_t E, int dev) {
  const int64_t T = indices.shape[0], K = indices.shape[1];
  moekit_dispatch_args_t g;
  moekit_dispatch_args_init(&g);
  g.indices = indices;
  g.expert_offsets = device_view(r.offsets, MOEKIT_DTYPE_INT32, {E + 1}, dev);
  g.gather_idx = device_view(r.gather_idx, MOEKIT_DTYPE_INT32, {T * K}, dev);
  g.pair_idx = device_view(r.pair_idx, MOEKIT_DTYPE_INT32, {T * K}, dev);
  g.grouped_pos = device_view(r.grouped_pos, MOEKIT_DTYPE_INT32, {T * K}, dev);
  return g;
}

// out = beta out + the pairs' grouped rows summed per token, weighted by `scores` (absent: weights of 1).
inline moekit_combine_args_t combine_args(const moekit_tensor_t& grouped, const moekit_tensor_t& scores,
                                          const moekit_tensor_t& grouped_pos, const moekit_tensor_t& out,
                                          double beta) {
  moekit_combine_args_t c;
  moekit_combine_args_init(&c);
  c.grouped = grouped;
  c.scores = scores;
  c.grouped_pos = grouped_pos;
  c.out = out;
  c.beta = beta;
  return c;
}

// A grouped GEMM call's arguments with the operands every step names; a step sets the rest (gather, bias, the
// gated and dgated tensors).
inline moekit_gemm_args_t gemm_args(const moekit_tensor_t& a, const moekit_tensor_t& b, const moekit_tensor_t& offsets,
                                    const moekit_tensor_t& c, double beta = 0.0) {
  moekit_gemm_args_t g;
  moekit_gemm_args_init(&g);
  g.a = a;
  g.b = b;
  g.offsets = offsets;
  g.c = c;
  g.beta = beta;
  return g;
}

// A per-expert row sum (db1 over dh; db2 over dy in the experts-only layer).
inline moekit_db1_args_t row_sum_args(const moekit_tensor_t& rows, const moekit_tensor_t& offsets,
                                      const moekit_tensor_t& out, double beta) {
  moekit_db1_args_t r;
  moekit_db1_args_init(&r);
  r.dh = rows;
  r.offsets = offsets;
  r.db1 = out;
  r.beta = beta;
  return r;
}

// dst rows [rows, cols] (row stride dst_stride) = src [rows, cols] contiguous, device to device, on `stream`.
// NOTE: a contiguous dst takes one linear copy: as a 2D copy of K-wide rows (the layer's [T, K] scores), the copy
// of T = 24576 rows of 32 bytes took 16 us on the H200.
inline void copy_rows(void* dst, int64_t dst_stride, const void* src, int64_t rows, int64_t cols, size_t element,
                      cudaStream_t stream, const char* what) {
  if (rows == 0) return;
  if (dst_stride == cols) {
    check_cuda(cudaMemcpyAsync(dst, src, static_cast<size_t>(rows * cols) * element, cudaMemcpyDeviceToDevice, stream),
               what);
    return;
  }
  check_cuda(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_stride) * element, src,
                               static_cast<size_t>(cols) * element, static_cast<size_t>(cols) * element,
                               static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream),
             what);
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
