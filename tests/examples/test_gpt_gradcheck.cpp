// Gradient check of the GPT example's hand-written backward against central finite differences of its
// own forward, for every parameter tensor, on the tiny configuration (vocab 5, d 8, 2 heads, 2 layers,
// seq 4, batch 2), untied and tied head.
//
// Why float finite differences suffice, and the tolerance: the loss is O(1) and computed in float, so
// two evaluations carry rounding noise of a few ulp(1) ~ 1e-7 .. 1e-6. Central differences with one
// Richardson step, D = (4 D(h/2) - D(h)) / 3 with h = 1e-2, have truncation error O(h^4) ~ 1e-8 and turn
// the noise into at most ~3 * 1e-6 / h = 3e-4. The test values (weights ~0.5, see gpt_test_util.hpp)
// make gradients O(1e-2 .. 1), well above that. Measured: the largest |fd - analytic| over all sampled
// elements is about 1e-4. An element passes when |fd - analytic| <= 1e-3 + 1e-2 |analytic|: 10x above
// the measured noise, while a wrong backward term (a missing residual, a dropped 1/sqrt(hd), a dropped
// softmax or LayerNorm term) is off by O(|analytic|) and fails; each of those was tried.
// A directional derivative over the whole tensor (random +-1 direction) covers the unsampled elements.
// The gradient storage starts with random values, not zeros, so a backward that overwrites instead of
// accumulating (say the tied head's d(wte) written with = before the embedding adds its part) fails too.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpt.hpp"
#include "gpt_test_util.hpp"

namespace test_gpt_gradcheck {  // the file's own names, apart from its suite's other files in a unity build

namespace {

constexpr double kStep = 1e-2;
constexpr double kAbsTol = 1e-3;
constexpr double kRelTol = 1e-2;

// Loss as a function of one float, through the real float forward.
double loss_with(gpt::Gpt& model, const gpt::Batch& batch, float* x, float value) {
  const float saved = *x;
  *x = value;
  const double loss = model.forward(batch);
  *x = saved;
  return loss;
}

// d(loss)/dx by central differences with one Richardson step.
double numeric_derivative(gpt::Gpt& model, const gpt::Batch& batch, float* x) {
  auto central = [&](double h) {
    const auto plus = static_cast<float>(*x + h), minus = static_cast<float>(*x - h);
    return (loss_with(model, batch, x, plus) - loss_with(model, batch, x, minus)) /
           (static_cast<double>(plus) - static_cast<double>(minus));
  };
  return (4.0 * central(kStep / 2) - central(kStep)) / 3.0;
}

// Directional derivative along d (all elements of p moved at once).
double numeric_directional(gpt::Gpt& model, const gpt::Batch& batch, gpt::Param& p, const std::vector<float>& d) {
  std::vector<float> saved(p.data(), p.data() + p.numel());
  auto at = [&](double t) {
    for (std::size_t i = 0; i < p.numel(); ++i) p.data()[i] = static_cast<float>(saved[i] + t * d[i]);
    return static_cast<double>(model.forward(batch));
  };
  auto central = [&](double h) { return (at(h) - at(-h)) / (2 * h); };
  const double result = (4.0 * central(kStep / 2) - central(kStep)) / 3.0;
  std::copy(saved.begin(), saved.end(), p.data());
  return result;
}

void gradient_check(bool tied) {
  gpt::Gpt model(gpt_test::tiny_config(tied));
  gpt_test::FlatStorage storage(model);
  gpt_test::fill_test_values(model, tied ? 11u : 7u);
  // Every 5th target ignored: the ignore path must contribute nothing, and the mean's denominator
  // must count only targeted positions.
  const gpt::Batch batch = gpt_test::random_batch(2, 4, 5, 3, /*ignore_every=*/5);

  std::mt19937 rng(99);
  std::normal_distribution<float> normal;
  for (float& g : storage.grads) g = normal(rng);
  const std::vector<float> before = storage.grads;
  const float loss = model.train_step(batch);
  for (std::size_t i = 0; i < before.size(); ++i) storage.grads[i] -= before[i];  // d(loss) alone
  REQUIRE(std::isfinite(loss));
  REQUIRE(model.targeted_positions() == 6);  // 8 positions, indices 0 and 5 ignored

  std::size_t tensors = 0;
  double max_err = 0;
  model.parameters([&](std::string_view name, gpt::Param& p) {
    ++tensors;
    CAPTURE(std::string(name));
    // Sample: first, last, and up to 6 random elements.
    std::vector<std::size_t> picks = {0, p.numel() - 1};
    std::uniform_int_distribution<std::size_t> any(0, p.numel() - 1);
    for (int k = 0; k < 6; ++k) picks.push_back(any(rng));
    for (std::size_t i : picks) {
      CAPTURE(i);
      const double analytic = p.grad()[i];
      const double numeric = numeric_derivative(model, batch, p.data() + i);
      const double err = std::abs(numeric - analytic);
      max_err = std::max(max_err, err);
      CHECK(err <= kAbsTol + kRelTol * std::abs(analytic));
    }
    std::vector<float> d(p.numel());
    std::bernoulli_distribution coin(0.5);
    double analytic = 0;
    for (std::size_t i = 0; i < p.numel(); ++i) {
      d[i] = coin(rng) ? 1.0f : -1.0f;
      analytic += static_cast<double>(d[i]) * p.grad()[i];
    }
    const double numeric = numeric_directional(model, batch, p, d);
    CHECK(std::abs(numeric - analytic) <= kAbsTol + kRelTol * std::abs(analytic));
  });
  // wte, wpe, 13 per block, ln_f weight and bias, and head.weight unless tied.
  CHECK(tensors == (tied ? 28u : 29u));
  MESSAGE("largest |fd - analytic| of a sampled element: " << max_err);
}

}  // namespace

TEST_CASE("gpt gradient check: untied head, every parameter tensor") { gradient_check(false); }

TEST_CASE("gpt gradient check: tied head (wte gets the head's and the embedding's gradient)") {
  gradient_check(true);
}

}  // namespace test_gpt_gradcheck
