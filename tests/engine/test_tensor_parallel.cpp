// The engine with parameters split across the tensor group: a two-layer MLP built from
// zerotk::parallel's column- and row-parallel linears on a tensor 2 x data 2 grid of thread ranks,
// against the same MLP at tensor size 1 on its data group of 2. Its parameters declare their splits
// (parallel::SplitParam from the layers' weight_param() / bias_param()); the same MLP over plain
// Params with the splits given by name (ModelOptions::tensor_split) trains to the same bits.
//  - the global norm counts split shards on every tensor rank and replicated parameters once, so it
//    equals tensor size 1's (to rounding: the row-parallel sum adds in another order);
//  - every tensor rank's shards track the matching rows / columns of the tensor-1 parameters;
//  - ZeRO stages 0-3 under tensor 2 give bit-identical parameters (the same schedule);
//  - ranks that declare different splits get an error naming the parameter, not a wrong norm.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "../comm/reference.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"
#include "zerotk/parallel/linear.hpp"
#include "zerotk/parallel/split_param.hpp"

namespace test_tensor_parallel {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using parallel::TensorSplit;

namespace {

constexpr std::size_t kD = 6, kH = 8, kTokens = 4;

std::vector<float> values(std::size_t n, std::uint32_t seed, float scale) { return test::lcg_values(n, seed, scale, 99u); }

template <class V>
std::vector<float> shard_of(const V& full, parallel::MatrixShape s, TensorSplit split, int r, int t) {
  std::vector<float> out(parallel::shard_shape(s, split, t).numel());
  parallel::take_shard<float>(full, s, split, r, t, out);
  return out;
}

/// fc1 (column-parallel, d -> h, ReLU) then fc2 (row-parallel, h -> d, replicated bias), MSE loss.
/// `Declared`: its parameters are parallel::SplitParam made by the layers, which declare their
/// splits; otherwise plain Params, whose splits the engine gets by name (split_of).
template <bool Declared>
struct TpMlpOf {
  using P = std::conditional_t<Declared, parallel::SplitParam<float>, Param<float>>;
  int rank, t;
  parallel::ColumnParallelLinear fc1;
  parallel::RowParallelLinear fc2;
  P w1, b1, w2, b2;
  std::vector<float> init_w1, init_b1, init_w2, init_b2;  // this rank's initial shards
  std::vector<float> x_, hid_, pre_;

  TpMlpOf(int r, int tensor)
      : rank(r), t(tensor), fc1({.name = "fc1", .in = kD, .out = kH, .tensor_size = tensor}),
        fc2({.name = "fc2", .in = kH, .out = kD, .tensor_size = tensor}) {
    if constexpr (Declared) {
      w1 = fc1.weight_param();
      b1 = fc1.bias_param();
      w2 = fc2.weight_param();
      b2 = fc2.bias_param();
    } else {
      w1 = P("fc1.weight", {kH / tensor, kD});
      b1 = P("fc1.bias", {kH / tensor});
      w2 = P("fc2.weight", {kD, kH / tensor});
      b2 = P("fc2.bias", {kD});
    }
    init_w1 = shard_of(values(kH * kD, 1, 0.5f), fc1.weight_shape(), fc1.weight_split(), r, t);
    init_b1 = shard_of(values(kH, 2, 0.1f), fc1.bias_shape(), fc1.bias_split(), r, t);
    init_w2 = shard_of(values(kD * kH, 3, 0.5f), fc2.weight_shape(), fc2.weight_split(), r, t);
    init_b2 = values(kD, 4, 0.1f);
    w1.bind(init_w1.data(), nullptr);  // adopted by the engine at construction
    b1.bind(init_b1.data(), nullptr);
    w2.bind(init_w2.data(), nullptr);
    b2.bind(init_b2.data(), nullptr);
  }
  template <class V>
  void parameters(V&& visit) {
    visit(w1.name(), w1);
    visit(b1.name(), b1);
    visit(w2.name(), w2);
    visit(b2.name(), b2);
  }
  static TensorSplit split_of(std::string_view name) {
    if (name.starts_with("fc1.")) return TensorSplit::rows();
    if (name == "fc2.weight") return TensorSplit::cols();
    return TensorSplit::replicated();
  }

  /// One micro-step on batch `b` of data rank `d`; returns the loss.
  template <class E, class C>
  double step(E& engine, C& tp, int b, int d) {
    const auto x = values(kTokens * kD, 100 + 7 * static_cast<std::uint32_t>(b) + 31 * static_cast<std::uint32_t>(d), 1.0f);
    const auto target = values(kTokens * kD, 200 + 7 * static_cast<std::uint32_t>(b) + 31 * static_cast<std::uint32_t>(d), 1.0f);
    std::vector<float> y(kTokens * kD);
    {
      auto scope = engine.forward(*this);
      pre_.assign(kTokens * fc1.local_out(), 0.0f);
      fc1.forward(x, kTokens, w1.values(), b1.values(), pre_);
      hid_ = pre_;
      for (auto& h : hid_) h = h < 0 ? 0.0f : h;
      fc2.forward(tp, hid_, kTokens, w2.values(), b2.values(), y);
    }
    double loss = 0;
    std::vector<float> dy(y.size());
    for (std::size_t i = 0; i < y.size(); ++i) {
      const float e = y[i] - target[i];
      loss += static_cast<double>(e) * e / static_cast<double>(y.size());
      dy[i] = 2.0f * e / static_cast<float>(y.size());
    }
    {
      auto scope = engine.backward(*this);
      std::vector<float> dhid(hid_.size()), dx(x.size());
      fc2.backward(hid_, kTokens, w2.values(), dy, dhid, w2.grads(), b2.grads());
      for (std::size_t i = 0; i < dhid.size(); ++i) dhid[i] = pre_[i] < 0 ? 0.0f : dhid[i];
      fc1.backward(tp, x, kTokens, w1.values(), dhid, dx, w1.grads(), b1.grads());
    }
    return loss;
  }
};

using TpMlp = TpMlpOf<true>;

struct Run {
  std::vector<float> w1, b1, w2, b2;  // this rank's final shards
  std::vector<double> norms, losses;
};

/// `split`: ModelOptions::tensor_split (null: none, the parameters' own declarations alone).
template <int S, bool Declared = true>
Run train(comm::ThreadsCommunicator& world, int tensor, int steps, TensorSplit (*split)(std::string_view) = nullptr,
          int pipeline = 1) {
  comm::ProcessGrid grid(world, {.data = 0, .pipeline = pipeline, .tensor = tensor});
  TpMlpOf<Declared> model(grid.tensor_index(), tensor);
  EngineOptions o;
  o.optimizer.lr = 1e-2f;
  o.gradient_clipping = 0.0;  // the update does not depend on the norm: shards comparable element by element
  o.reduce_bucket_size = 20;  // several buckets, parameters cut across partitions
  o.tensor_split = split;
  if constexpr (S == 3) o.stage3.param_persistence_threshold = 0;
  Engine<Partitioner<Stage<S>>, Optimizer<AdamW>> engine(grid, model, o);
  Run r;
  for (int s = 0; s < steps; ++s) {
    const StepReport rep = engine.step(model.step(engine, grid.tensor(), s, grid.data_index()));
    r.norms.push_back(rep.grad_norm);
    r.losses.push_back(rep.loss);
  }
  auto g = engine.gather(model, 0);
  r.w1.assign(model.w1.values().begin(), model.w1.values().end());
  r.b1.assign(model.b1.values().begin(), model.b1.values().end());
  r.w2.assign(model.w2.values().begin(), model.w2.values().end());
  r.b2.assign(model.b2.values().begin(), model.b2.values().end());
  return r;
}

template <int S>
std::vector<Run> train_all(int world_size, int tensor, int steps) {
  return comm::run_threads(world_size, [&](comm::ThreadsCommunicator& w) { return train<S>(w, tensor, steps); });
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = a.size() == b.size() ? 0.0f : 1e30f;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace

TEST_CASE("tensor 2 x data 2: the norm counts split shards everywhere and replicated parameters once; shards track "
          "tensor 1") {
  constexpr int kSteps = 6;
  const std::vector<Run> one = train_all<2>(2, 1, kSteps);  // tensor 1 x data 2: the full model
  const std::vector<Run> two = train_all<2>(4, 2, kSteps);  // Megatron order: world rank = 2 d + t
  const TpMlp ref(0, 1);
  for (int w = 0; w < 4; ++w) {
    CAPTURE(w);
    const int d = w / 2, t = w % 2;
    const Run& full = one[static_cast<std::size_t>(d)];
    const Run& mine = two[static_cast<std::size_t>(w)];
    for (int s = 0; s < kSteps; ++s) {
      CAPTURE(s);
      // Counting the replicated fc2.bias on both tensor ranks, or the shards on one, would miss by far more.
      CHECK(mine.norms[static_cast<std::size_t>(s)] == doctest::Approx(full.norms[static_cast<std::size_t>(s)]).epsilon(1e-5));
      CHECK(mine.losses[static_cast<std::size_t>(s)] == doctest::Approx(full.losses[static_cast<std::size_t>(s)]).epsilon(1e-5));
    }
    const parallel::ColumnParallelLinear fc1({.name = "fc1", .in = kD, .out = kH, .tensor_size = 2});
    const parallel::RowParallelLinear fc2({.name = "fc2", .in = kH, .out = kD, .tensor_size = 2});
    CHECK(max_diff(mine.w1, shard_of(full.w1, fc1.weight_shape(), fc1.weight_split(), t, 2)) <= 1e-5f);
    CHECK(max_diff(mine.b1, shard_of(full.b1, fc1.bias_shape(), fc1.bias_split(), t, 2)) <= 1e-5f);
    CHECK(max_diff(mine.w2, shard_of(full.w2, fc2.weight_shape(), fc2.weight_split(), t, 2)) <= 1e-5f);
    CHECK(max_diff(mine.b2, full.b2) <= 1e-5f);
    CHECK(max_diff(mine.w1, ref.init_w1) > 1e-3f);  // it trained
  }
  // The replicated bias stays identical on both tensor ranks of a data rank.
  CHECK(two[0].b2 == two[1].b2);
  CHECK(two[0].w1 != two[1].w1);  // different shards
}

TEST_CASE("splits declared by the parameters and the same splits given by name train to the same bits") {
  for (const bool stage3 : {false, true}) {
    CAPTURE(stage3);
    const auto by_name = comm::run_threads(4, [&](comm::ThreadsCommunicator& w) {
      return stage3 ? train<3, false>(w, 2, 4, &TpMlpOf<false>::split_of) : train<1, false>(w, 2, 4, &TpMlpOf<false>::split_of);
    });
    const auto declared = comm::run_threads(4, [&](comm::ThreadsCommunicator& w) {
      return stage3 ? train<3, true>(w, 2, 4) : train<1, true>(w, 2, 4);
    });
    // Without either, every parameter counts as replicated: a different norm (the control).
    const auto neither = comm::run_threads(4, [&](comm::ThreadsCommunicator& w) { return train<1, false>(w, 2, 4); });
    for (std::size_t w = 0; w < 4; ++w) {
      CAPTURE(w);
      CHECK(declared[w].w1 == by_name[w].w1);
      CHECK(declared[w].b1 == by_name[w].b1);
      CHECK(declared[w].w2 == by_name[w].w2);
      CHECK(declared[w].b2 == by_name[w].b2);
      CHECK(declared[w].norms == by_name[w].norms);
      CHECK(declared[w].losses == by_name[w].losses);
      CHECK(neither[w].norms != by_name[w].norms);
    }
  }
}

TEST_CASE("tensor 2 x data 2 with split parameters: ZeRO stages 0-3 give bit-identical parameters and norms") {
  const std::vector<Run> s0 = train_all<0>(4, 2, 4);
  for (const std::vector<Run>& other : {train_all<1>(4, 2, 4), train_all<2>(4, 2, 4), train_all<3>(4, 2, 4)}) {
    for (std::size_t w = 0; w < 4; ++w) {
      CAPTURE(w);
      CHECK(other[w].w1 == s0[w].w1);
      CHECK(other[w].b1 == s0[w].b1);
      CHECK(other[w].w2 == s0[w].w2);
      CHECK(other[w].b2 == s0[w].b2);
      CHECK(other[w].norms == s0[w].norms);
    }
  }
}

TEST_CASE("ranks that declare different tensor splits get an error naming the parameter") {
  static constexpr auto lopsided = [](std::string_view name) {
    return name == "fc2.bias" ? TensorSplit::rows() : TpMlp::split_of(name);
  };
  std::string message;
  try {
    comm::run_threads(4, [&](comm::ThreadsCommunicator& w) {
      if (w.rank() == 3) {
        (void)train<2>(w, 2, 1, +[](std::string_view n) { return lopsided(n); });
      } else {
        (void)train<2>(w, 2, 1);
      }
    });
  } catch (const usage_error& e) {
    message = e.what();
  }
  CHECK(message.find("fc2.bias") != std::string::npos);
  CHECK(message.find("declare this parameter differently") != std::string::npos);
}

TEST_CASE("on pipeline 2 x tensor 2, a stage whose ranks declare different splits is refused on every rank (issue 56)") {
  // Each stage holds the same MLP here (the check compares the ranks of one stage only). World rank 3
  // is stage 1's tensor rank 1 (Megatron order: world = (pipeline x data + data) x tensor + tensor).
  static constexpr auto lopsided = [](std::string_view name) {
    return name == "fc2.bias" ? TensorSplit::rows() : TpMlp::split_of(name);
  };
  std::vector<std::string> messages(4);
  comm::run_threads(4, [&](comm::ThreadsCommunicator& w) {
    try {
      if (w.rank() == 3) {
        (void)train<2>(w, 2, 1, +[](std::string_view n) { return lopsided(n); }, 2);
      } else {
        (void)train<2>(w, 2, 1, &TpMlp::split_of, 2);
      }
    } catch (const usage_error& e) {
      messages[static_cast<std::size_t>(w.rank())] = e.what();
    }
  });
  for (int r : {2, 3}) {  // stage 1: the parameter
    CAPTURE(messages[static_cast<std::size_t>(r)]);
    CHECK(messages[static_cast<std::size_t>(r)].find("declare this parameter differently") != std::string::npos);
    CHECK(messages[static_cast<std::size_t>(r)].find("fc2.bias") != std::string::npos);
  }
  for (int r : {0, 1}) {  // stage 0 agrees, and is told which stage does not
    CAPTURE(messages[static_cast<std::size_t>(r)]);
    CHECK(messages[static_cast<std::size_t>(r)].find("ranks of pipeline stage 1 declare their parameter") != std::string::npos);
  }
  // The same grid with agreeing ranks trains.
  const auto ok = comm::run_threads(4, [&](comm::ThreadsCommunicator& w) { return train<2>(w, 2, 1, &TpMlp::split_of, 2); });
  CHECK(ok.size() == 4);
}

TEST_CASE("NormShare: what each place on a data 2 x tensor 2 x pipeline 2 grid adds to the norm, the loss and the count") {
  // Over one model shard (a pipeline stage): tensor rank 0 adds every parameter and the loss, the
  // other tensor ranks only their shards of split parameters; data rank 0 adds the count.
  for (int d = 0; d < 2; ++d) {
    for (int t = 0; t < 2; ++t) {
      for (int p = 0; p < 2; ++p) {
        CAPTURE(d);
        CAPTURE(t);
        CAPTURE(p);
        const engine::GridPlace place{2, 2, 2, d, t, p};
        const engine::NormShare share(place);
        CHECK(share.whole() == (t == 0));
        CHECK(share.counts(true));
        CHECK(share.counts(false) == (t == 0));
        CHECK(share.loss_addend(2.5, false) == (t == 0 ? 2.5 : 0.0));
        CHECK(share.loss_addend(2.5, true) == 2.5);
        CHECK(share.count_addend(1000) == (d == 0 ? 1000u : 0u));
      }
    }
  }
  // A rank alone (or a data group alone) counts everything.
  const engine::NormShare alone;
  CHECK(alone.whole());
  CHECK(alone.counts(false));
  CHECK(alone.loss_addend(1.5, false) == 1.5);
  CHECK(alone.count_addend(7) == 7u);
  // Summed over the 8 places: a split parameter's shards counted on both tensor ranks of each data
  // rank 0 (2 x 2 addends over both stages: each stage holds different layers), a whole one once per
  // stage, the loss once per (data, pipeline) pair.
  std::uint64_t split_count = 0, whole_count = 0;
  double loss = 0;
  for (int d = 0; d < 2; ++d) {
    for (int t = 0; t < 2; ++t) {
      for (int p = 0; p < 2; ++p) {
        const engine::NormShare share(engine::GridPlace{2, 2, 2, d, t, p});
        split_count += share.count_addend(share.counts(true) ? 10 : 0);
        whole_count += share.count_addend(share.counts(false) ? 10 : 0);
        loss += share.loss_addend(1.0, false);
      }
    }
  }
  CHECK(split_count == 2u * 2u * 10u);
  CHECK(whole_count == 2u * 10u);
  CHECK(loss == 4.0);
}

}  // namespace test_tensor_parallel
