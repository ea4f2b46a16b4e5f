#pragma once
// The serial reference of the 1-bit compressed all-reduce (DeepSpeed's worker/server error-feedback
// algorithm, SEMANTICS.md section 9), shared by the all-reduce's tests (tests/compress) and 1-bit
// Adam's engine tests (tests/engine).
#include <cmath>
#include <cstddef>
#include <vector>

#include "zerotk/kernels/host/reduce.hpp"

namespace zerotk::test {

/// The serial reference: W ranks' state in one place, signs as +-1 floats (no packing, no
/// exchange). Only the sum of squares is shared with the library (kernels' reproducible one, whose
/// bits depend on the multiset of values alone).
struct OneBitReference {
  int w;
  std::size_t n, padded, chunk;
  std::vector<std::vector<float>> worker_error;  // [W][padded]
  std::vector<std::vector<float>> server_error;  // [W][chunk]

  OneBitReference(std::size_t n_, int w_) : w(w_), n(n_) {
    // DeepSpeed: divider = lcm(W, 8); corrected size = n rounded up to a multiple of W * divider.
    const std::size_t uw = static_cast<std::size_t>(w);
    std::size_t lcm = 8;
    while (lcm % uw != 0) lcm += 8;
    const std::size_t unit = uw * lcm;
    padded = n % unit == 0 ? n : n + (unit - n % unit);
    chunk = padded / uw;
    worker_error.assign(uw, std::vector<float>(padded, 0.0f));
    server_error.assign(uw, std::vector<float>(chunk, 0.0f));
  }

  static float rms(const std::vector<float>& v) {
    if (v.empty()) return 0.0f;
    return static_cast<float>(std::sqrt(zerotk::kernels::host::sum_squares(v.data(), v.size()) / static_cast<double>(v.size())));
  }
  static float sgn(float v) { return v >= 0.0f ? 1.0f : -1.0f; }

  /// One all-reduce of inputs [W][n]; returns the common output [n].
  std::vector<float> step(const std::vector<std::vector<float>>& x) {
    const std::size_t uw = static_cast<std::size_t>(w);
    std::vector<std::vector<float>> signs(uw, std::vector<float>(padded));
    std::vector<float> scale(uw);
    for (std::size_t k = 0; k < uw; ++k) {
      std::vector<float> y(padded);
      for (std::size_t i = 0; i < padded; ++i) y[i] = (i < n ? x[k][i] : 0.0f) + worker_error[k][i];
      scale[k] = rms(y);
      for (std::size_t i = 0; i < padded; ++i) {
        signs[k][i] = sgn(y[i]);
        worker_error[k][i] = y[i] - scale[k] * signs[k][i];
      }
    }
    std::vector<float> full(padded);
    const float inv_w = static_cast<float>(1.0 / static_cast<double>(w));
    for (std::size_t r = 0; r < uw; ++r) {
      std::vector<float> z(chunk);
      for (std::size_t j = 0; j < chunk; ++j) {
        float acc = signs[0][r * chunk + j] * (scale[0] * inv_w);
        for (std::size_t k = 1; k < uw; ++k) acc += signs[k][r * chunk + j] * (scale[k] * inv_w);
        z[j] = acc + server_error[r][j];
      }
      const float s2 = rms(z);
      for (std::size_t j = 0; j < chunk; ++j) {
        server_error[r][j] = z[j] - s2 * sgn(z[j]);
        full[r * chunk + j] = s2 * sgn(z[j]);
      }
    }
    full.resize(n);
    return full;
  }
};

}  // namespace zerotk::test
