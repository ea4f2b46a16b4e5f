// Optimizer<Adam|AdamW|Lamb> as a policy, stepped through optim::Standalone (its host form):
// validation, state allocation and checkpoints, parameter groups changed between steps, and
// ZeRO-style partitions over ranks (threads with an all-reduce written here) against one process.
#include <doctest/doctest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "zerotk/kernels/host/adam.hpp"
#include "../kernels/kernel_test_util.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/optim/run.hpp"

namespace test_optimizer {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;

static_assert(std::is_same_v<Optimizer<AdamW>::policy_kind, policy::optimizer>);
static_assert(std::is_same_v<Optimizer<Lamb>::tag, Lamb>);
static_assert(Policy<Optimizer<Adam>>);
// An optimizer is math, groups and a step count; its moments live in a state store.
template <class O>
concept HoldsMoments = requires(O& o) { o.exp_avg(); } || requires(O& o) { o.init_state(std::size_t{1}); };
static_assert(!HoldsMoments<Optimizer<AdamW>> && !HoldsMoments<Optimizer<Lamb>>);
static_assert(HoldsMoments<optim::Standalone<Optimizer<AdamW>>>);

namespace {

using zerotk::test::randn;

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// A model of 6 tensors laid end to end: sizes not multiples of anything, one of 1 element.
const std::vector<std::size_t> kNumels = {1000, 1, 4097, 333, 20000, 77};

struct Flat {
  std::vector<Segment> segs;  // one per tensor; tensors 1 and 5 (bias-like) in group 1
  std::size_t n = 0;
};

Flat flat_model() {
  Flat f;
  for (std::uint32_t t = 0; t < kNumels.size(); ++t) {
    f.segs.push_back({f.n, kNumels[t], (t == 1 || t == 5) ? 1u : 0u, t});
    f.n += kNumels[t];
  }
  return f;
}

std::vector<ParamGroup> two_groups() {
  OptimizerOptions decay, none;
  decay.lr = 2e-3f;
  decay.weight_decay = 0.1f;
  none.lr = 2e-3f;
  none.weight_decay = 0.0f;
  none.lamb_max_coeff = 5.0f;
  return {ParamGroup{decay}, ParamGroup{none}};
}

// The segments of rank r when the flat model is cut into `world` contiguous partitions of
// ceil(n / world) elements (the last shorter); offsets relative to the partition.
std::vector<Segment> rank_segments(const Flat& f, int world, int r, std::size_t* part_begin, std::size_t* part_n) {
  const std::size_t per = (f.n + static_cast<std::size_t>(world) - 1) / static_cast<std::size_t>(world);
  const std::size_t b = std::min(f.n, per * static_cast<std::size_t>(r)), e = std::min(f.n, b + per);
  *part_begin = b;
  *part_n = e - b;
  std::vector<Segment> out;
  for (const Segment& s : f.segs) {
    const std::size_t lo = std::max(b, s.offset), hi = std::min(e, s.offset + s.numel);
    if (hi > lo) out.push_back({lo - b, hi - lo, s.group, s.tensor});
  }
  return out;
}

// Runs `steps` steps of Opt on `world` threads, each owning one partition; returns the master.
template <class Opt>
std::vector<float> run_ranks(int world, int steps, std::vector<float> master, const std::vector<std::vector<float>>& grads,
                             std::vector<float>* m_out = nullptr) {
  const Flat f = flat_model();
  std::vector<std::vector<double>> slots(static_cast<std::size_t>(world));
  std::barrier sync(world);
  std::vector<float> m_all(f.n);
  auto rank_main = [&](int r) {
    std::size_t b = 0, n = 0;
    const auto segs = rank_segments(f, world, r, &b, &n);
    optim::Standalone<Opt> opt(two_groups());
    opt.set_tensor_count(kNumels.size());
    opt.init_state(n);
    // All-reduce in rank order: every rank adds the same slots in the same order (deterministic).
    auto all_reduce = [&](std::span<double> sums) {
      slots[static_cast<std::size_t>(r)].assign(sums.begin(), sums.end());
      sync.arrive_and_wait();
      for (std::size_t i = 0; i < sums.size(); ++i) {
        double s = 0;
        for (int q = 0; q < world; ++q) {
          REQUIRE(slots[static_cast<std::size_t>(q)].size() == sums.size());
          s += slots[static_cast<std::size_t>(q)][i];
        }
        sums[i] = s;
      }
      sync.arrive_and_wait();
    };
    for (int t = 0; t < steps; ++t) {
      opt.step(segs, master.data() + b, grads[static_cast<std::size_t>(t)].data() + b, nullptr, 0.5f, all_reduce);
    }
    std::copy(opt.exp_avg().begin(), opt.exp_avg().end(), m_all.begin() + static_cast<std::ptrdiff_t>(b));
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(rank_main, r);
  for (auto& th : threads) th.join();
  if (m_out) *m_out = m_all;
  return master;
}

}  // namespace

TEST_CASE("Optimizer validates its groups, naming the parameter") {
  CHECK_THROWS_AS(Optimizer<AdamW>(std::vector<ParamGroup>{}), config_error);
  OptimizerOptions bad;
  bad.beta2 = 1.0f;
  try {
    Optimizer<AdamW> opt({ParamGroup{}, ParamGroup{bad}});
    FAIL("beta2 = 1 accepted");
  } catch (const config_error& e) {
    CHECK(e.where() == "optimizer.groups[1].beta2");
    CHECK(e.value() == "1");
  }
  OptimizerOptions neg;
  neg.lr = -1.0f;
  CHECK_THROWS_AS(Optimizer<Lamb>({ParamGroup{neg}}), config_error);
  OptimizerOptions coeffs;
  coeffs.lamb_min_coeff = 2.0f;
  coeffs.lamb_max_coeff = 1.0f;
  CHECK_THROWS_AS(Optimizer<Lamb>({ParamGroup{coeffs}}), config_error);
}

// Hostile values handed to the library directly (no config file in between): each is a config_error
// naming the field and its value, raised by the optimizer's constructor and by optim::validate().
TEST_CASE("hostile hyper-parameters are rejected, naming the field and the value") {
  struct Case {
    const char* name;
    OptimizerOptions options;
    const char* field;
    const char* value;
    const char* rule;  // a piece of the message
    std::size_t broken = 1;  // rules broken in all
  };
  auto with = [](auto set) {
    OptimizerOptions o;
    set(o);
    return o;
  };
  constexpr double inf = std::numeric_limits<double>::infinity();
  const Case cases[] = {
      {"betas {1.5, -2}: beta1", with([](auto& o) { o.beta1 = 1.5, o.beta2 = -2; }), "beta1", "1.5", "[0, 1)", 2},
      {"betas {0.9, -2}: beta2", with([](auto& o) { o.beta2 = -2; }), "beta2", "-2", "[0, 1)"},
      {"eps = -1e-8", with([](auto& o) { o.eps = -1e-8; }), "eps", "-1e-08", ">= 0"},
      {"weight_decay = inf", with([](auto& o) { o.weight_decay = inf; }), "weight_decay", "inf", "finite"},
      {"lr = nan", with([](auto& o) { o.lr = std::nan(""); }), "lr", "nan", "finite"},
      {"lr = 1e300 (inf in float)", with([](auto& o) { o.lr = 1e300; }), "lr", "1e+300", "becomes inf"},
      {"lr = 3.5e38 (inf in float)", with([](auto& o) { o.lr = 3.5e38; }), "lr", "3.5e+38", "becomes inf"},
      {"eps = 1e-50 (0 in float)", with([](auto& o) { o.eps = 1e-50; }), "eps", "1e-50", "becomes 0"},
      {"weight_decay = 1e-40 (subnormal in float)", with([](auto& o) { o.weight_decay = 1e-40; }), "weight_decay",
       "1e-40", "subnormal"},
      {"beta2 = 1 - 1e-11 (1 in float)", with([](auto& o) { o.beta2 = 1 - 1e-11; }), "beta2", "0.99999999999",
       "rounds to 1"},
      {"lamb_max_coeff = 1e39", with([](auto& o) { o.lamb_max_coeff = 1e39; }), "lamb_max_coeff", "1e+39",
       "becomes inf"},
      {"lamb_min_coeff > lamb_max_coeff", with([](auto& o) { o.lamb_min_coeff = 2, o.lamb_max_coeff = 1; }),
       "lamb_max_coeff", "1", ">= lamb_min_coeff"},
  };
  for (const Case& c : cases) {
    CAPTURE(std::string(c.name));
    const auto p = optim::problems(c.options);
    REQUIRE(p.size() == c.broken);
    CHECK(p[0].field == c.field);
    try {
      Optimizer<Lamb> opt({ParamGroup{}, ParamGroup{c.options}});
      FAIL("accepted");
    } catch (const config_error& e) {
      CHECK(e.where() == std::string("optimizer.groups[1].") + c.field);
      CHECK(e.value() == c.value);
      CHECK(e.message().find(c.rule) != std::string::npos);
    }
    CHECK_THROWS_AS(Optimizer<AdamW>({ParamGroup{c.options}}), config_error);
    try {
      optim::validate(c.options, "/x/");
      FAIL("optim::validate accepted");
    } catch (const config_error& e) {
      CHECK(e.where() == std::string("/x/") + c.field);
    }
  }
  // Values float carries exactly enough are fine: the smallest normal float, 0, the largest float.
  OptimizerOptions edge;
  edge.eps = static_cast<double>(std::numeric_limits<float>::min());
  edge.weight_decay = 0;
  edge.lr = static_cast<double>(std::numeric_limits<float>::max());
  edge.beta1 = 0;
  CHECK(optim::problems(edge).empty());
}

TEST_CASE("hyper-parameters are doubles: what is set is what is read back") {
  Optimizer<AdamW> opt({ParamGroup{{.lr = 0.003, .weight_decay = 0.1}}});
  CHECK(opt.groups()[0].options.lr == 0.003);  // not 0.003000000026077032
  CHECK(opt.groups()[0].options.weight_decay == 0.1);
  // ... and the kernels see them rounded to float, once.
  CHECK(opt.step_consts()[0].lr == 0.003f);
  CHECK(opt.step_consts()[0].weight_decay == 0.1f);
}

TEST_CASE("init_state allocates zeroed m and v in the optimizer_state category") {
  MemoryLedger ledger;
  {
    optim::Standalone<Optimizer<Adam>> opt({ParamGroup{}});
    std::vector<float> p(10), g(10);
    const std::vector<Segment> segs = {{0, 10, 0, 0}};
    CHECK_THROWS_AS(opt.step(segs, p.data(), g.data(), nullptr, 1.0f), usage_error);  // before init_state
    opt.init_state(12345, &ledger);
    CHECK(ledger.live(MemoryCategory::optimizer_state) == 2 * 12345 * sizeof(float));
    CHECK(opt.partition_numel() == 12345);
    for (float x : opt.exp_avg()) REQUIRE(x == 0.0f);
    CHECK(opt.step_count() == 0);
  }
  CHECK(ledger.live(MemoryCategory::optimizer_state) == 0);
}

TEST_CASE("step checks segments before touching anything") {
  optim::Standalone<Optimizer<AdamW>> opt({ParamGroup{}});
  opt.init_state(100);
  std::vector<float> p(100, 1.0f), g(100, 1.0f);
  const std::vector<Segment> outside = {{90, 20, 0, 0}};
  const std::vector<Segment> no_group = {{0, 10, 1, 0}};
  CHECK_THROWS_AS(opt.step(outside, p.data(), g.data(), nullptr, 1.0f), usage_error);
  CHECK_THROWS_AS(opt.step(no_group, p.data(), g.data(), nullptr, 1.0f), usage_error);
  opt.groups()[0].options.beta1 = 1.5f;  // a scheduler gone wrong
  const std::vector<Segment> ok = {{0, 100, 0, 0}};
  CHECK_THROWS_AS(opt.step(ok, p.data(), g.data(), nullptr, 1.0f), config_error);
  CHECK(opt.step_count() == 0);
  for (float x : p) REQUIRE(x == 1.0f);
}

TEST_CASE("Adam and AdamW coincide without decay and differ with it") {
  const Flat f = flat_model();
  const auto p0 = randn(f.n, 1), g = randn(f.n, 2);
  OptimizerOptions o;
  o.weight_decay = 0.0f;
  optim::Standalone<Optimizer<Adam>> a({ParamGroup{o}});
  optim::Standalone<Optimizer<AdamW>> w({ParamGroup{o}});
  std::vector<Segment> segs = f.segs;
  for (auto& s : segs) s.group = 0;
  a.init_state(f.n);
  w.init_state(f.n);
  auto pa = p0, pw = p0;
  a.step(segs, pa.data(), g.data(), nullptr, 1.0f);
  w.step(segs, pw.data(), g.data(), nullptr, 1.0f);
  CHECK(same_bits(pa, pw));
  a.groups()[0].options.weight_decay = 0.1f;
  w.groups()[0].options.weight_decay = 0.1f;
  a.step(segs, pa.data(), g.data(), nullptr, 1.0f);
  w.step(segs, pw.data(), g.data(), nullptr, 1.0f);
  CHECK_FALSE(same_bits(pa, pw));
}

TEST_CASE("groups changed between steps (a scheduler) take effect at the next step") {
  const Flat f = flat_model();
  const auto p0 = randn(f.n, 3), g1 = randn(f.n, 4), g2 = randn(f.n, 5);
  optim::Standalone<Optimizer<AdamW>> opt(two_groups());
  opt.init_state(f.n);
  auto p = p0;
  std::vector<half> out(f.n);
  opt.step(f.segs, p.data(), g1.data(), out.data(), 1.0f);
  opt.groups()[0].options.lr = 5e-4f;
  opt.groups()[1].options.beta1 = 0.85f;  // OneCycle moves beta1
  const auto k = opt.step_consts();       // constants of step 2 with the new values
  CHECK(k[0].lr == 5e-4f);
  CHECK(k[1].beta1 == 0.85f);

  // Reference: the kernel with those constants on a copy of the state.
  auto ref_p = p;
  auto ref_m = std::vector<float>(opt.exp_avg().begin(), opt.exp_avg().end());
  auto ref_v = std::vector<float>(opt.exp_avg_sq().begin(), opt.exp_avg_sq().end());
  std::vector<half> ref_out(f.n);
  kernels::host::fused_adam<float, half>(f.segs, k, ref_p.data(), ref_m.data(), ref_v.data(), g2.data(), ref_out.data(),
                                         1.0f);
  opt.step(f.segs, p.data(), g2.data(), out.data(), 1.0f);
  CHECK(same_bits(p, ref_p));
  CHECK(same_bits(out, ref_out));
  for (std::size_t i = 0; i < f.n; ++i) REQUIRE(out[i].bits == float_to_half_bits(p[i]));
  CHECK(opt.step_count() == 2);
}

TEST_CASE_TEMPLATE("state() and load_state() continue a run bit for bit", Opt, Optimizer<Adam>, Optimizer<AdamW>,
                   Optimizer<Lamb>) {
  const Flat f = flat_model();
  std::vector<std::vector<float>> grads;
  for (int t = 0; t < 8; ++t) grads.push_back(randn(f.n, 100 + static_cast<std::uint64_t>(t)));
  optim::Standalone<Opt> a(two_groups());
  a.init_state(f.n);
  auto p = randn(f.n, 6);
  for (int t = 0; t < 3; ++t) a.step(f.segs, p.data(), grads[static_cast<std::size_t>(t)].data(), nullptr, 1.0f);
  const OptimizerState saved = a.state();
  const auto p_saved = p;
  for (int t = 3; t < 8; ++t) a.step(f.segs, p.data(), grads[static_cast<std::size_t>(t)].data(), nullptr, 1.0f);

  optim::Standalone<Opt> b(two_groups());
  b.init_state(f.n);
  b.load_state(saved);
  CHECK(b.step_count() == 3);
  auto q = p_saved;
  for (int t = 3; t < 8; ++t) b.step(f.segs, q.data(), grads[static_cast<std::size_t>(t)].data(), nullptr, 1.0f);
  CHECK(same_bits(p, q));
  CHECK(same_bits(a.state().v, b.state().v));

  optim::Standalone<Opt> c(two_groups());
  c.init_state(f.n + 1);
  CHECK_THROWS_AS(c.load_state(saved), usage_error);
}

TEST_CASE("mixed precision: 16-bit gradients in, 16-bit working copy out") {
  const Flat f = flat_model();
  std::vector<bfloat16> g(f.n), out(f.n);
  const auto gf = randn(f.n, 7);
  for (std::size_t i = 0; i < f.n; ++i) g[i] = bfloat16(gf[i]);
  optim::Standalone<Optimizer<Lamb>> opt(two_groups());
  opt.init_state(f.n);
  auto p = randn(f.n, 8);
  opt.step(f.segs, p.data(), g.data(), out.data(), 1.0f);
  for (std::size_t i = 0; i < f.n; ++i) REQUIRE(out[i].bits == float_to_bf16_bits(p[i]));
}

TEST_CASE("Adam over 3 ranks (uneven partitions, tensors straddling them) equals one rank bit for bit") {
  const Flat f = flat_model();
  std::vector<std::vector<float>> grads;
  for (int t = 0; t < 4; ++t) grads.push_back(randn(f.n, 200 + static_cast<std::uint64_t>(t)));
  const auto p0 = randn(f.n, 9);
  std::vector<float> m1, m3;
  const auto one = run_ranks<Optimizer<AdamW>>(1, 4, p0, grads, &m1);
  const auto three = run_ranks<Optimizer<AdamW>>(3, 4, p0, grads, &m3);
  CHECK(same_bits(one, three));
  CHECK(same_bits(m1, m3));
}

TEST_CASE("LAMB over 3 and 4 ranks: per-tensor norms summed over ranks, same result as one rank") {
  const Flat f = flat_model();
  std::vector<std::vector<float>> grads;
  for (int t = 0; t < 4; ++t) grads.push_back(randn(f.n, 300 + static_cast<std::uint64_t>(t)));
  const auto p0 = randn(f.n, 10);
  std::vector<float> m1, m3;
  const auto one = run_ranks<Optimizer<Lamb>>(1, 4, p0, grads, &m1);
  for (int world : {3, 4}) {
    const auto many = run_ranks<Optimizer<Lamb>>(world, 4, p0, grads, &m3);
    // Moments are elementwise: exact. Parameters: the fp64 norm sums are added in another order,
    // which can move the fp32 trust ratio by one rounding.
    CHECK(same_bits(m1, m3));
    for (std::size_t i = 0; i < f.n; ++i) REQUIRE(std::fabs(many[i] - one[i]) <= 0x1p-21f * std::fabs(one[i]) + 1e-12f);
  }
}

TEST_CASE_TEMPLATE("Run over moments a store owns equals Standalone; a wrong extent changes nothing", Opt,
                   Optimizer<AdamW>, Optimizer<Lamb>) {
  const Flat f = flat_model();
  const auto p0 = randn(f.n, 11);
  std::vector<std::vector<float>> grads;
  for (int t = 0; t < 4; ++t) grads.push_back(randn(f.n, 200 + static_cast<std::uint64_t>(t)));
  optim::Standalone<Opt> ref(two_groups());
  ref.init_state(f.n);
  auto pr = p0;
  for (const auto& g : grads) ref.step(f.segs, pr.data(), g.data(), nullptr, 1.0f);

  Opt opt(two_groups());
  std::vector<float> m(f.n), v(f.n);  // the "store"
  auto p = p0;
  auto no_reduce = [](std::span<double>) {};
  const optim::Moments short_by_one{m.data(), v.data(), f.n - 1};
  CHECK_THROWS_AS((optim::Run<Opt, HostSpace>::template step<float, void>(opt, f.segs, p.data(), short_by_one,
                                                                          grads[0].data(), nullptr, 1.0f, no_reduce)),
                  usage_error);
  CHECK(opt.step_count() == 0);
  CHECK(same_bits(p, p0));
  for (const auto& g : grads) {
    optim::Run<Opt, HostSpace>::template step<float, void>(opt, f.segs, p.data(), {m.data(), v.data(), f.n}, g.data(),
                                                           nullptr, 1.0f, no_reduce);
  }
  CHECK(opt.step_count() == 4);
  CHECK(same_bits(p, pr));
  CHECK(same_bits(m, ref.state().m));
  CHECK(same_bits(v, ref.state().v));
}

}  // namespace test_optimizer
