// The CUDA MoE layer at the SonicMoE test shapes (T = 8192, bf16, SwiGLU concat, SOFTMAX_TOPK, no biases) against a
// GPU oracle built from independent pieces, and the experts-only op against the layer.
//
// Oracle: the routing is the layer's own (its scores and indices), so both sides run the same pairs; the grouping is
// a stable sort by expert on the host (docs/math.md section 2); every product is one cuBLASLt call per expert with fp32
// output (gemm_oracle.h), the SwiGLU / dSwiGLU epilogues and the combine are plain kernels rounding where docs/math.md
// section 8 does (h, a, y, a', dh, dxe, out, dx), dlogits comes from ds on the host by section 1's SOFTMAX_TOPK
// backward, and dWr and the dlogits Wr part of dx are cuBLASLt products. out, dx, dWr, dW1, dW2 are compared with
// section 9's metrics on the device (rows = the last dimension; weight gradients per expert).
//
// Experts-only op against the layer: the op runs on the layer's grouped rows (x gathered in the dispatch's order,
// offsets from the layer's counts) with dy = the per-pair s * dout. If the two disagreed on which rows belong to
// which expert, on the weights they read or on the gradients they form, one of these fails:
//   - y combined with the layer's scores (weights s, ascending k) must be the layer's out: every token's out mixes
//     K experts' rows, so a row given to the wrong expert or a wrong product moves whole rows of out by O(1);
//   - y and the grouped dx must match the oracle's y and dxe per expert segment (both are per-pair quantities the
//     layer does not return);
//   - dW1 and dW2 must match the layer's: the layer scales a' and dA by s, the op receives s * dout instead, which is
//     the same sum up to the rounding of s * dout, so only a disagreement beyond rounding fails.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "gpu/device_array.h"
#include "gpu/gemm_oracle.h"
#include "gpu/layer_oracle.h"
#include "gpu/two_backends.h"

using namespace moekit_test;

namespace {

constexpr int64_t kTokens = 8192;
constexpr moekit_dtype_t kBf16 = MOEKIT_DTYPE_BF16;

struct Shape {
  int64_t hidden, inter, experts, top_k;
};

const Shape kSonicMoEShapes[] = {{768, 256, 128, 8}, {1536, 512, 64, 4}, {4096, 256, 256, 16}, {4096, 1024, 128, 8}};

moekit_moe_desc_t layer_desc(const Shape& s, int64_t max_tokens) {
  moekit_moe_desc_t d;
  moekit_moe_desc_init(&d);
  d.max_tokens = max_tokens;
  d.hidden = s.hidden;
  d.intermediate = s.inter;
  d.router_experts = d.experts = s.experts;
  d.top_k = s.top_k;
  d.activation = MOEKIT_ACT_SWIGLU;
  d.glu_layout = MOEKIT_GLU_CONCAT;
  d.router = MOEKIT_ROUTER_SOFTMAX_TOPK;
  d.dtype = kBf16;
  return d;
}

// A layer plan with its saved buffer and workspace in device memory, destroyed with the owner.
struct DevicePlan {
  moekit_plan_t plan = nullptr;
  DeviceBuffer saved, workspace;
  DevicePlan() = default;
  DevicePlan(const DevicePlan&) = delete;
  DevicePlan& operator=(const DevicePlan&) = delete;
  ~DevicePlan() { moekit_plan_destroy(plan); }
  // Sizes and allocates the buffers once `plan` is created.
  void allocate() {
    size_t saved_bytes = 0, workspace_bytes = 0;
    MOEKIT_REQUIRE_OK(moekit_plan_saved_size(plan, &saved_bytes));
    MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &workspace_bytes));
    saved = DeviceBuffer(saved_bytes);
    workspace = DeviceBuffer(workspace_bytes);
  }
  // A forward or backward call of the plan with these buffers, on the default stream.
  template <class Call, class Args>
  moekit_status_t run(Call call, const Args& args) {
    return call(plan, &args, saved.data(), saved.bytes(), workspace.data(), workspace.bytes(), nullptr);
  }
};

// The layer's inputs (device fills, scaled so every output is O(1)), its outputs, and the host grouping of its pairs.
struct LayerRun {
  Shape s;
  int64_t pairs;
  DeviceArray x, wr, w1, w2, dout;
  DeviceArray out, scores, indices, counts, dx, dwr, dw1, dw2;
  std::vector<int32_t> offsets, gather, pair, grouped_pos;  // offsets [E+1], gather/pair [P], grouped_pos [T K]
  DeviceArray d_offsets, d_gather, d_pair, d_grouped_pos;

  explicit LayerRun(const Shape& shape)
      : s(shape),
        pairs(kTokens * shape.top_k),
        x(kBf16, {kTokens, shape.hidden}),
        wr(kBf16, {shape.experts, shape.hidden}),
        w1(kBf16, {shape.experts, 2 * shape.inter, shape.hidden}),
        w2(kBf16, {shape.experts, shape.hidden, shape.inter}),
        dout(kBf16, {kTokens, shape.hidden}),
        out(kBf16, {kTokens, shape.hidden}),
        scores(MOEKIT_DTYPE_FP32, {kTokens, shape.top_k}),
        indices(MOEKIT_DTYPE_INT64, {kTokens, shape.top_k}),
        counts(MOEKIT_DTYPE_INT32, {shape.experts}),
        dx(kBf16, {kTokens, shape.hidden}),
        dwr(kBf16, {shape.experts, shape.hidden}),
        dw1(kBf16, {shape.experts, 2 * shape.inter, shape.hidden}),
        dw2(kBf16, {shape.experts, shape.hidden, shape.inter}) {}
};

// Forward + backward of the CUDA layer on random inputs, then the grouping of its pairs built on the host.
void run_layer(moekit_handle_t handle, LayerRun& r, uint64_t seed) {
  const Shape& s = r.s;
  const double H = static_cast<double>(s.hidden), I = static_cast<double>(s.inter);
  r.x.fill(1.0, seed);
  r.wr.fill(3.0 / std::sqrt(H), seed + 1);  // logits of variance ~1: random routing, few near-ties
  r.w1.fill(3.0 / std::sqrt(H), seed + 2);
  r.w2.fill(3.0 / std::sqrt(I), seed + 3);
  r.dout.fill(1.0, seed + 4);
  for (DeviceArray* t : {&r.out, &r.scores, &r.indices, &r.counts, &r.dx, &r.dwr, &r.dw1, &r.dw2}) t->poison();

  const moekit_moe_desc_t d = layer_desc(s, kTokens);
  DevicePlan layer;
  MOEKIT_REQUIRE_OK(moekit_moe_plan_create(handle, &d, &layer.plan));
  layer.allocate();
  moekit_moe_fwd_args_t f;
  moekit_moe_fwd_args_init(&f);
  f.x = r.x.view();
  f.w_router = r.wr.view();
  f.w1 = r.w1.view();
  f.w2 = r.w2.view();
  f.out = r.out.view();
  f.scores = r.scores.view();
  f.indices = r.indices.view();
  f.counts = r.counts.view();
  MOEKIT_REQUIRE_OK(layer.run(moekit_moe_forward, f));
  moekit_moe_bwd_args_t b;
  moekit_moe_bwd_args_init(&b);
  b.x = f.x;
  b.dout = r.dout.view();
  b.w_router = f.w_router;
  b.w1 = f.w1;
  b.w2 = f.w2;
  b.dx = r.dx.view();
  b.dw_router = r.dwr.view();
  b.dw1 = r.dw1.view();
  b.dw2 = r.dw2.view();
  MOEKIT_REQUIRE_OK(layer.run(moekit_moe_backward, b));
  CUDA_REQUIRE(cudaDeviceSynchronize());

  // Grouping (docs/math.md section 2): a stable sort of the pairs by expert. Every pair is valid
  // (E = router experts, e0 = 0).
  const int64_t E = s.experts, K = s.top_k, P = r.pairs;
  const std::vector<int64_t> idx = download_vector<int64_t>(r.indices.buffer, P);
  const std::vector<int32_t> counts = download_vector<int32_t>(r.counts.buffer, E);
  r.offsets.assign(static_cast<size_t>(E + 1), 0);
  int64_t bad_pairs = 0;  // ids out of range or repeated within a token
  for (int64_t t = 0; t < kTokens; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = idx[static_cast<size_t>(t * K + k)];
      bool bad = e < 0 || e >= E;
      for (int64_t j = 0; j < k; ++j) bad = bad || idx[static_cast<size_t>(t * K + j)] == e;
      if (bad)
        ++bad_pairs;
      else
        ++r.offsets[static_cast<size_t>(e + 1)];
    }
  REQUIRE(bad_pairs == 0);
  REQUIRE(std::vector<int32_t>(r.offsets.begin() + 1, r.offsets.end()) == counts);
  for (int64_t e = 0; e < E; ++e) r.offsets[static_cast<size_t>(e + 1)] += r.offsets[static_cast<size_t>(e)];
  std::vector<int32_t> next(r.offsets.begin(), r.offsets.end() - 1);
  r.gather.resize(static_cast<size_t>(P));
  r.pair.resize(static_cast<size_t>(P));
  r.grouped_pos.resize(static_cast<size_t>(P));
  for (int64_t p = 0; p < P; ++p) {
    const int32_t pos = next[static_cast<size_t>(idx[static_cast<size_t>(p)])]++;
    r.gather[static_cast<size_t>(pos)] = static_cast<int32_t>(p / K);
    r.pair[static_cast<size_t>(pos)] = static_cast<int32_t>(p);
    r.grouped_pos[static_cast<size_t>(p)] = pos;
  }
  r.d_offsets = upload_int32(r.offsets);
  r.d_gather = upload_int32(r.gather);
  r.d_pair = upload_int32(r.pair);
  r.d_grouped_pos = upload_int32(r.grouped_pos);
}

const uint16_t* bf16_at(const DeviceArray& a, int64_t offset) {
  return static_cast<const uint16_t*>(a.data()) + offset;
}
float* fp32_at(const DeviceArray& a, int64_t offset) { return static_cast<float*>(a.data()) + offset; }

// C rows of expert e [rows_e, n] (fp32) = A rows of e [rows_e, k] (lda) op(B[e]), B[e] at e * b_stride.
void per_expert_rows(cublasLtHandle_t lt, const std::vector<int32_t>& offsets, int64_t n, int64_t k,
                     const DeviceArray& a, int64_t lda, const DeviceArray& b, int64_t ldb, bool b_trans,
                     int64_t b_stride, DeviceArray& c) {
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    const int64_t lo = offsets[e], rows = offsets[e + 1] - lo;
    cublaslt_product(lt, kBf16, rows, n, k, bf16_at(a, lo * lda), lda, false,
                     bf16_at(b, static_cast<int64_t>(e) * b_stride), ldb, b_trans, fp32_at(c, lo * n), n);
  }
}

// C[e] [m, n] (fp32) = A rows of e [rows_e, m]^T B rows of e [rows_e, n]: a per-expert weight gradient.
void per_expert_sums(cublasLtHandle_t lt, const std::vector<int32_t>& offsets, int64_t m, int64_t n,
                     const DeviceArray& a, const DeviceArray& b, DeviceArray& c) {
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    const int64_t lo = offsets[e], rows = offsets[e + 1] - lo;
    cublaslt_product(lt, kBf16, m, n, rows, bf16_at(a, lo * m), m, true, bf16_at(b, lo * n), n, false,
                     fp32_at(c, static_cast<int64_t>(e) * m * n), n);
  }
}

// The oracle's results for one layer run (fp32 products where the layer rounds them later, bf16 where
// docs/math.md section 8 rounds).
struct Oracle {
  DeviceArray xg, y, dxe, out, dx, dwr, dw1, dw2;
};

Oracle run_oracle(cublasLtHandle_t lt, const LayerRun& r) {
  const int64_t H = r.s.hidden, I = r.s.inter, E = r.s.experts, K = r.s.top_k, P = r.pairs, T = kTokens;
  const auto* gather = static_cast<const int32_t*>(r.d_gather.data());
  const auto* pair = static_cast<const int32_t*>(r.d_pair.data());
  const auto* grouped_pos = static_cast<const int32_t*>(r.d_grouped_pos.data());
  const auto* scores = static_cast<const float*>(r.scores.data());
  Oracle o{DeviceArray(kBf16, {P, H}),
           DeviceArray(MOEKIT_DTYPE_FP32, {P, H}),
           DeviceArray(MOEKIT_DTYPE_FP32, {P, H}),
           DeviceArray(kBf16, {T, H}),
           DeviceArray(kBf16, {T, H}),
           DeviceArray(MOEKIT_DTYPE_FP32, {E, H}),
           DeviceArray(MOEKIT_DTYPE_FP32, {E, 2 * I, H}),
           DeviceArray(MOEKIT_DTYPE_FP32, {E, H, I})};
  device_gather_rows(r.x.data(), H, gather, P, o.xg.data());

  // Forward: h = x W1[e]^T, a = silu(gate) up (rounded), y = a W2[e]^T, out = sum of s y.
  DeviceArray h(kBf16, {P, 2 * I}), a(kBf16, {P, I});
  {
    DeviceArray product(MOEKIT_DTYPE_FP32, {P, 2 * I});
    per_expert_rows(lt, r.offsets, 2 * I, H, o.xg, H, r.w1, H, true, 2 * I * H, product);
    device_gated_reference(fp32_at(product, 0), P, I, MOEKIT_ACT_SWIGLU, MOEKIT_GLU_CONCAT, 7.0f, kBf16, h.data(),
                           a.data());
  }
  per_expert_rows(lt, r.offsets, H, I, a, I, r.w2, I, true, H * I, o.y);
  device_combine_pairs(o.y.data(), MOEKIT_DTYPE_FP32, grouped_pos, scores, T, K, H, kBf16, o.out.data());

  // Backward: dA = dout W2[e], dgated (dh, a' = s a, ds), dW2 = dout^T a', dxe = dh W1[e], dW1 = dh^T x.
  DeviceArray doutg(kBf16, {P, H}), dh(kBf16, {P, 2 * I}), as(kBf16, {P, I}), ds(MOEKIT_DTYPE_FP32, {P});
  device_gather_rows(r.dout.data(), H, gather, P, doutg.data());
  {
    DeviceArray product(MOEKIT_DTYPE_FP32, {P, I});
    per_expert_rows(lt, r.offsets, I, H, doutg, H, r.w2, I, false, H * I, product);
    device_dgated_reference(fp32_at(product, 0), h.data(), scores, pair, P, I, MOEKIT_ACT_SWIGLU, MOEKIT_GLU_CONCAT,
                            7.0f, kBf16, dh.data(), as.data(), fp32_at(ds, 0));
  }
  per_expert_sums(lt, r.offsets, H, I, doutg, as, o.dw2);
  per_expert_rows(lt, r.offsets, H, 2 * I, dh, 2 * I, r.w1, H, false, 2 * I * H, o.dxe);
  per_expert_sums(lt, r.offsets, 2 * I, H, dh, o.xg, o.dw1);
  device_combine_pairs(o.dxe.data(), MOEKIT_DTYPE_FP32, grouped_pos, nullptr, T, K, H, kBf16, o.dx.data());
  CUDA_REQUIRE(cudaDeviceSynchronize());

  // Router (docs/math.md section 1, softmax over the top k): dlogits[t, idx_k] = s_k (g_k - sum_j g_j s_j) with g = ds,
  // 0 elsewhere, in fp32, rounded to bf16 for the two products dWr = dlogits^T x and dx += dlogits Wr.
  const std::vector<float> g = download_vector<float>(ds.buffer, P), s = download_vector<float>(r.scores.buffer, P);
  const std::vector<int64_t> idx = download_vector<int64_t>(r.indices.buffer, P);
  HostTensor dlogits(kBf16, {T, E});
  for (int64_t t = 0; t < T; ++t) {
    double gs = 0;
    for (int64_t k = 0; k < K; ++k)
      gs += static_cast<double>(g[static_cast<size_t>(t * K + k)]) * s[static_cast<size_t>(t * K + k)];
    for (int64_t k = 0; k < K; ++k) {
      const size_t p = static_cast<size_t>(t * K + k);
      dlogits.set(t * E + idx[p], static_cast<float>(s[p] * (g[p] - gs)));
    }
  }
  DeviceTensor d_dlogits(dlogits);
  cublaslt_product(lt, kBf16, E, H, T, d_dlogits.data(), E, true, r.x.data(), H, false, fp32_at(o.dwr, 0), H);
  DeviceArray router_dx(MOEKIT_DTYPE_FP32, {T, H});
  cublaslt_product(lt, kBf16, T, H, E, d_dlogits.data(), E, false, r.wr.data(), H, false, fp32_at(router_dx, 0), H);
  device_add_rounded(o.dx.data(), kBf16, fp32_at(router_dx, 0), T * H);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  return o;
}

std::vector<int64_t> as_segments(const std::vector<int32_t>& offsets) {
  return std::vector<int64_t>(offsets.begin(), offsets.end());
}

// For each SonicMoE shape: the layer on fresh inputs, its oracle, then check(cuda handle, layer run, oracle).
template <class Check>
void for_each_shape(uint64_t seed, Check check) {
  Handles handles;
  cublasLtHandle_t lt = nullptr;
  REQUIRE(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS);
  const std::unique_ptr<cublasLtContext, decltype(&cublasLtDestroy)> lt_owner(lt, cublasLtDestroy);
  for (const Shape& s : kSonicMoEShapes) {
    INFO("T " << kTokens << " H " << s.hidden << " I " << s.inter << " E " << s.experts << " K " << s.top_k);
    LayerRun r(s);
    run_layer(handles.cuda, r, seed += 10);
    const Oracle o = run_oracle(lt, r);
    check(handles.cuda, r, o);
  }
}

}  // namespace

TEST_CASE("CUDA MoE layer against the GPU oracle at the SonicMoE shapes (T = 8192)", "[gpu][layer][oracle][large]") {
  for_each_shape(500, [](moekit_handle_t, const LayerRun& r, const Oracle& o) {
    const int64_t H = r.s.hidden, I = r.s.inter, E = r.s.experts;
    require_close_device(r.out.data(), kBf16, o.out.data(), kBf16, kTokens, H, {}, kBf16, "out");
    require_close_device(r.dx.data(), kBf16, o.dx.data(), kBf16, kTokens, H, {}, kBf16, "dx");
    require_close_device(r.dwr.data(), kBf16, o.dwr.data(), MOEKIT_DTYPE_FP32, E, H, blocks_of(E, 1), kBf16, "dWr");
    require_close_device(r.dw1.data(), kBf16, o.dw1.data(), MOEKIT_DTYPE_FP32, E * 2 * I, H, blocks_of(E, 2 * I), kBf16,
                         "dW1");
    require_close_device(r.dw2.data(), kBf16, o.dw2.data(), MOEKIT_DTYPE_FP32, E * H, I, blocks_of(E, H), kBf16, "dW2");
  });
}

TEST_CASE("CUDA experts-only op against the MoE layer on its grouped rows at the SonicMoE shapes",
          "[gpu][layer][oracle][large]") {
  for_each_shape(900, [](moekit_handle_t cuda, const LayerRun& r, const Oracle& o) {
    const Shape& s = r.s;
    const int64_t H = s.hidden, I = s.inter, E = s.experts, K = s.top_k, P = r.pairs;

    // The layer's grouped rows: x gathered by the dispatch's order (o.xg), dy = s * dout per pair.
    DeviceArray dy(kBf16, {P, H}), y(kBf16, {P, H}), dxg(kBf16, {P, H}), dw1(kBf16, {E, 2 * I, H}),
        dw2(kBf16, {E, H, I}), out(kBf16, {kTokens, H});
    device_scaled_gather_rows(r.dout.data(), H, static_cast<const int32_t*>(r.d_gather.data()),
                              static_cast<const float*>(r.scores.data()), static_cast<const int32_t*>(r.d_pair.data()),
                              P, kBf16, dy.data());
    for (DeviceArray* t : {&y, &dxg, &dw1, &dw2}) t->poison();
    const moekit_moe_desc_t d = layer_desc(s, P);
    DevicePlan experts;
    MOEKIT_REQUIRE_OK(moekit_experts_plan_create(cuda, &d, &experts.plan));
    experts.allocate();
    moekit_experts_fwd_args_t f;
    moekit_experts_fwd_args_init(&f);
    f.x = o.xg.view();
    f.offsets = r.d_offsets.view();
    f.w1 = r.w1.view();
    f.w2 = r.w2.view();
    f.y = y.view();
    MOEKIT_REQUIRE_OK(experts.run(moekit_experts_forward, f));
    moekit_experts_bwd_args_t b;
    moekit_experts_bwd_args_init(&b);
    b.x = f.x;
    b.offsets = f.offsets;
    b.w1 = f.w1;
    b.w2 = f.w2;
    b.dy = dy.view();
    b.dx = dxg.view();
    b.dw1 = dw1.view();
    b.dw2 = dw2.view();
    MOEKIT_REQUIRE_OK(experts.run(moekit_experts_backward, b));
    CUDA_REQUIRE(cudaDeviceSynchronize());

    const std::vector<int64_t> rows = as_segments(r.offsets);
    device_combine_pairs(y.data(), kBf16, static_cast<const int32_t*>(r.d_grouped_pos.data()),
                         static_cast<const float*>(r.scores.data()), kTokens, K, H, kBf16, out.data());
    require_close_device(out.data(), kBf16, r.out.data(), kBf16, kTokens, H, {}, kBf16, "y combined vs layer out");
    require_close_device(y.data(), kBf16, o.y.data(), MOEKIT_DTYPE_FP32, P, H, rows, kBf16, "y vs oracle");
    require_close_device(dxg.data(), kBf16, o.dxe.data(), MOEKIT_DTYPE_FP32, P, H, rows, kBf16,
                         "grouped dx vs oracle dxe");
    require_close_device(dw1.data(), kBf16, r.dw1.data(), kBf16, E * 2 * I, H, blocks_of(E, 2 * I), kBf16,
                         "dW1 vs layer");
    require_close_device(dw2.data(), kBf16, r.dw2.data(), kBf16, E * H, I, blocks_of(E, H), kBf16, "dW2 vs layer");
  });
}
