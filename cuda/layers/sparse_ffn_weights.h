// The sparse SwiGLU FFN layer runs as an MoE whose experts are its neuron groups, and the grouped GEMM reads one
// expert's weights as a dense block. The layer's weights are not laid out so (Wg, Wu [F, D] are two tensors; Wd
// [D, F] holds a group as G columns), so each call copies them into the expert layouts in the workspace, and the
// backward adds the expert-layout weight gradients (fp32, from the varlen-K GEMMs) back into the layer's tensors:
//   W1 [NG, 2G, D]  expert g's rows 0..G-1 are Wg's rows gG..gG+G-1, rows G..2G-1 the same rows of Wu (concat GLU);
//   W2 [NG, D, G]   expert g's row d is Wd[d, gG .. gG+G-1].
// Every element has one reader and one writer, so the results do not depend on the launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace layers {

struct FfnGroups {
  int64_t d_model;     // D
  int64_t groups;      // NG
  int64_t group_size;  // G
};

// A 2-byte (bf16/fp16) matrix of the layer, rows `stride` elements apart.
struct ConstMatrix {
  const void* data;
  int64_t stride;
};

// w1 [NG, 2G, D] contiguous = Wg's and Wu's rows group by group.
void copy_gate_up_to_experts(const FfnGroups& s, ConstMatrix w_gate, ConstMatrix w_up, void* w1, cudaStream_t stream);
// w2 [NG, D, G] contiguous = Wd's column blocks.
void copy_down_to_experts(const FfnGroups& s, ConstMatrix w_down, void* w2, cudaStream_t stream);

// A weight gradient of the layer: dtype bf16, fp16 or fp32 (moekit_dtype_t), rows `stride` elements apart;
// grad = beta * grad + new, rounded once (beta = 0: the old value is never read).
struct GradMatrix {
  void* data;
  int64_t stride;
  int32_t dtype;
  float beta;
};

// dWg, dWu from dw1 [NG, 2G, D] fp32 (every row of dWg and dWu is written).
void add_gate_up_grads(const FfnGroups& s, const float* dw1, GradMatrix dw_gate, GradMatrix dw_up,
                       cudaStream_t stream);
// dWd from dw2 [NG, D, G] fp32 (every column of dWd is written).
void add_down_grads(const FfnGroups& s, const float* dw2, GradMatrix dw_down, cudaStream_t stream);

}  // namespace layers
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
