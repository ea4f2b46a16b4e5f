#pragma once
// Helpers shared by the GPT example's tests: engine-like binding of the model's parameters and
// deterministic test data.
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "gpt.hpp"

namespace gpt_test {

/// Owns the storage an engine would own: parameters in visiting order in one buffer. With
/// `odd_offsets`, each parameter starts at an odd element offset with at least one unused float before
/// it, so no parameter is 8-, 16- or 64-byte aligned and a write outside a view lands in a gap.
struct FlatStorage {
  std::vector<float> values, grads;
  std::vector<std::size_t> offsets;

  explicit FlatStorage(gpt::Gpt& model, bool odd_offsets = false) {
    std::size_t end = 0;
    model.parameters([&](std::string_view, gpt::Param& p) {
      if (odd_offsets) end += (end % 2 == 0) ? 1 : 2;
      offsets.push_back(end);
      end += p.numel();
    });
    values.assign(end, 0.0f);
    grads.assign(end, 0.0f);
    std::size_t i = 0;
    model.parameters([&](std::string_view, gpt::Param& p) {
      p.bind(values.data() + offsets[i], grads.data() + offsets[i]);
      ++i;
    });
  }
  void zero_grad() { std::fill(grads.begin(), grads.end(), 0.0f); }
};

/// Binds each parameter to its own vector (naturally aligned, no shared buffer).
struct SeparateStorage {
  std::vector<std::vector<float>> values, grads;
  explicit SeparateStorage(gpt::Gpt& model) {
    model.parameters([&](std::string_view, gpt::Param& p) {
      values.emplace_back(p.numel(), 0.0f);
      grads.emplace_back(p.numel(), 0.0f);
      p.bind(values.back().data(), grads.back().data());
    });
  }
};

/// Values far from a trained model's but exercising every path: weights normal(0, 0.5), LayerNorm
/// gains 1 + normal(0, 0.3), biases normal(0, 0.3). Large weights make every layer's gradient
/// sizeable, so finite differences measure it well above rounding noise.
inline void fill_test_values(gpt::Gpt& model, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  model.parameters([&](std::string_view name, gpt::Param& p) {
    const bool gain = name.find("ln") != std::string_view::npos && name.ends_with(".weight");
    const bool bias = name.ends_with(".bias");
    for (std::size_t i = 0; i < p.numel(); ++i) {
      const float z = normal(rng);
      p.data()[i] = gain ? 1.0f + 0.3f * z : (bias ? 0.3f * z : 0.5f * z);
    }
  });
}

/// A batch of random tokens; every `ignore_every`-th target (if > 0) takes no loss.
inline gpt::Batch random_batch(int batch, int seq, int vocab, std::uint32_t seed, int ignore_every = 0) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> token(0, vocab - 1);
  gpt::Batch b;
  b.resize(batch, seq);
  for (std::size_t i = 0; i < b.tokens.size(); ++i) {
    b.tokens[i] = token(rng);
    b.targets[i] = (ignore_every > 0 && i % static_cast<std::size_t>(ignore_every) == 0) ? gpt::Batch::kIgnore : token(rng);
  }
  return b;
}

/// The tiny configuration of the gradient check: vocab 5, d 8, 2 heads, 2 layers, context 4.
inline gpt::Config tiny_config(bool tied) {
  gpt::Config c;
  c.vocab_size = 5;
  c.context = 4;
  c.d_model = 8;
  c.n_heads = 2;
  c.n_layers = 2;
  c.tied_head = tied;
  return c;
}

}  // namespace gpt_test
