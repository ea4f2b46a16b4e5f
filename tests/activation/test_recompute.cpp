// Recompute<L> on a small stochastic layer whose forward and backward are known in closed form:
// gradients equal those of the plain layer (the random state is restored for the recompute), a chain
// hands outputs over instead of copying, errors name the layer and the values, and the meter and the
// ledger see every byte held.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "zerotk/activation.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/param.hpp"

namespace {

namespace act = zerotk::activation;
using Vec = std::vector<float>;

// y[i] = (w + n[i]) x[i] with n[i] drawn from the layer's own generator (multiplicative noise, a
// stand-in for dropout); keeps x and n for backward: dw += sum dy[i] x[i], dx[i] = (w + n[i]) dy[i], so a
// recompute that drew other noise would give other gradients. `grow` makes each forward one longer
// (a layer whose shapes are not deterministic).
struct Noisy {
  using input_type = Vec;
  using output_type = Vec;
  zerotk::Param<float> w{"w", {1}};
  std::uint64_t state = 12345;
  bool grow = false;
  int forwards = 0;
  Vec x_, n_, y_, dx_;

  template <class Visit>
  void parameters(Visit&& visit) {
    visit(w.name(), w);
  }
  float draw() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(state >> 40) * 1e-7f;
  }
  const Vec& forward(const Vec& x) {
    ++forwards;
    x_ = x;
    const std::size_t n = x.size() + (grow ? static_cast<std::size_t>(forwards) : 0);
    n_.resize(n);
    y_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      n_[i] = draw();
      y_[i] = (w.data()[0] + n_[i]) * x[i % x.size()];
    }
    return y_;
  }
  const Vec& backward(const Vec& dy) {
    dx_.resize(x_.size());
    for (std::size_t i = 0; i < x_.size(); ++i) {
      w.grad()[0] += dy[i] * x_[i];
      dx_[i] = (w.data()[0] + n_[i]) * dy[i];
    }
    return dx_;
  }
  void release_activations() {
    x_ = Vec();
    n_ = Vec();
    y_ = Vec();
    dx_ = Vec();
  }
  std::size_t activation_bytes() const { return (x_.size() + n_.size() + y_.size() + dx_.size()) * sizeof(float); }
  std::uint64_t rng_state() const { return state; }
  void set_rng_state(std::uint64_t s) { state = s; }
};
static_assert(zerotk::Recomputable<Noisy>);
static_assert(zerotk::HasRngState<Noisy>);
static_assert(zerotk::HasActivationBytes<Noisy>);

struct Stack {
  float w[3] = {0.5f, -1.25f, 2.0f};
  float g[3] = {};
  Noisy layers[3];
  Stack() {
    for (int i = 0; i < 3; ++i) layers[i].w.bind(&w[i], &g[i]);
  }
};

const Vec kInput = {1.0f, -2.0f, 3.0f, 0.25f, 7.0f};
const Vec kGradOut = {0.5f, 1.0f, -1.0f, 2.0f, 0.125f};

// Forward through three layers, backward from kGradOut; returns dx and the loss-like output sum.
struct Result {
  Vec out, dx;
  float g[3];
};

Result plain_run() {
  Stack s;
  const Vec* x = &kInput;
  for (auto& l : s.layers) x = &l.forward(*x);
  Result r{*x, {}, {}};
  const Vec* d = &kGradOut;
  for (int i = 2; i >= 0; --i) d = &s.layers[i].backward(*d);
  r.dx = *d;
  for (int i = 0; i < 3; ++i) r.g[i] = s.g[i];
  return r;
}

}  // namespace

TEST_CASE("Recompute: gradients equal the plain layer's, random state restored for the recompute") {
  const Result want = plain_run();
  const std::size_t t = kInput.size() * sizeof(float);
  for (int mode = 0; mode < 4; ++mode) {
    CAPTURE(mode);
    act::Options o;
    o.contiguous_memory = mode == 1 || mode == 3;
    o.number_checkpoints = 3;
    o.cpu_checkpointing = mode >= 2;
    zerotk::MemoryLedger ledger;
    act::Meter meter(&ledger);
    act::Checkpointing ckpt(o, &meter);
    Stack s;
    {
      zerotk::Recompute<Noisy> r0(s.layers[0], ckpt, "l0"), r1(s.layers[1], ckpt, "l1"), r2(s.layers[2], ckpt, "l2");
      zerotk::Recompute<Noisy>* rs[3] = {&r0, &r1, &r2};
      for (int step = 0; step < 2; ++step) {  // the second step reuses buffers
        for (int i = 0; i < 3; ++i) {  // the plain run's starting point
          s.layers[i].state = 12345;
          s.g[i] = 0.0f;
        }
        const Vec* x = &kInput;
        for (auto* r : rs) x = &r->forward(*x);
        CHECK(*x == want.out);
        CHECK(ckpt.saved_count() == 3);
        for (auto& l : s.layers) CHECK(l.activation_bytes() == 0);  // released after forward
        const std::uint64_t after_forward = s.layers[1].state;
        // saved inputs: in pinned host memory with cpu_checkpointing (3 buffers, or the 3-slot arena)
        const std::size_t pinned = ledger.live(zerotk::MemorySpace::pinned_host, zerotk::MemoryCategory::activations);
        CHECK(pinned == (o.cpu_checkpointing ? (o.contiguous_memory ? 3 * act::Arena::kSlotAlignment : 3 * t) : 0));
        const Vec* d = &kGradOut;
        for (int i = 2; i >= 0; --i) d = &rs[i]->backward(*d);
        CHECK(*d == want.dx);
        CHECK(ckpt.saved_count() == 0);
        for (int i = 0; i < 3; ++i) CHECK(s.g[i] == want.g[i]);
        CHECK(s.layers[1].state == after_forward);  // the recompute's draws were undone
        CHECK(s.layers[0].forwards == 2 * (step + 1));
        for (auto* r : rs) CHECK_FALSE(r->holds_saved_input());
      }
    }
    // the Recomputes are gone; only the arena (owned by the Checkpointing) is still counted
    CHECK(ledger.live(zerotk::MemoryCategory::activations) == (o.contiguous_memory ? 3 * act::Arena::kSlotAlignment : 0));
  }
}

TEST_CASE("Recompute: a chain takes the output over as the next layer's input (one tensor per layer)") {
  zerotk::MemoryLedger ledger;
  act::Meter meter(&ledger);
  act::Checkpointing ckpt({}, &meter);
  Stack s;
  zerotk::Recompute<Noisy> r0(s.layers[0], ckpt, "l0"), r1(s.layers[1], ckpt, "l1"), r2(s.layers[2], ckpt, "l2");
  const std::size_t t = kInput.size() * sizeof(float);
  const auto live = [&] { return ledger.live(zerotk::MemoryCategory::activations); };
  const Vec& y0 = r0.forward(kInput);
  CHECK(r0.held_bytes() == 2 * t);  // its input copy and its output
  const Vec& y1 = r1.forward(y0);
  CHECK(r0.held_bytes() == t);      // the output went to r1
  CHECK(r1.held_bytes() == 2 * t);  // r0's output object, now r1's saved input, and r1's output
  const Vec& y2 = r2.forward(y1);
  CHECK(live() == 4 * t);  // three saved inputs and the last output; the layers hold nothing
  const Vec& d2 = r2.backward(kGradOut);
  CHECK(live() == 3 * t);  // r2: output and input gone, its input gradient kept
  const Vec& d1 = r1.backward(d2);
  CHECK(live() == 2 * t);  // r2's gradient freed once r1 used it
  (void)r0.backward(d1);
  CHECK(live() == t);  // the bottom gradient is the caller's to use
  (void)y2;
}

TEST_CASE("Recompute: errors name the layer and the values") {
  act::Checkpointing ckpt;
  Stack s;
  zerotk::Recompute<Noisy> r(s.layers[0], ckpt, "blocks.7");
  SUBCASE("backward without forward") {
    CHECK_THROWS_AS((void)r.backward(kGradOut), zerotk::usage_error);
    try {
      (void)r.backward(kGradOut);
    } catch (const zerotk::usage_error& e) {
      CHECK(e.where() == "Recompute blocks.7");
    }
  }
  SUBCASE("a recompute whose output shape differs") {
    s.layers[0].grow = true;
    (void)r.forward(kInput);
    try {
      (void)r.backward(kGradOut);
      FAIL("expected an error");
    } catch (const zerotk::usage_error& e) {
      CHECK(e.where() == "Recompute blocks.7");
      CHECK(std::string(e.what()).find("[6]") != std::string::npos);  // the forward's shape
      CHECK(e.value() == "[7]");                                       // the recompute's
    }
    CHECK(s.layers[0].activation_bytes() == 0);  // nothing left held
  }
}

TEST_CASE("Recompute: the contiguous arena refuses more saved inputs than number_checkpoints, and larger ones") {
  act::Options o;
  o.contiguous_memory = true;
  o.number_checkpoints = 2;
  act::Checkpointing ckpt(o, nullptr);
  Stack s;
  zerotk::Recompute<Noisy> r0(s.layers[0], ckpt, "l0"), r1(s.layers[1], ckpt, "l1"), r2(s.layers[2], ckpt, "l2");
  const Vec& y0 = r0.forward(kInput);
  const Vec& y1 = r1.forward(y0);
  try {
    (void)r2.forward(y1);
    FAIL("expected an error");
  } catch (const zerotk::usage_error& e) {
    CHECK(e.where() == "activation_checkpointing.number_checkpoints");
    CHECK(e.value() == "2");
  }
  (void)r1.backward(kGradOut);  // frees a slot
  const Vec big(1000, 1.0f);
  try {
    (void)r1.forward(big);
    FAIL("expected an error");
  } catch (const zerotk::usage_error& e) {
    CHECK(e.where() == "activation_checkpointing.contiguous_memory_optimization");
    CHECK(e.value() == "4000 bytes");
  }
  CHECK_FALSE(r1.holds_saved_input());
  act::Options bad;
  bad.contiguous_memory = true;  // without number_checkpoints
  CHECK_THROWS_AS(act::Checkpointing{bad}, zerotk::config_error);
}
