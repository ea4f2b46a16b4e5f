// The GPT example's model against the contract the zerotk Engine relies on: forward equal to an
// independent double-precision reference, causality, parameters as views into one flat buffer at odd
// offsets, gradient accumulation and loss scaling, per-layer scopes that bind parameters only while a
// layer runs (the ZeRO-3 shape), parameter naming and initialisation.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <numbers>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <zerotk/core/error.hpp>

#include "gpt.hpp"
#include "gpt_test_util.hpp"

namespace test_gpt_model {  // the file's own names, apart from its suite's other files in a unity build

namespace {

// ---- an independent reference forward: scalar loops in double, written from the math -----------------

using Rows = std::vector<std::vector<double>>;  // [T][features]

double at(const gpt::Param& p, std::size_t i) { return static_cast<double>(p.data()[i]); }

Rows layer_norm(const Rows& x, const gpt::LayerNorm& ln) {
  Rows y = x;
  for (std::size_t t = 0; t < x.size(); ++t) {
    const auto d = static_cast<double>(x[t].size());
    double mean = 0, var = 0;
    for (double v : x[t]) mean += v / d;
    for (double v : x[t]) var += (v - mean) * (v - mean) / d;
    for (std::size_t k = 0; k < x[t].size(); ++k) {
      y[t][k] = (x[t][k] - mean) / std::sqrt(var + 1e-5) * at(ln.weight, k) + at(ln.bias, k);
    }
  }
  return y;
}

// y[t][o] = b[o] + sum_k W[o][k] x[t][k]; W given as a Param [out][in], bias optional.
Rows affine(const Rows& x, const gpt::Param& w, const gpt::Param* b) {
  const std::size_t out = w.dim(0), in = w.dim(1);
  Rows y(x.size(), std::vector<double>(out));
  for (std::size_t t = 0; t < x.size(); ++t) {
    for (std::size_t o = 0; o < out; ++o) {
      double s = b ? at(*b, o) : 0.0;
      for (std::size_t k = 0; k < in; ++k) s += at(w, o * in + k) * x[t][k];
      y[t][o] = s;
    }
  }
  return y;
}

// logits [B*T][V] of the whole model for one batch.
std::vector<double> reference_logits(gpt::Gpt& m, const gpt::Batch& batch) {
  const auto d = static_cast<std::size_t>(m.config.d_model);
  const auto H = static_cast<std::size_t>(m.config.n_heads);
  const std::size_t hd = d / H, T = static_cast<std::size_t>(batch.seq);
  std::vector<double> logits;
  for (int s = 0; s < batch.batch; ++s) {
    Rows x(T, std::vector<double>(d));
    for (std::size_t t = 0; t < T; ++t) {
      const auto tok = static_cast<std::size_t>(batch.tokens[static_cast<std::size_t>(s) * T + t]);
      for (std::size_t k = 0; k < d; ++k) x[t][k] = at(m.embedding.wte, tok * d + k) + at(m.embedding.wpe, t * d + k);
    }
    for (auto& blk : m.blocks) {
      const Rows qkv = affine(layer_norm(x, blk.ln1), blk.qkv.weight, &blk.qkv.bias);
      Rows att(T, std::vector<double>(d, 0.0));
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t t = 0; t < T; ++t) {
          std::vector<double> p(t + 1);
          double mx = -1e300, sum = 0;
          for (std::size_t u = 0; u <= t; ++u) {
            double dot = 0;
            for (std::size_t j = 0; j < hd; ++j) dot += qkv[t][h * hd + j] * qkv[u][d + h * hd + j];
            p[u] = dot / std::sqrt(static_cast<double>(hd));
            mx = std::max(mx, p[u]);
          }
          for (auto& v : p) sum += (v = std::exp(v - mx));
          for (std::size_t u = 0; u <= t; ++u) {
            for (std::size_t j = 0; j < hd; ++j) att[t][h * hd + j] += p[u] / sum * qkv[u][2 * d + h * hd + j];
          }
        }
      }
      const Rows y1 = affine(att, blk.proj.weight, &blk.proj.bias);
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t k = 0; k < d; ++k) x[t][k] += y1[t][k];
      Rows hidden = affine(layer_norm(x, blk.ln2), blk.fc.weight, &blk.fc.bias);
      for (auto& row : hidden) {
        for (double& v : row) v = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
      }
      const Rows y2 = affine(hidden, blk.fc_proj.weight, &blk.fc_proj.bias);
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t k = 0; k < d; ++k) x[t][k] += y2[t][k];
    }
    const gpt::Param& out = m.config.tied_head ? m.embedding.wte : m.head.weight;
    for (const auto& row : affine(layer_norm(x, m.head.ln_f), out, nullptr)) logits.insert(logits.end(), row.begin(), row.end());
  }
  return logits;
}

double reference_loss(const std::vector<double>& logits, const gpt::Batch& batch, std::size_t vocab) {
  double total = 0;
  int count = 0;
  for (std::size_t r = 0; r < batch.targets.size(); ++r) {
    if (batch.targets[r] == gpt::Batch::kIgnore) continue;
    double mx = -1e300, sum = 0;
    for (std::size_t v = 0; v < vocab; ++v) mx = std::max(mx, logits[r * vocab + v]);
    for (std::size_t v = 0; v < vocab; ++v) sum += std::exp(logits[r * vocab + v] - mx);
    total += mx + std::log(sum) - logits[r * vocab + static_cast<std::size_t>(batch.targets[r])];
    ++count;
  }
  return total / count;
}

gpt::Config small_config(bool tied) {
  gpt::Config c;
  c.vocab_size = 7;
  c.context = 6;
  c.d_model = 12;
  c.n_heads = 3;
  c.n_layers = 2;
  c.d_ff = 20;  // not 4 * d: the MLP width must come from the config everywhere
  c.tied_head = tied;
  return c;
}

// Copies parameter values from one model to another of the same config, in visiting order.
void copy_values(gpt::Gpt& from, gpt::Gpt& to) {
  std::vector<gpt::Param*> dst;
  to.parameters([&](std::string_view, gpt::Param& p) { dst.push_back(&p); });
  std::size_t i = 0;
  from.parameters([&](std::string_view, gpt::Param& p) {
    std::copy_n(p.data(), p.numel(), dst[i++]->data());
  });
}

std::vector<float> all_grads(gpt::Gpt& m) {
  std::vector<float> g;
  m.parameters([&](std::string_view, gpt::Param& p) { g.insert(g.end(), p.grad(), p.grad() + p.numel()); });
  return g;
}

}  // namespace

TEST_CASE("gpt forward equals an independent double-precision reference") {
  for (bool tied : {false, true}) {
    CAPTURE(tied);
    gpt::Gpt model(small_config(tied));
    gpt_test::FlatStorage storage(model);
    gpt_test::fill_test_values(model, 5);
    // seq 5 < context 6: position rows beyond the sequence stay unused.
    const gpt::Batch batch = gpt_test::random_batch(3, 5, 7, 8, /*ignore_every=*/4);
    const float loss = model.forward(batch);
    const gpt::Matrix& logits = model.head.output();
    const std::vector<double> ref = reference_logits(model, batch);
    REQUIRE(logits.size() == static_cast<Eigen::Index>(ref.size()));
    for (Eigen::Index r = 0; r < logits.rows(); ++r) {
      for (Eigen::Index v = 0; v < logits.cols(); ++v) {
        const double want = ref[static_cast<std::size_t>(r * logits.cols() + v)];
        // float forward of a few hundred terms per output: relative error ~1e-6
        CHECK(std::abs(logits(r, v) - want) <= 1e-4 * (1.0 + std::abs(want)));
      }
    }
    CHECK(loss == doctest::Approx(reference_loss(ref, batch, 7)).epsilon(1e-5));
  }
}

TEST_CASE("gpt is causal and keeps sequences of a batch independent (bitwise)") {
  gpt::Gpt model(small_config(false));
  gpt_test::FlatStorage storage(model);
  gpt_test::fill_test_values(model, 6);
  gpt::Batch a = gpt_test::random_batch(2, 6, 7, 9);
  gpt::Batch b = a;
  b.tokens[3] = (a.tokens[3] + 1) % 7;  // sequence 0, position 3
  const gpt::Matrix la = model.logits(a.inputs());
  const gpt::Matrix lb = model.logits(b.inputs());
  for (Eigen::Index t = 0; t < 3; ++t) CHECK((la.row(t).array() == lb.row(t).array()).all());  // before it
  CHECK_FALSE((la.row(3).array() == lb.row(3).array()).all());                                  // at it
  for (Eigen::Index r = 6; r < 12; ++r) CHECK((la.row(r).array() == lb.row(r).array()).all());  // sequence 1
}

TEST_CASE("gpt parameters as views into one flat buffer at odd offsets give bitwise the same step") {
  gpt::Config demo;  // the demo's shape, where Eigen's vectorized paths are in full use
  demo.vocab_size = 11;
  demo.context = 16;
  for (gpt::Config c : {small_config(false), small_config(true), demo}) {
    CAPTURE(c.d_model);
    CAPTURE(c.tied_head);
    gpt::Gpt aligned(c), packed(c);
    gpt_test::SeparateStorage own(aligned);
    gpt_test::FlatStorage flat(packed, /*odd_offsets=*/true);
    for (std::size_t off : flat.offsets) CHECK(off % 2 == 1);
    gpt_test::fill_test_values(aligned, 12);
    copy_values(aligned, packed);
    const gpt::Batch batch = gpt_test::random_batch(3, c.context, c.vocab_size, 13, 3);
    const float la = aligned.train_step(batch);
    const float lp = packed.train_step(batch);
    CHECK(la == lp);
    CHECK(all_grads(aligned) == all_grads(packed));
    // Gaps between parameters are never written: the model touches only its own views.
    for (std::size_t i = 0; i < flat.offsets.size(); ++i) {
      CHECK(flat.grads[flat.offsets[i] - 1] == 0.0f);
      CHECK(flat.values[flat.offsets[i] - 1] == 0.0f);
    }
  }
}

TEST_CASE("gpt gradients accumulate (+=) and scale exactly with loss_scale") {
  gpt::Gpt model(small_config(true));
  gpt_test::FlatStorage storage(model);
  gpt_test::fill_test_values(model, 14);
  const gpt::Batch batch = gpt_test::random_batch(2, 6, 7, 15, 4);

  const float loss1 = model.train_step(batch);
  const std::vector<float> g1 = all_grads(model);
  const float loss2 = model.train_step(batch);  // no zeroing in between
  const std::vector<float> g2 = all_grads(model);
  CHECK(loss1 == loss2);
  double worst = 0;
  for (std::size_t i = 0; i < g1.size(); ++i) worst = std::max(worst, std::abs(g2[i] - 2.0 * g1[i]) / (1e-6 + std::abs(g1[i])));
  CHECK(worst <= 1e-5);  // a GEMM may add into its destination in blocks: equal up to rounding

  // A power-of-two scale commutes with every rounding (no overflow or underflow here): bitwise.
  storage.zero_grad();
  CHECK(model.train_step(batch, gpt::NoScope{}, 8.0f) == loss1);  // the loss itself is unscaled
  const std::vector<float> g8 = all_grads(model);
  for (std::size_t i = 0; i < g1.size(); ++i) REQUIRE(g8[i] == 8.0f * g1[i]);
}

TEST_CASE("gpt loss: closed forms and positions without targets") {
  gpt::Gpt model(small_config(false));
  gpt_test::FlatStorage storage(model);
  gpt::init_parameters(model, 1);
  // All weights zero except LayerNorm gains (1 by init): every logit is 0, the loss is ln(V).
  model.parameters([](std::string_view name, gpt::Param& p) {
    if (!(name.find("ln") != std::string_view::npos && name.ends_with(".weight"))) std::fill_n(p.data(), p.numel(), 0.0f);
  });
  gpt::Batch batch = gpt_test::random_batch(2, 6, 7, 16);
  CHECK(model.train_step(batch) == doctest::Approx(std::log(7.0)).epsilon(1e-6));
  // d(loss)/d(head.weight) = dlogits^T ln_f(x) = 0 here (ln_f(0 input) is its zero shift)
  for (std::size_t i = 0; i < model.head.weight.numel(); ++i) CHECK(model.head.weight.grad()[i] == 0.0f);

  // No targeted position: loss 0 and no gradient at all.
  gpt_test::fill_test_values(model, 17);
  storage.zero_grad();
  std::fill(batch.targets.begin(), batch.targets.end(), gpt::Batch::kIgnore);
  CHECK(model.train_step(batch) == 0.0f);
  CHECK(model.targeted_positions() == 0);
  for (float g : storage.grads) REQUIRE(g == 0.0f);
}

namespace {

// An engine-like scope that binds a layer's parameters (own and external) only while its guard lives
// and leaves every parameter unbound (nullptr) otherwise, like ZeRO-3 gathering; it records the order.
struct GatherScope {
  gpt::Gpt* model;
  std::map<const gpt::Param*, std::pair<float*, float*>> storage;
  std::vector<std::string> events;

  std::string name_of(const void* layer) const {
    if (layer == &model->embedding) return "embedding";
    if (layer == &model->head) return "head";
    for (std::size_t i = 0; i < model->blocks.size(); ++i)
      if (layer == &model->blocks[i]) return "block" + std::to_string(i);
    return "?";
  }

  template <class L>
  void bind(L& layer, bool on) {
    auto visit = [&](std::string_view, gpt::Param& p) {
      const auto& [data, grad] = storage.at(&p);
      p.bind(on ? data : nullptr, on ? grad : nullptr);
    };
    layer.parameters(visit);
    if constexpr (requires { layer.external_parameters(visit); }) layer.external_parameters(visit);
  }

  template <class L>
  struct Guard {
    GatherScope* scope;
    L* layer;
    std::string tag;
    Guard(GatherScope* s, L* l, std::string t) : scope(s), layer(l), tag(std::move(t)) {
      scope->events.push_back("begin " + tag);
      scope->bind(*layer, true);
    }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    ~Guard() {
      scope->bind(*layer, false);
      scope->events.push_back("end " + tag);
    }
  };
  template <class L>
  Guard<L> forward(L& l) {
    return Guard<L>(this, &l, "forward " + name_of(&l));
  }
  template <class L>
  Guard<L> backward(L& l) {
    return Guard<L>(this, &l, "backward " + name_of(&l));
  }
};

}  // namespace

TEST_CASE("gpt calls the scope around each layer, in order, and touches only the bound layer's parameters") {
  for (bool tied : {false, true}) {
    CAPTURE(tied);
    gpt::Gpt reference(small_config(tied)), gathered(small_config(tied));
    gpt_test::FlatStorage ref_storage(reference), storage(gathered);
    gpt_test::fill_test_values(reference, 18);
    copy_values(reference, gathered);
    GatherScope scope{&gathered, {}, {}};
    gathered.parameters([&](std::string_view, gpt::Param& p) {
      scope.storage[&p] = {p.data(), p.grad()};
      p.bind(nullptr, nullptr);  // from now on, only a guard makes a parameter reachable
    });
    const gpt::Batch batch = gpt_test::random_batch(2, 6, 7, 19, 5);

    CHECK(gathered.train_step(batch, scope, 4.0f) == reference.train_step(batch, gpt::NoScope{}, 4.0f));
    CHECK(storage.grads == ref_storage.grads);
    const std::vector<std::string> layers = {"embedding", "block0", "block1", "head"};
    std::vector<std::string> expected;
    for (const auto& l : layers) expected.insert(expected.end(), {"begin forward " + l, "end forward " + l});
    for (auto it = layers.rbegin(); it != layers.rend(); ++it)
      expected.insert(expected.end(), {"begin backward " + *it, "end backward " + *it});
    CHECK(scope.events == expected);
    gathered.parameters([](std::string_view, gpt::Param& p) { CHECK_FALSE(p.is_bound()); });
  }
}

TEST_CASE("gpt parameters: GPT-2 names, forward order, each owned by exactly one layer") {
  for (bool tied : {false, true}) {
    CAPTURE(tied);
    gpt::Config c = small_config(tied);
    c.d_ff = 0;  // 4 * d
    gpt::Gpt model(c);
    std::vector<std::string> names;
    std::size_t numel = 0;
    model.parameters([&](std::string_view name, gpt::Param& p) {
      CHECK(name == p.name());
      names.emplace_back(name);
      numel += p.numel();
    });
    const std::size_t V = 7, T = 6, d = 12, L = 2;
    // per block: 2 LayerNorms (4d), qkv (3d^2 + 3d), proj (d^2 + d), fc (4d^2 + 4d), mlp.proj (4d^2 + d)
    CHECK(numel == V * d + T * d + L * (12 * d * d + 13 * d) + 2 * d + (tied ? 0 : V * d));
    CHECK(model.num_parameters() == numel);
    CHECK(names.front() == "wte.weight");
    CHECK(names[1] == "wpe.weight");
    CHECK(names[2] == "blocks.0.ln1.weight");
    CHECK(std::find(names.begin(), names.end(), "blocks.1.attn.qkv.weight") != names.end());
    CHECK(std::find(names.begin(), names.end(), "blocks.1.mlp.proj.bias") != names.end());
    CHECK(names.back() == (tied ? "ln_f.bias" : "head.weight"));
    CHECK(std::set<std::string>(names.begin(), names.end()).size() == names.size());

    std::vector<std::string> by_layer;
    model.for_each_layer([&](auto& layer) {
      layer.parameters([&](std::string_view name, gpt::Param&) { by_layer.emplace_back(name); });
    });
    CHECK(by_layer == names);
    std::vector<std::string> external;
    model.head.external_parameters([&](std::string_view name, gpt::Param& p) {
      external.emplace_back(name);
      CHECK(&p == &model.embedding.wte);
    });
    CHECK(external == (tied ? std::vector<std::string>{"wte.weight"} : std::vector<std::string>{}));
  }
}

TEST_CASE("gpt init_parameters: GPT-2 statistics, independent of binding layout, seeded") {
  gpt::Config c;  // the demo's shape: the statistics need enough elements
  c.vocab_size = 11;
  c.context = 16;
  c.n_layers = 2;
  gpt::Gpt a(c), b(c);
  gpt_test::FlatStorage sa(a);
  gpt_test::SeparateStorage sb(b);
  gpt::init_parameters(a, 42);
  gpt::init_parameters(b, 42);
  std::vector<float> va, vb;
  a.parameters([&](std::string_view, gpt::Param& p) { va.insert(va.end(), p.data(), p.data() + p.numel()); });
  b.parameters([&](std::string_view, gpt::Param& p) { vb.insert(vb.end(), p.data(), p.data() + p.numel()); });
  CHECK(va == vb);

  auto stats = [](gpt::Param& p) {
    double s = 0, s2 = 0;
    for (std::size_t i = 0; i < p.numel(); ++i) {
      s += p.data()[i];
      s2 += static_cast<double>(p.data()[i]) * p.data()[i];
    }
    const double n = static_cast<double>(p.numel());
    return std::pair{s / n, std::sqrt(s2 / n - (s / n) * (s / n))};
  };
  // n = 4 d^2 = 16384 samples: the mean's standard error is std / sqrt(n), the std's relative standard
  // error 1 / sqrt(2 n) = 0.55%; allow 4 standard errors.
  const double n = 16384;
  const auto [fc_mean, fc_std] = stats(a.blocks[0].fc.weight);
  CHECK(std::abs(fc_mean) < 4 * 0.02 / std::sqrt(n));
  CHECK(fc_std == doctest::Approx(0.02).epsilon(4 / std::sqrt(2 * n)));
  const double residual_std = 0.02 / std::sqrt(2.0 * 2);  // 2 layers
  const auto [proj_mean, proj_std] = stats(a.blocks[1].fc_proj.weight);
  CHECK(std::abs(proj_mean) < 4 * residual_std / std::sqrt(n));
  CHECK(proj_std == doctest::Approx(residual_std).epsilon(4 / std::sqrt(2 * n)));
  for (float v : a.blocks[0].ln2.weight.values()) REQUIRE(v == 1.0f);
  for (float v : a.blocks[0].qkv.bias.values()) REQUIRE(v == 0.0f);
  // Different tensors get different streams, a different seed different values.
  CHECK(a.blocks[0].fc.weight.data()[0] != a.blocks[1].fc.weight.data()[0]);
  gpt::init_parameters(b, 43);
  CHECK(a.embedding.wte.data()[0] != b.embedding.wte.data()[0]);
}

TEST_CASE("gpt rejects impossible shapes and inputs with typed errors") {
  gpt::Config c = small_config(false);
  c.n_heads = 5;  // 12 % 5 != 0
  CHECK_THROWS_AS(gpt::Gpt{c}, zerotk::config_error);
  try {
    c.validate();
  } catch (const zerotk::config_error& e) {
    CHECK(e.where() == "gpt.d_model");
  }
  c = small_config(false);
  c.n_layers = 0;
  CHECK_THROWS_AS(gpt::Gpt{c}, zerotk::config_error);

  gpt::Gpt model(small_config(false));
  gpt_test::FlatStorage storage(model);
  gpt_test::fill_test_values(model, 20);
  gpt::Batch batch = gpt_test::random_batch(1, 6, 7, 21);
  batch.tokens[4] = 7;  // vocab is 0..6
  try {
    model.forward(batch);
    FAIL("token 7 accepted");
  } catch (const zerotk::usage_error& e) {
    CHECK(e.where() == "tokens[4]");
    CHECK(e.value() == "7");
  }
  CHECK_THROWS_AS(model.forward(gpt_test::random_batch(1, 7, 7, 22)), zerotk::usage_error);  // 7 > context 6
  batch = gpt_test::random_batch(1, 6, 7, 23);
  batch.targets[2] = 9;
  CHECK_THROWS_AS(model.forward(batch), zerotk::usage_error);
  batch.targets.pop_back();
  CHECK_THROWS_AS(model.forward(batch), zerotk::usage_error);
}

TEST_CASE("gpt single position, single sequence (T = 1, B = 1)") {
  gpt::Gpt model(small_config(true));
  gpt_test::FlatStorage storage(model);
  gpt_test::fill_test_values(model, 24);
  const gpt::Batch batch = gpt_test::random_batch(1, 1, 7, 25);
  const float loss = model.train_step(batch);
  CHECK(loss == doctest::Approx(reference_loss(reference_logits(model, batch), batch, 7)).epsilon(1e-5));
  // Only position 0 exists: wpe rows 1.. get no gradient.
  for (std::size_t i = 12; i < model.embedding.wpe.numel(); ++i) REQUIRE(model.embedding.wpe.grad()[i] == 0.0f);
}

TEST_CASE("gpt models in concurrent threads (ranks as threads) match a serial run bitwise") {
  // No shared mutable state between instances: Eigen is single-threaded and the model has no statics.
  constexpr int kRanks = 3;
  auto run = [](int rank, std::vector<float>& grads, float& loss) {
    gpt::Gpt model(small_config(rank % 2 == 1));
    gpt_test::FlatStorage storage(model);
    gpt::init_parameters(model, 5);
    const gpt::Batch batch = gpt_test::random_batch(2, 6, 7, 30u + static_cast<std::uint32_t>(rank), 4);
    for (int step = 0; step < 3; ++step) loss = model.train_step(batch);
    grads = storage.grads;
  };
  std::vector<std::vector<float>> serial(kRanks), threaded(kRanks);
  std::vector<float> serial_loss(kRanks), threaded_loss(kRanks);
  for (int r = 0; r < kRanks; ++r) run(r, serial[static_cast<std::size_t>(r)], serial_loss[static_cast<std::size_t>(r)]);
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] { run(r, threaded[static_cast<std::size_t>(r)], threaded_loss[static_cast<std::size_t>(r)]); });
    }
  }
  CHECK(threaded == serial);
  CHECK(threaded_loss == serial_loss);
}

}  // namespace test_gpt_model
