// The aux-loss-free load-balance update (docs/math.md section 7) through the C ABI on the reference backend, against
// the scalar formula: the ema, the strict thresholds at half and twice the target, and the clamp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/test_util.h"

using moekit_test::HostTensor;
using moekit_test::ReferenceHandle;

namespace {

struct Update {
  double tokens, momentum, gamma, bias_max;
  int64_t top_groups;
};

void run_update(moekit_handle_t handle, const Update& u, HostTensor& counts, HostTensor& ema, HostTensor& bias) {
  moekit_load_balance_args_t args;
  moekit_load_balance_args_init(&args);
  args.counts = counts.view();
  args.ema = ema.view();
  args.bias = bias.view();
  args.tokens = u.tokens;
  args.top_groups = u.top_groups;
  args.momentum = u.momentum;
  args.gamma = u.gamma;
  args.bias_max = u.bias_max;
  MOEKIT_REQUIRE_OK(moekit_load_balance_update(handle, &args, nullptr));
}

}  // namespace

TEST_CASE("load-balance update follows the scalar formula for every counts dtype", "[load_balance]") {
  ReferenceHandle h;
  std::mt19937_64 rng(1618);
  const int64_t NG = 16;
  const Update u{256.0, 0.9, 0.01, 0.05, 4};  // target = 4/16 = 0.25
  for (moekit_dtype_t count_dtype : {MOEKIT_DTYPE_INT32, MOEKIT_DTYPE_INT64, MOEKIT_DTYPE_FP32}) {
    INFO("counts dtype " << count_dtype);
    HostTensor counts(count_dtype, {NG}), ema(MOEKIT_DTYPE_FP32, {NG}), bias(MOEKIT_DTYPE_FP32, {NG});
    // Frequencies from starved (0) to flooded (~1); biases near the clamp so that some steps hit it.
    std::uniform_int_distribution<int64_t> count(0, 256);
    for (int64_t g = 0; g < NG; ++g) counts.set(g, static_cast<double>(count(rng)));
    std::uniform_real_distribution<double> ema_value(0.0, 0.8), bias_value(-0.05, 0.05);
    for (int64_t g = 0; g < NG; ++g) {
      ema.set(g, ema_value(rng));
      bias.set(g, bias_value(rng));
    }
    std::vector<double> c = counts.values(), e = ema.values(), b = bias.values();
    run_update(h.handle, u, counts, ema, bias);

    double target = static_cast<double>(u.top_groups) / NG;
    int moved = 0;
    for (int64_t g = 0; g < NG; ++g) {
      size_t i = static_cast<size_t>(g);
      double new_ema = u.momentum * e[i] + (1 - u.momentum) * c[i] / u.tokens;
      double step = new_ema < 0.5 * target ? u.gamma : new_ema > 2 * target ? -u.gamma : 0.0;
      moved += step != 0;
      double new_bias = std::min(u.bias_max, std::max(-u.bias_max, b[i] + step));
      INFO("group " << g << ": ema " << e[i] << " -> " << new_ema << ", bias " << b[i] << " -> " << new_bias);
      REQUIRE(ema.get(g) == Approx(new_ema).margin(1e-6));
      REQUIRE(bias.get(g) == Approx(new_bias).margin(1e-6));
      REQUIRE(std::fabs(bias.get(g)) <= u.bias_max + 1e-7);
    }
    REQUIRE(moved > 0);  // the draw must exercise the update, not only the dead band
  }
}

TEST_CASE("load-balance thresholds are strict and the bias is clamped", "[load_balance]") {
  ReferenceHandle h;
  const int64_t NG = 8;
  // momentum 0 makes ema = freq exactly; target = 2/8 = 0.25, half = 0.125 (16 of 128 tokens), twice = 0.5 (64).
  const Update u{128.0, 0.0, 0.125, 0.5, 2};
  HostTensor counts(MOEKIT_DTYPE_INT32, {NG}), ema(MOEKIT_DTYPE_FP32, {NG}), bias(MOEKIT_DTYPE_FP32, {NG});
  counts.set_values({16, 15, 64, 65, 32, 0, 128, 16});
  ema.set_values({0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3});
  bias.set_values({0.25, 0.25, 0.25, 0.25, 0.25, 0.4375, -0.4375, -0.5});
  run_update(h.handle, u, counts, ema, bias);
  const std::vector<double> want_ema = {0.125, 15.0 / 128, 0.5, 65.0 / 128, 0.25, 0.0, 1.0, 0.125};
  const std::vector<double> want_bias = {
      0.25,    // exactly half the target: strict, no step
      0.375,   // below half: bias up
      0.25,    // exactly twice: no step
      0.125,   // above twice: bias down
      0.25,    // on target
      0.5,     // starved near the top: clamped to bias_max
      -0.5,    // flooded near the bottom: clamped to -bias_max
      -0.5,    // at the bound, exactly half: unchanged
  };
  for (int64_t g = 0; g < NG; ++g) {
    INFO("group " << g);
    REQUIRE(ema.get(g) == static_cast<double>(static_cast<float>(want_ema[static_cast<size_t>(g)])));
    REQUIRE(bias.get(g) == want_bias[static_cast<size_t>(g)]);
  }
}
