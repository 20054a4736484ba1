// The CUDA backend's sparse-FFN building blocks (docs/math.md section 7): group selection and the load-balance update.
//
// Group selection per chunk of tokens: the gate pre-activation pre = x · W_sel^T is one cuBLASLt GEMM (bf16/fp16
// in, fp32 accumulation, bf16/fp16 out: its output is a rounding point of docs/math.md section 8), W_sel being Wg
// itself or its subsample rows gathered into the workspace; then the energy + top-kg kernel reads pre. Counts, when
// asked for, are one histogram pass over the groups at the end (group_counts.cu). Nothing waits for
// the device, nothing is allocated on the device, and the chosen GEMM algorithm is fixed per problem shape, so
// a call gives the same bits on every run and stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/common/cuda_check.h"
#include "src/cuda_backend/cuda_backend.h"
#include "src/cuda_backend/tensor_strides.h"
#include "cuda/dense/dense_gemm.h"
#include "cuda/sparse_ffn/group_select.h"
#include "cuda/sparse_ffn/group_select_workspace.h"
#include "cuda/common/status_error.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

namespace {

// The gather (with a subsample), then per chunk of tokens the gate GEMM into the workspace's pre buffer and the
// energy + top-kg kernel writing that chunk's groups.
void select_chunks(int device, const DeviceFacts& facts, const moekit_sparse_ffn_desc_t& d, const sparse_ffn::GroupSelectLayout& layout,
                   const moekit_group_select_args_t& args, char* workspace, cudaStream_t stream) {
  const int64_t tokens = args.x.shape[0];
  const void* w_sel = args.w_gate.data;
  int64_t w_stride = row_stride(args.w_gate);
  if (layout.gathers_rows) {
    sparse_ffn::GatherRowsArgs gather{args.w_gate.data, row_stride(args.w_gate),
                                      static_cast<const int32_t*>(args.subsample_rows.data),
                                      layout.groups, d.group_size, layout.rows_per_group, d.d_model,
                                      workspace + layout.w_sel_offset};
    sparse_ffn::launch_gather_subsample_rows(gather, stream);
    w_sel = gather.w_sel;
    w_stride = d.d_model;
  }

  const cudaDataType_t type = cuda_type(d.dtype);
  const sparse_ffn::Storage storage =
      d.dtype == MOEKIT_DTYPE_BF16 ? sparse_ffn::Storage::bf16 : sparse_ffn::Storage::fp16;
  const size_t element = 2;
  void* pre = workspace + layout.pre_offset;
  for (int64_t first = 0; first < tokens; first += layout.chunk_tokens) {
    const int64_t rows = std::min(layout.chunk_tokens, tokens - first);
    // pre [rows, R] = x_chunk [rows, D] . w_sel [R, D]^T. A one-token tensor may carry any row stride; cuBLASLt
    // wants a leading dimension of at least D.
    const DenseGemm gemm{type,  type,     rows, layout.selected_rows, d.d_model, false, true,
                         row_stride(args.x), w_stride, layout.selected_rows, 1.0f, 0.0f};
    const char* x_chunk = static_cast<const char*>(args.x.data) + first * row_stride(args.x) * element;
    run_dense_gemm(device, gemm, x_chunk, w_sel, pre, workspace + layout.gemm_offset, stream,
                   "group select: gate pre-activation GEMM");

    sparse_ffn::GroupEnergyArgs energy{};
    energy.pre = pre;
    energy.tokens = rows;
    energy.groups = layout.groups;
    energy.rows_per_group = layout.rows_per_group;
    energy.estimate_scale =
        layout.gathers_rows ? static_cast<float>(d.group_size) / static_cast<float>(d.subsample) : 1.0f;
    energy.lb_bias = static_cast<const float*>(args.lb_bias.data);
    energy.top_groups = d.top_groups;
    energy.groups_out = static_cast<int32_t*>(args.groups.data) + first * row_stride(args.groups);
    energy.groups_stride = row_stride(args.groups);
    energy.sm_count = facts.sm_count;
    energy.shared_bytes_optin = facts.shared_bytes_optin;
    sparse_ffn::launch_group_energy_topk(storage, energy, stream);
  }
}

}  // namespace

void CudaBackend::group_select(const moekit_plan& plan, const moekit_group_select_args_t& args, Workspace ws,
                               void* stream_ptr) {
  const moekit_sparse_ffn_desc_t& d = plan.sparse_ffn;
  const sparse_ffn::GroupSelectLayout layout = sparse_ffn::group_select_layout(d);
  const cudaStream_t stream = as_stream(stream_ptr);
  const int64_t tokens = args.x.shape[0];
  char* workspace = static_cast<char*>(ws.data);

  if (tokens > 0) select_chunks(device_index_, facts_, d, layout, args, workspace, stream);
  if (args.counts.data) {
    sparse_ffn::GroupCountsArgs counting{static_cast<const int32_t*>(args.groups.data),
                                         row_stride(args.groups),
                                         tokens,
                                         d.top_groups,
                                         layout.groups,
                                         reinterpret_cast<int32_t*>(workspace + layout.partials_offset),
                                         static_cast<int32_t*>(args.counts.data)};
    sparse_ffn::launch_group_counts(counting, stream);
  }
}

void CudaBackend::load_balance_update(const moekit_load_balance_args_t& args, void* stream) {
  sparse_ffn::LoadBalanceArgs lb{};
  lb.counts = args.counts.data;
  switch (args.counts.dtype) {
    case MOEKIT_DTYPE_INT32: lb.counts_type = sparse_ffn::CountsType::int32; break;
    case MOEKIT_DTYPE_INT64: lb.counts_type = sparse_ffn::CountsType::int64; break;
    case MOEKIT_DTYPE_FP32: lb.counts_type = sparse_ffn::CountsType::fp32; break;
    default: throw_not_supported("counts: the load-balance update takes int32, int64 or fp32 counts");
  }
  lb.ema = static_cast<float*>(args.ema.data);
  lb.bias = static_cast<float*>(args.bias.data);
  lb.groups = args.counts.shape[0];
  lb.tokens = args.tokens;
  lb.top_groups = args.top_groups;
  lb.momentum = args.momentum;
  lb.gamma = args.gamma;
  lb.bias_max = args.bias_max;
  sparse_ffn::launch_load_balance_update(lb, as_stream(stream));
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
