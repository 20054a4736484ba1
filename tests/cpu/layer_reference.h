// Plain-loop references for the layer tests (test_moe_layer.cpp, test_experts_layer.cpp): one expert's MLP on one
// row, forward and backward, in float64 with the rounding points of docs/math.md section 8, written row by row with no
// grouping, packing or blocking. The activation itself comes from the library (reference/activation.h): it is
// checked on its own against an independent implementation in test_grouped_gemm.cpp.
//
// Also: comparison helpers. The library and these loops do the same math with the same rounding points but sum
// in a slightly different way (a fused multiply-add chain vs products then sums), so a value may land on the
// other side of a storage-dtype rounding boundary in rare places; everything else must match exactly.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "moekit/moekit.h"
#include "src/numeric.h"
#include "src/reference/activation.h"

namespace layer_test {

struct ExpertRef {
  int64_t hidden, inter;
  int32_t activation, glu_layout;
  double glu_limit;
  int32_t dtype;
  const std::vector<double>* w1;  // [E, hw, H]
  const std::vector<double>* b1;  // [E, hw] or nullptr
  const std::vector<double>* w2;  // [E, H, I]
  const std::vector<double>* b2;  // [E, H] or nullptr

  moekit::ref::ActivationSpec act() const { return {activation, glu_layout, glu_limit, inter}; }
  int64_t hw() const { return moekit::ref::h_width(act()); }
  double round(double v) const { return moekit::round_to(v, dtype); }

  // h = round(x W1[e]^T + b1[e]); a = round(act(h)); y = round(a W2[e]^T + b2[e]).
  void forward(int64_t e, const double* x, std::vector<double>& h, std::vector<double>& a,
               std::vector<double>& y) const {
    h.assign(static_cast<size_t>(hw()), 0.0);
    for (int64_t j = 0; j < hw(); ++j) {
      double sum = 0;
      for (int64_t k = 0; k < hidden; ++k) sum += x[k] * (*w1)[static_cast<size_t>((e * hw() + j) * hidden + k)];
      if (b1) sum += (*b1)[static_cast<size_t>(e * hw() + j)];
      h[static_cast<size_t>(j)] = round(sum);
    }
    a.assign(static_cast<size_t>(inter), 0.0);
    moekit::ref::activation_forward(act(), h.data(), a.data());
    for (double& v : a) v = round(v);
    y.assign(static_cast<size_t>(hidden), 0.0);
    for (int64_t j = 0; j < hidden; ++j) {
      double sum = 0;
      for (int64_t i = 0; i < inter; ++i)
        sum += a[static_cast<size_t>(i)] * (*w2)[static_cast<size_t>((e * hidden + j) * inter + i)];
      if (b2) sum += (*b2)[static_cast<size_t>(e * hidden + j)];
      y[static_cast<size_t>(j)] = round(sum);
    }
  }

  // From the stored (rounded) h and the row of dout, with scale s:
  //   dA = dout W2[e] (never rounded); ds = dA . act(h); dh = round(dact(h, s dA)); a_scaled = round(s act(h));
  //   dxe = dh W1[e] (unrounded; the caller rounds where its layer stores it).
  void backward(int64_t e, const std::vector<double>& h, const double* dout, double s, double& ds,
                std::vector<double>& dh, std::vector<double>& a_scaled, std::vector<double>& dxe) const {
    std::vector<double> da(static_cast<size_t>(inter)), a(static_cast<size_t>(inter));
    moekit::ref::activation_forward(act(), h.data(), a.data());
    ds = 0;
    for (int64_t i = 0; i < inter; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < hidden; ++j) sum += dout[j] * (*w2)[static_cast<size_t>((e * hidden + j) * inter + i)];
      ds += sum * a[static_cast<size_t>(i)];
      da[static_cast<size_t>(i)] = s * sum;
    }
    dh.assign(static_cast<size_t>(hw()), 0.0);
    moekit::ref::activation_backward(act(), h.data(), da.data(), dh.data());
    for (double& v : dh) v = round(v);
    a_scaled.assign(static_cast<size_t>(inter), 0.0);
    for (int64_t i = 0; i < inter; ++i) a_scaled[static_cast<size_t>(i)] = round(s * a[static_cast<size_t>(i)]);
    dxe.assign(static_cast<size_t>(hidden), 0.0);
    for (int64_t k = 0; k < hidden; ++k) {
      double sum = 0;
      for (int64_t j = 0; j < hw(); ++j)
        sum += dh[static_cast<size_t>(j)] * (*w1)[static_cast<size_t>((e * hw() + j) * hidden + k)];
      dxe[static_cast<size_t>(k)] = sum;
    }
  }
};

inline double rms(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x * x;
  return v.empty() ? 0.0 : std::sqrt(sum / static_cast<double>(v.size()));
}

// got equals ref up to the summation-order effects described above: float64 within 1e-10 of the scale; a storage
// dtype within one unit in the last place, with at most 1% of the elements (and at least one allowed) not exact.
inline void require_matches(const std::vector<double>& got, const std::vector<double>& ref, int32_t dtype,
                            const char* what) {
  REQUIRE(got.size() == ref.size());
  double scale = rms(ref);
  INFO(what << ": " << got.size() << " elements, rms " << scale);
  REQUIRE(scale > 0);
  size_t inexact = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(what << "[" << i << "] = " << got[i] << ", expected " << ref[i]);
    REQUIRE(!std::isnan(got[i]));
    if (dtype == MOEKIT_DTYPE_FP64) {
      REQUIRE(std::abs(got[i] - ref[i]) <= 1e-10 * (std::abs(ref[i]) + scale));
      continue;
    }
    double ulp = dtype == MOEKIT_DTYPE_BF16 ? 1.0 / 128 : (dtype == MOEKIT_DTYPE_FP16 ? 1.0 / 1024 : 1e-6);
    REQUIRE(std::abs(got[i] - ref[i]) <= ulp * std::abs(ref[i]) + 1e-3 * ulp * scale);
    if (got[i] != ref[i]) ++inexact;
  }
  INFO(what << ": " << inexact << " elements not exact");
  REQUIRE(inexact <= 1 + got.size() / 100);
}

}  // namespace layer_test
