// examples/05_any_engine/mlp.hpp: the user's own model for the example: fp32 Dense layers (zerotk::
// Param: the engine owns the storage), a fixed "teacher" function to regress, and the MSE loss.
#pragma once
#include <cmath>
#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include <zerotk/core/param.hpp>

namespace demo {

struct Dense {
  int in, out;
  bool relu;
  zerotk::Param<float> w, b;
  std::vector<float> x_, z_;
  Dense(const std::string& name, int in_, int out_, bool relu_)
      : in(in_), out(out_), relu(relu_), w(name + ".weight", {std::size_t(out_), std::size_t(in_)}),
        b(name + ".bias", {std::size_t(out_)}) {}
  template <class Visit>
  void parameters(Visit&& visit) {
    visit(w.name(), w);
    visit(b.name(), b);
  }
  std::vector<float> forward(const std::vector<float>& x) {
    const std::size_t batch = x.size() / std::size_t(in);
    x_ = x;
    z_.assign(batch * std::size_t(out), 0.0f);
    std::vector<float> y(z_.size());
    for (std::size_t n = 0; n < batch; ++n)
      for (int o = 0; o < out; ++o) {
        float s = b.data()[o];
        for (int i = 0; i < in; ++i) s += x[n * std::size_t(in) + std::size_t(i)] * w.data()[o * in + i];
        z_[n * std::size_t(out) + std::size_t(o)] = s;
        y[n * std::size_t(out) + std::size_t(o)] = relu && s < 0 ? 0.0f : s;
      }
    return y;
  }
  std::vector<float> backward(const std::vector<float>& dy) {
    const std::size_t batch = dy.size() / std::size_t(out);
    std::vector<float> dx(batch * std::size_t(in), 0.0f);
    for (std::size_t n = 0; n < batch; ++n)
      for (int o = 0; o < out; ++o) {
        const std::size_t k = n * std::size_t(out) + std::size_t(o);
        const float dz = relu && z_[k] < 0 ? 0.0f : dy[k];
        b.grad()[o] += dz;
        for (int i = 0; i < in; ++i) {
          w.grad()[o * in + i] += dz * x_[n * std::size_t(in) + std::size_t(i)];
          dx[n * std::size_t(in) + std::size_t(i)] += dz * w.data()[o * in + i];
        }
      }
    return dx;
  }
};

struct Mlp {
  std::vector<Dense> layers;
  Mlp() {
    layers.emplace_back("fc0", 16, 64, true);
    layers.emplace_back("fc1", 64, 4, false);
  }
  /// He-normal weights, zero biases. A zerotk::Param holds no values until the engine binds it:
  /// call this inside engine.gather(model, 0), then engine.initialize_master().
  void init() {
    std::mt19937 rng(1);
    for (auto& l : layers) {
      std::normal_distribution<float> nd(0.0f, std::sqrt(2.0f / float(l.in)));
      for (auto& v : l.w.values()) v = nd(rng);
    }
  }
  template <class Visit>
  void parameters(Visit&& visit) {
    for (auto& l : layers) l.parameters(visit);
  }
};

struct Batch {
  std::vector<float> x, t;
};

/// Rank `rank`'s micro-batch of 32 at `step`: random inputs and the teacher's outputs.
inline Batch batch(int step, int rank) {
  std::mt19937 rng(unsigned(1000 * step + rank));
  std::normal_distribution<float> nd;
  Batch b;
  b.x.resize(32 * 16);
  for (auto& v : b.x) v = nd(rng);
  b.t.resize(32 * 4);
  for (std::size_t n = 0; n < 32; ++n)
    for (std::size_t o = 0; o < 4; ++o) {
      float s = 0;
      for (std::size_t i = 0; i < 16; ++i) s += std::sin(0.37f * float((o + 1) * (i + 3))) * b.x[n * 16 + i];
      b.t[n * 4 + o] = std::tanh(s);
    }
  return b;
}

/// 0.5 * mean squared error over the batch; dy = its gradient times `seed` (the loss scale).
inline double mse(const std::vector<float>& y, const std::vector<float>& t, double seed, std::vector<float>& dy) {
  const double batch = double(y.size()) / 4;
  double loss = 0;
  dy.resize(y.size());
  for (std::size_t k = 0; k < y.size(); ++k) {
    const double d = double(y[k]) - double(t[k]);
    loss += 0.5 * d * d / batch;
    dy[k] = float(d / batch * seed);
  }
  return loss;
}

}  // namespace demo
