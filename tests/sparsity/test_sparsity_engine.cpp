// Sparsity<NofM<2, 4>> in the engine (engine/sparsity.hpp) on 3 thread ranks, whose ZeRO blocks cut
// groups of 4: with the masks fixed from the first step, training equals dense training of the
// masked model (initial weights masked, weight gradients masked in backward) bit for bit, at stages
// 0-3 in fp32 and with offload in bf16; every group of 4 of a sparse weight holds exactly 2 non-zero
// values after every step, on every rank; a dense warm-up is dense training, then the masks are the
// master's largest magnitudes; state() / load_state() carry the masks; refusals name what is wrong.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../engine/engine_fixture.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"
#include "zerotk/sparsity/nm.hpp"
#if ZEROTK_HAS_XXHASH
#include <unistd.h>

#include <filesystem>

#include "zerotk/checkpoint/load.hpp"
#include "zerotk/checkpoint/save.hpp"
#endif

namespace test_sparsity_engine {

using namespace zerotk;
using zt_test::Dense;

namespace {

/// Widths whose weights' input dimensions (12, 20, 8) are multiples of 4; the biases are 1-D.
template <class T>
struct Net {
  std::vector<Dense<T>> layers;
  Net() {
    layers.emplace_back("fc0", 12, 20, true);
    layers.emplace_back("fc1", 20, 8, true);
    layers.emplace_back("fc2", 8, 4, false);
  }
  template <class V>
  void parameters(V&& visit) {
    for (auto& l : layers) l.parameters(visit);
  }
  std::vector<float> values() const {
    std::vector<float> v;
    for (const auto& l : layers) {
      for (std::size_t i = 0; i < l.w.numel(); ++i) v.push_back(to_float(l.w.data()[i]));
      for (std::size_t i = 0; i < l.b.numel(); ++i) v.push_back(to_float(l.b.data()[i]));
    }
    return v;
  }
};

/// Initial values as floats, per layer: weights then biases (seed 5, the same on every rank).
struct Init {
  std::vector<std::vector<float>> w, b;
};
Init initial_values() {
  Init init;
  std::mt19937 rng(5);
  for (auto [in, out] : {std::pair{12, 20}, {20, 8}, {8, 4}}) {
    std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(static_cast<float>(in)));
    std::vector<float> w(static_cast<std::size_t>(in * out)), b(static_cast<std::size_t>(out));
    for (auto& x : w) x = nd(rng);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = 0.01f * static_cast<float>(i);
    init.w.push_back(std::move(w));
    init.b.push_back(std::move(b));
  }
  return init;
}

/// The rule written another way (a stable sort by magnitude): keep flags of each group of 4.
std::vector<std::uint8_t> serial_keep(const std::vector<float>& v) {
  std::vector<std::uint8_t> keep(v.size(), 0);
  for (std::size_t g = 0; g < v.size(); g += 4) {
    std::size_t idx[4] = {g, g + 1, g + 2, g + 3};
    std::stable_sort(idx, idx + 4, [&](std::size_t a, std::size_t b) { return std::fabs(v[a]) > std::fabs(v[b]); });
    keep[idx[0]] = keep[idx[1]] = 1;
  }
  return keep;
}

struct Spec {
  int steps = 6, gas = 2;
  std::int64_t start_step = 0;
  /// Per layer: the weights' keep flags. Set: the initial weights are masked with them, and with
  /// `mask_gradients` the weight gradients in every backward too (the dense reference of the masked
  /// model; the sparse engine masks its reduced gradients itself).
  std::optional<std::vector<std::vector<std::uint8_t>>> masked_model;
  bool mask_gradients = false;
  std::vector<std::string> parameters;  // SparsityOptions::parameters
};

struct Result {
  std::vector<std::vector<float>> values;  // rank 0's model values after each boundary
  std::vector<double> losses, norms;
  std::size_t violations = 0;  // groups of 4 of a weight without exactly 2 non-zero values, every rank and step
  bool ranks_agree = true;
};

void batch(int step, int micro, int rank, std::vector<float>& x, std::vector<float>& t) {
  std::mt19937 rng(static_cast<std::uint32_t>(7001 * step + 131 * micro + 17 * rank + 3));
  std::normal_distribution<float> nd;
  x.resize(4 * 12);
  t.resize(4 * 4);
  for (auto& v : x) v = nd(rng);
  for (auto& v : t) v = 0.5f * nd(rng);
}

template <class E>
Result run(const Spec& spec, int world = 3) {
  using T = typename E::storage_type;
  const Init init = initial_values();
  Result out;
  std::vector<std::vector<float>> finals(static_cast<std::size_t>(world));
  std::mutex mu;
  comm::run_threads(world, [&](comm::ThreadsCommunicator& c) {
    Net<T> model;
    std::vector<std::vector<T>> storage;  // the initial values the engine adopts
    for (std::size_t l = 0; l < model.layers.size(); ++l) {
      std::vector<T> w(init.w[l].size()), b(init.b[l].size());
      for (std::size_t i = 0; i < w.size(); ++i) {
        const bool pruned = spec.masked_model && (*spec.masked_model)[l][i] == 0;
        w[i] = from_float<T>(pruned ? 0.0f : init.w[l][i]);
      }
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = from_float<T>(init.b[l][i]);
      storage.push_back(std::move(w));
      storage.push_back(std::move(b));
      model.layers[l].w.bind(storage[2 * l].data(), nullptr);
      model.layers[l].b.bind(storage[2 * l + 1].data(), nullptr);
    }
    EngineOptions o;
    o.reduce_bucket_size = 90;  // buckets of <= 90 elements: blocks of 3 ranks cut groups of 4
    o.gradient_accumulation_steps = spec.gas;
    o.gradient_clipping = 0.5;
    o.optimizer.lr = 1e-2f;
    o.optimizer.weight_decay = 0.01f;
    o.sub_group_size = 40;
    o.sparsity.start_step = spec.start_step;
    o.sparsity.parameters = spec.parameters;
    E engine(c, model, o);
    std::vector<std::vector<float>> values;
    std::vector<double> losses, norms;
    std::size_t violations = 0;
    for (int s = 0; s < spec.steps; ++s) {
      StepReport rep;
      for (int m = 0; m < spec.gas; ++m) {
        std::vector<float> x, t, dy;
        batch(s, m, c.rank(), x, t);
        for (auto& l : model.layers) {
          auto scope = engine.forward(l);
          x = l.forward(x);
        }
        const float loss = zt_test::mse(x, t, static_cast<float>(engine.loss_scale()), dy);
        for (std::size_t l = model.layers.size(); l-- > 0;) {
          auto scope = engine.backward(model.layers[l]);
          dy = model.layers[l].backward(dy);
          if (spec.masked_model && spec.mask_gradients) {
            auto& w = model.layers[l].w;
            for (std::size_t i = 0; i < w.numel(); ++i) {
              if ((*spec.masked_model)[l][i] == 0) w.grad()[i] = from_float<T>(0.0f);
            }
          }
        }
        rep = engine.step(loss);
      }
      auto gathered = engine.gather(model);
      for (const auto& l : model.layers) {
        for (std::size_t g = 0; g < l.w.numel(); g += 4) {
          int nonzero = 0;
          for (std::size_t j = 0; j < 4; ++j) nonzero += to_float(l.w.data()[g + j]) != 0.0f ? 1 : 0;
          violations += nonzero != 2 ? 1 : 0;
        }
      }
      values.push_back(model.values());
      losses.push_back(rep.loss);
      norms.push_back(rep.grad_norm);
    }
    std::lock_guard lock(mu);
    out.violations += violations;
    finals[static_cast<std::size_t>(c.rank())] = values.back();
    if (c.rank() == 0) {
      out.values = std::move(values);
      out.losses = std::move(losses);
      out.norms = std::move(norms);
    }
  });
  for (const auto& f : finals) out.ranks_agree = out.ranks_agree && f == finals[0];
  return out;
}

/// Boundaries [from, to) of one micro-step each on this rank's batches.
template <class E>
void train_steps(E& engine, Net<float>& model, int rank, int from, int to) {
  for (int s = from; s < to; ++s) {
    std::vector<float> x, t, dy;
    batch(s, 0, rank, x, t);
    for (auto& l : model.layers) {
      auto scope = engine.forward(l);
      x = l.forward(x);
    }
    const float loss = zt_test::mse(x, t, 1.0f, dy);
    for (std::size_t l = model.layers.size(); l-- > 0;) {
      auto scope = engine.backward(model.layers[l]);
      dy = model.layers[l].backward(dy);
    }
    engine.step(loss);
  }
}

/// Points `model` at the test's initial values (`storage` holds them until the engine adopts them)
/// and returns the options of the state and checkpoint tests: buckets of 90, masks after `start` steps.
EngineOptions bind_initial(Net<float>& model, std::vector<std::vector<float>>& storage, std::int64_t start) {
  const Init init = initial_values();
  for (std::size_t l = 0; l < 3; ++l) {
    storage.push_back(init.w[l]);
    storage.push_back(init.b[l]);
    model.layers[l].w.bind(storage[2 * l].data(), nullptr);
    model.layers[l].b.bind(storage[2 * l + 1].data(), nullptr);
  }
  EngineOptions o;
  o.reduce_bucket_size = 90;
  o.sparsity.start_step = start;
  return o;
}

/// The masks the rule gives the initial weights.
std::vector<std::vector<std::uint8_t>> initial_masks() {
  std::vector<std::vector<std::uint8_t>> masks;
  for (const auto& w : initial_values().w) masks.push_back(serial_keep(w));
  return masks;
}

template <int S, class... Ps>
using Sparse = Engine<Partitioner<Stage<S>>, Optimizer<AdamW>, Sparsity<NofM<2, 4>>, Ps...>;
template <int S, class... Ps>
using DenseEngine = Engine<Partitioner<Stage<S>>, Optimizer<AdamW>, Ps...>;

template <class SparseE, class DenseE>
void check_equals_masked_dense() {
  Spec spec;
  const Result dense_unmasked = run<DenseE>(spec);
  spec.masked_model = initial_masks();
  const Result sparse = run<SparseE>(spec);
  spec.mask_gradients = true;
  const Result dense = run<DenseE>(spec);
  CHECK(sparse.values == dense.values);
  CHECK(sparse.losses == dense.losses);
  CHECK(sparse.norms == dense.norms);
  CHECK(sparse.ranks_agree);
  CHECK(sparse.violations == 0);
  CHECK(dense_unmasked.violations > 0);  // the check can fail: dense weights break 2:4
  CHECK(sparse.values.back() != dense_unmasked.values.back());
}

}  // namespace

TEST_CASE("Sparsity<NofM<2,4>> with masks fixed from the first step equals dense training of the masked model, stages 0-3") {
  SUBCASE("stage 0") { check_equals_masked_dense<Sparse<0>, DenseEngine<0>>(); }
  SUBCASE("stage 1") { check_equals_masked_dense<Sparse<1>, DenseEngine<1>>(); }
  SUBCASE("stage 2") { check_equals_masked_dense<Sparse<2>, DenseEngine<2>>(); }
  SUBCASE("stage 3") { check_equals_masked_dense<Sparse<3>, DenseEngine<3>>(); }
  SUBCASE("stage 2, bf16, Offload<Cpu>") {
    check_equals_masked_dense<Sparse<2, Precision<bf16>, Offload<Cpu>>, DenseEngine<2, Precision<bf16>, Offload<Cpu>>>();
  }
  SUBCASE("stage 3, bf16, Offload<Cpu>, OffloadParams<Cpu>") {
    check_equals_masked_dense<Sparse<3, Precision<bf16>, Offload<Cpu>, OffloadParams<Cpu>>,
                              DenseEngine<3, Precision<bf16>, Offload<Cpu>, OffloadParams<Cpu>>>();
  }
}

template <class SparseE, class DenseE>
void check_warm_up() {
  Spec spec;
  spec.steps = 7;
  spec.start_step = 3;
  const Result sparse = run<SparseE>(spec);
  const Result dense = run<DenseE>(spec);
  for (int s = 0; s < 3; ++s) CHECK(sparse.values[static_cast<std::size_t>(s)] == dense.values[static_cast<std::size_t>(s)]);
  // Step 4's masks come from the values after step 3 (fp32: the master); weights only (biases are 1-D).
  const std::vector<float>& before = sparse.values[2];
  std::size_t at = 0;
  for (auto [in, out] : {std::pair{12, 20}, {20, 8}, {8, 4}}) {
    const std::size_t n = static_cast<std::size_t>(in * out);
    const std::vector<std::uint8_t> keep = serial_keep(std::vector<float>(before.begin() + static_cast<long>(at),
                                                                           before.begin() + static_cast<long>(at + n)));
    for (std::size_t s = 3; s < sparse.values.size(); ++s) {
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < n; ++i) wrong += (sparse.values[s][at + i] != 0.0f) != (keep[i] != 0) ? 1 : 0;
      CHECK(wrong == 0);
    }
    at += n + static_cast<std::size_t>(out);
  }
  CHECK(sparse.violations > 0);  // the warm-up's steps are dense
  CHECK(sparse.ranks_agree);
}

TEST_CASE("a dense warm-up trains densely; the masks are then the master's largest magnitudes, fixed") {
  SUBCASE("stage 2") { check_warm_up<Sparse<2>, DenseEngine<2>>(); }
  SUBCASE("stage 3, Offload<Cpu>, OffloadParams<Cpu>") {
    check_warm_up<Sparse<3, Offload<Cpu>, OffloadParams<Cpu>>, DenseEngine<3, Offload<Cpu>, OffloadParams<Cpu>>>();
  }
}

TEST_CASE("SparsityOptions::parameters: only the named weights are sparse") {
  Spec spec;
  spec.steps = 3;
  spec.parameters = {"fc1.weight"};
  const Result r = run<Sparse<2>>(spec);
  const std::vector<float>& v = r.values.back();
  const auto nonzero_groups_over_2 = [&](std::size_t from, std::size_t n) {
    return sparsity::count_kept_violations(v.data() + from, n, 2, 4, [](float x) { return x; });
  };
  CHECK(nonzero_groups_over_2(0, 240) > 0);         // fc0.weight: dense
  CHECK(nonzero_groups_over_2(240 + 20, 160) == 0);  // fc1.weight: 2:4
}

TEST_CASE("state() and load_state() carry the masks: a resumed run continues bit for bit") {
  for (std::int64_t start : {std::int64_t{0}, std::int64_t{5}}) {  // masks chosen before the state, or after it
    CAPTURE(start);
    std::vector<std::vector<float>> straight(3), resumed(3);
    std::mutex mu;
    comm::run_threads(3, [&](comm::ThreadsCommunicator& c) {
      Net<float> a_model, b_model, c_model;
      std::vector<std::vector<float>> a_init, b_init, c_init;
      Sparse<3> a(c, a_model, bind_initial(a_model, a_init, start));
      train_steps(a, a_model, c.rank(), 0, 8);
      Sparse<3> b(c, b_model, bind_initial(b_model, b_init, start));
      train_steps(b, b_model, c.rank(), 0, 4);
      const EngineState st = b.state();
      CHECK(st.groups.front().sparsity_keep.empty() == (start > 4));
      Sparse<3> r(c, c_model, bind_initial(c_model, c_init, start));
      r.load_state(st);
      train_steps(r, c_model, c.rank(), 4, 8);
      auto ga = a.gather(a_model);
      auto gr = r.gather(c_model);
      std::lock_guard lock(mu);
      straight[static_cast<std::size_t>(c.rank())] = a_model.values();
      resumed[static_cast<std::size_t>(c.rank())] = c_model.values();
    });
    CHECK(resumed == straight);
  }
}

TEST_CASE("refusals name the parameter, the pattern, or the option") {
  const auto build = [](std::vector<std::string> patterns) {
    comm::run_threads(2, [&](comm::ThreadsCommunicator& c) {
      Net<float> model;
      EngineOptions o;
      o.sparsity.parameters = patterns;
      Sparse<2> e(c, model, o);
    });
  };
  CHECK_THROWS_WITH_AS(build({"fc9.*"}), doctest::Contains("fc9.*"), config_error);
  CHECK_THROWS_WITH_AS(build({"fc0.bias"}), doctest::Contains("fc0.bias [20]"), config_error);
  CHECK_NOTHROW(build({"fc0.weight"}));
  EngineOptions o;
  o.sparsity.start_step = -1;
  const std::vector<config_error> problems = o.problems();
  CHECK(std::any_of(problems.begin(), problems.end(), [](const config_error& e) { return e.where() == "sparsity.start_step"; }));
}

#if ZEROTK_HAS_XXHASH
namespace {
/// A Sparse<2> engine over `model` from the initial values, masks after one dense step.
Sparse<2> sparse_engine(comm::ThreadsCommunicator& c, Net<float>& model, std::vector<std::vector<float>>& storage) {
  return Sparse<2>(c, model, bind_initial(model, storage, 1));
}
}  // namespace

TEST_CASE("checkpoints carry the masks: saved at data 4, resharded to data 3 and back bit for bit, still 2:4") {
  const std::string pid = std::to_string(::getpid());
  const std::filesystem::path tmp = std::filesystem::temp_directory_path();
  const std::filesystem::path at4 = tmp / ("zerotk_sparsity_ckpt4_" + pid), at3 = tmp / ("zerotk_sparsity_ckpt3_" + pid);
  std::vector<float> saved;                      // the model's values at the save (rank 0)
  std::vector<EngineGroupState> states4(4);      // each rank's state at the save
  comm::run_threads(4, [&](comm::ThreadsCommunicator& c) {
    Net<float> model;
    std::vector<std::vector<float>> storage;
    Sparse<2> e = sparse_engine(c, model, storage);
    train_steps(e, model, c.rank(), 0, 4);
    checkpoint::save(e, c, at4);
    const EngineState st = e.state();
    CHECK_FALSE(st.groups.front().sparsity_keep.empty());
    states4[static_cast<std::size_t>(c.rank())] = st.groups.front();
    auto g = e.gather(model);
    if (c.rank() == 0) saved = model.values();
  });
  const auto pruned_pattern = [](const std::vector<float>& v) {
    std::vector<char> zero(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) zero[i] = v[i] == 0.0f;
    return zero;
  };
  std::vector<std::vector<float>> after(3);
  comm::run_threads(3, [&](comm::ThreadsCommunicator& c) {
    Net<float> model;
    std::vector<std::vector<float>> storage;
    Sparse<2> e = sparse_engine(c, model, storage);
    const checkpoint::LoadResult r = checkpoint::load(e, c, at4);
    CHECK(r.resharded);
    CHECK(e.sparsity_part().chosen());
    {
      auto g = e.gather(model);
      CHECK(model.values() == saved);
    }
    checkpoint::save(e, c, at3);  // straight away: the state as loaded
    train_steps(e, model, c.rank(), 4, 7);
    auto g = e.gather(model);
    after[static_cast<std::size_t>(c.rank())] = model.values();
  });
  // Three more steps at data 3 keep the pruned weights pruned (the biases and kept weights move).
  std::size_t moved_zero = 0;
  const std::vector<char> before = pruned_pattern(saved), later = pruned_pattern(after[0]);
  std::size_t at = 0;
  for (auto [in, out] : {std::pair{12, 20}, {20, 8}, {8, 4}}) {
    for (std::size_t i = 0; i < static_cast<std::size_t>(in * out); ++i) moved_zero += before[at + i] != later[at + i] ? 1 : 0;
    at += static_cast<std::size_t>(in * out + out);
  }
  CHECK(moved_zero == 0);
  CHECK(after[0] != saved);
  CHECK(after[1] == after[0]);
  // Back at data 4: every rank's master and masks are the ones it saved.
  comm::run_threads(4, [&](comm::ThreadsCommunicator& c) {
    Net<float> model;
    std::vector<std::vector<float>> storage;
    Sparse<2> e = sparse_engine(c, model, storage);
    checkpoint::load(e, c, at3);
    const EngineGroupState back = e.state().groups.front();
    CHECK(back.master == states4[static_cast<std::size_t>(c.rank())].master);
    CHECK(back.sparsity_keep == states4[static_cast<std::size_t>(c.rank())].sparsity_keep);
  });
  std::filesystem::remove_all(at4);
  std::filesystem::remove_all(at3);
}
#endif

}  // namespace test_sparsity_engine
