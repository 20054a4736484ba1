// The sparse FFN layer's weight copies into the expert layouts and its gradient scatter back
// (sparse_ffn_weights.h). One elementwise kernel per direction, templated on a row map that says where row r of
// the expert layout lives in the layer's tensors; the copies move 16-byte vectors where every row start allows.
#include "cuda/layers/sparse_ffn_weights.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/common/storage.cuh"
#include "cuda/layers/grid_stride.cuh"
#include "cuda/common/status_error.h"
#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace layers {

namespace {

// Row r of an expert layout: which of the layer's two tensors holds it, and the element offset of its start.
struct Place {
  int tensor;
  int64_t offset;
};

// W1 [NG, 2G, D]: rows of Wg (tensor 0) then of Wu (tensor 1), group by group; rows D wide.
struct GateUpRows {
  int64_t group_size, width;
  int64_t stride[2];

  __device__ Place at(int64_t r) const {
    const int64_t g = r / (2 * group_size), q = r % (2 * group_size);
    const int tensor = q >= group_size ? 1 : 0;
    return Place{tensor, (g * group_size + q - tensor * group_size) * stride[tensor]};
  }
};

// W2 [NG, D, G]: row (g, d) is Wd[d, gG .. gG+G-1]; rows G wide.
struct DownColumnRows {
  int64_t group_size, width, d_model;
  int64_t stride[2];

  __device__ Place at(int64_t r) const {
    const int64_t g = r / d_model, d = r % d_model;
    return Place{0, d * stride[0] + g * group_size};
  }
};

// dst [rows, width] contiguous = the layer's rows, moved Chunk by Chunk (Chunk: 8 or 1 two-byte values).
template <class Rows, class Chunk>
__global__ void to_experts_kernel(Rows map, int64_t rows, const uint16_t* src0, const uint16_t* src1, uint16_t* dst) {
  constexpr int64_t kPerChunk = sizeof(Chunk) / sizeof(uint16_t);
  const int64_t chunks_per_row = map.width / kPerChunk;
  const int64_t count = rows * chunks_per_row;
  for (int64_t i = first_item(); i < count; i += item_step()) {
    const int64_t r = i / chunks_per_row, c = (i % chunks_per_row) * kPerChunk;
    const Place p = map.at(r);
    const uint16_t* from = (p.tensor == 0 ? src0 : src1) + p.offset + c;
    *reinterpret_cast<Chunk*>(dst + r * map.width + c) = *reinterpret_cast<const Chunk*>(from);
  }
}

// The layer's gradient rows = beta * themselves + src [rows, width] fp32, rounded once to Out.
template <class Rows, class Out>
__global__ void add_from_experts_kernel(Rows map, int64_t rows, const float* src, Out* dst0, float beta0, Out* dst1,
                                        float beta1) {
  const int64_t count = rows * map.width;
  for (int64_t i = first_item(); i < count; i += item_step()) {
    const int64_t r = i / map.width, c = i % map.width;
    const Place p = map.at(r);
    Out* to = (p.tensor == 0 ? dst0 : dst1) + p.offset + c;
    const float beta = p.tensor == 0 ? beta0 : beta1;
    const float v = beta == 0.0f ? src[i] : fmaf(beta, to_float(*to), src[i]);
    *to = from_float<Out>(v);
  }
}

bool vector_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <class Rows>
void copy_to_experts(const Rows& map, int64_t rows, const void* src0, const void* src1, void* dst,
                     cudaStream_t stream, const char* what) {
  if (rows * map.width == 0) return;
  const bool vectors = map.width % 8 == 0 && map.stride[0] % 8 == 0 && map.stride[1] % 8 == 0 &&
                       vector_aligned(src0) && vector_aligned(src1) && vector_aligned(dst);
  const auto* s0 = static_cast<const uint16_t*>(src0);
  const auto* s1 = static_cast<const uint16_t*>(src1);
  auto* d = static_cast<uint16_t*>(dst);
  if (vectors) {
    to_experts_kernel<Rows, uint4><<<blocks_for(rows * map.width / 8), kThreads, 0, stream>>>(map, rows, s0, s1, d);
  } else {
    to_experts_kernel<Rows, uint16_t><<<blocks_for(rows * map.width), kThreads, 0, stream>>>(map, rows, s0, s1, d);
  }
  check_launch(what);
}

template <class Out, class Rows>
void launch_add(const Rows& map, int64_t rows, const float* src, const GradMatrix& g0, const GradMatrix& g1,
                cudaStream_t stream) {
  add_from_experts_kernel<Rows, Out><<<blocks_for(rows * map.width), kThreads, 0, stream>>>(
      map, rows, src, static_cast<Out*>(g0.data), g0.beta, static_cast<Out*>(g1.data), g1.beta);
}

// Both gradients of one call share a dtype (the plan's weight_grad_dtype).
template <class Rows>
void add_from_experts(const Rows& map, int64_t rows, const float* src, const GradMatrix& g0, const GradMatrix& g1,
                      cudaStream_t stream, const char* what) {
  if (rows * map.width == 0) return;
  switch (g0.dtype) {
    case MOEKIT_DTYPE_FP32: launch_add<float>(map, rows, src, g0, g1, stream); break;
    case MOEKIT_DTYPE_BF16: launch_add<__nv_bfloat16>(map, rows, src, g0, g1, stream); break;
    case MOEKIT_DTYPE_FP16: launch_add<__half>(map, rows, src, g0, g1, stream); break;
    default: throw_not_supported(std::string(what) + ": weight gradients are bf16, fp16 or fp32");
  }
  check_launch(what);
}

GateUpRows gate_up_rows(const FfnGroups& s, int64_t gate_stride, int64_t up_stride) {
  return GateUpRows{s.group_size, s.d_model, {gate_stride, up_stride}};
}

DownColumnRows down_rows(const FfnGroups& s, int64_t stride) {
  return DownColumnRows{s.group_size, s.group_size, s.d_model, {stride, stride}};
}

}  // namespace

void copy_gate_up_to_experts(const FfnGroups& s, ConstMatrix w_gate, ConstMatrix w_up, void* w1,
                             cudaStream_t stream) {
  copy_to_experts(gate_up_rows(s, w_gate.stride, w_up.stride), s.groups * 2 * s.group_size, w_gate.data, w_up.data,
                  w1, stream, "sparse FFN layer: gate/up weight copy kernel");
}

void copy_down_to_experts(const FfnGroups& s, ConstMatrix w_down, void* w2, cudaStream_t stream) {
  copy_to_experts(down_rows(s, w_down.stride), s.groups * s.d_model, w_down.data, w_down.data, w2, stream,
                  "sparse FFN layer: down weight copy kernel");
}

void add_gate_up_grads(const FfnGroups& s, const float* dw1, GradMatrix dw_gate, GradMatrix dw_up,
                       cudaStream_t stream) {
  add_from_experts(gate_up_rows(s, dw_gate.stride, dw_up.stride), s.groups * 2 * s.group_size, dw1, dw_gate, dw_up,
                   stream, "sparse FFN layer: gate/up weight gradient kernel");
}

void add_down_grads(const FfnGroups& s, const float* dw2, GradMatrix dw_down, cudaStream_t stream) {
  add_from_experts(down_rows(s, dw_down.stride), s.groups * s.d_model, dw2, dw_down, dw_down, stream,
                   "sparse FFN layer: down weight gradient kernel");
}

}  // namespace layers
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
