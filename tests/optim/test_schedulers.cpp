#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <numbers>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "zerotk/optim/schedulers.hpp"
#include "zerotk/precision/loss_scaler.hpp"

namespace test_schedulers {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using optim::warmup_type_from_string;

namespace {

template <class F>
std::string where_of(F&& f) {
  try {
    f();
  } catch (const config_error& e) {
    return e.where();
  }
  return "(no config_error)";
}

/// Steps at which the issue asks for closed-form checks: {-1, 0, 1, N-1, N, N+1, T, T+1000}.
std::vector<std::int64_t> probe_steps(std::int64_t n, std::int64_t t) {
  return {-1, 0, 1, n - 1, n, n + 1, t, t + 1000};
}

template <class S>
void check_closed_form(const S& s, std::int64_t n, std::int64_t t, const std::function<double(std::int64_t)>& lr) {
  for (std::int64_t it : probe_steps(n, t)) {
    CAPTURE(it);
    CHECK(s.lr_at(it) == doctest::Approx(lr(it)).epsilon(1e-13));
  }
}

// ---- DeepSpeed golden file --------------------------------------------------------------------

using Params = std::map<std::string, std::string>;  // DeepSpeed name -> JSON text

double num(const Params& p, const std::string& k) { return std::stod(p.at(k)); }
std::int64_t integer(const Params& p, const std::string& k) { return std::stoll(p.at(k)); }

/// Builds the options from DeepSpeed-named parameters; every key must be consumed.
LrSchedulerOptions options_from(const std::string& type, Params p) {
  auto take = [&p](const std::string& k, auto apply) {
    if (auto it = p.find(k); it != p.end()) {
      apply(p, k);
      p.erase(it);
    }
  };
  auto warmup_type = [](const Params& q, const std::string& k) {
    return warmup_type_from_string(q.at(k).substr(1, q.at(k).size() - 2));  // strip JSON quotes
  };
  LrSchedulerOptions out;
  if (type == "WarmupLR") {
    WarmupLROptions o;
    take("warmup_min_lr", [&](const Params& q, const std::string& k) { o.warmup_min_lr = num(q, k); });
    take("warmup_max_lr", [&](const Params& q, const std::string& k) { o.warmup_max_lr = num(q, k); });
    take("warmup_num_steps", [&](const Params& q, const std::string& k) { o.warmup_num_steps = integer(q, k); });
    take("warmup_type", [&](const Params& q, const std::string& k) { o.warmup_type = warmup_type(q, k); });
    out = o;
  } else if (type == "WarmupDecayLR") {
    WarmupDecayLROptions o;
    take("total_num_steps", [&](const Params& q, const std::string& k) { o.total_num_steps = integer(q, k); });
    take("warmup_min_lr", [&](const Params& q, const std::string& k) { o.warmup_min_lr = num(q, k); });
    take("warmup_max_lr", [&](const Params& q, const std::string& k) { o.warmup_max_lr = num(q, k); });
    take("warmup_num_steps", [&](const Params& q, const std::string& k) { o.warmup_num_steps = integer(q, k); });
    take("warmup_type", [&](const Params& q, const std::string& k) { o.warmup_type = warmup_type(q, k); });
    out = o;
  } else if (type == "WarmupCosineLR") {
    WarmupCosineLROptions o;
    take("total_num_steps", [&](const Params& q, const std::string& k) { o.total_num_steps = integer(q, k); });
    take("warmup_min_ratio", [&](const Params& q, const std::string& k) { o.warmup_min_ratio = num(q, k); });
    take("warmup_num_steps", [&](const Params& q, const std::string& k) { o.warmup_num_steps = integer(q, k); });
    take("cos_min_ratio", [&](const Params& q, const std::string& k) { o.cos_min_ratio = num(q, k); });
    take("warmup_type", [&](const Params& q, const std::string& k) { o.warmup_type = warmup_type(q, k); });
    out = o;
  } else if (type == "OneCycle") {
    OneCycleOptions o;
    take("cycle_min_lr", [&](const Params& q, const std::string& k) { o.cycle_min_lr = num(q, k); });
    take("cycle_max_lr", [&](const Params& q, const std::string& k) { o.cycle_max_lr = num(q, k); });
    take("decay_lr_rate", [&](const Params& q, const std::string& k) { o.decay_lr_rate = num(q, k); });
    take("cycle_first_step_size",
         [&](const Params& q, const std::string& k) { o.cycle_first_step_size = integer(q, k); });
    take("cycle_second_step_size",
         [&](const Params& q, const std::string& k) { o.cycle_second_step_size = integer(q, k); });
    take("cycle_first_stair_count",
         [&](const Params& q, const std::string& k) { o.cycle_first_stair_count = integer(q, k); });
    take("cycle_second_stair_count",
         [&](const Params& q, const std::string& k) { o.cycle_second_stair_count = integer(q, k); });
    take("decay_step_size", [&](const Params& q, const std::string& k) { o.decay_step_size = integer(q, k); });
    take("cycle_momentum", [&](const Params& q, const std::string& k) { o.cycle_momentum = q.at(k) == "true"; });
    take("cycle_min_mom", [&](const Params& q, const std::string& k) { o.cycle_min_mom = num(q, k); });
    take("cycle_max_mom", [&](const Params& q, const std::string& k) { o.cycle_max_mom = num(q, k); });
    take("decay_mom_rate", [&](const Params& q, const std::string& k) { o.decay_mom_rate = num(q, k); });
    out = o;
  } else if (type == "LRRangeTest") {
    LRRangeTestOptions o;
    take("lr_range_test_min_lr", [&](const Params& q, const std::string& k) { o.lr_range_test_min_lr = num(q, k); });
    take("lr_range_test_step_size",
         [&](const Params& q, const std::string& k) { o.lr_range_test_step_size = integer(q, k); });
    take("lr_range_test_step_rate",
         [&](const Params& q, const std::string& k) { o.lr_range_test_step_rate = num(q, k); });
    take("lr_range_test_staircase",
         [&](const Params& q, const std::string& k) { o.lr_range_test_staircase = q.at(k) == "true"; });
    out = o;
  } else {
    FAIL("unknown schedule type in the golden file: " << type);
  }
  CHECK_MESSAGE(p.empty(), "unconsumed parameter " << (p.empty() ? "" : p.begin()->first));
  return out;
}

/// Exact, except where DeepSpeed's value goes through log() or cos(): those may differ in the
/// last bits between libm implementations.
bool same_value(double got, double want, bool transcendental) {
  if (!transcendental) return got == want;
  return std::abs(got - want) <= 4 * std::numeric_limits<double>::epsilon() * std::abs(want);
}

}  // namespace

TEST_CASE("schedules match DeepSpeed's own values (tests/golden/lr_schedule_reference.txt)") {
  std::ifstream in(ZEROTK_TEST_SOURCE_DIR "/golden/lr_schedule_reference.txt");
  REQUIRE(in.good());
  std::optional<LrScheduler> s;
  std::string header, type;
  bool transcendental = false;
  int schedules = 0, rows = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    if (line.rfind("schedule ", 0) == 0) {
      header = line;
      std::string tag, id, kv;
      double optimizer_lr = 0;
      ls >> tag >> id >> type >> optimizer_lr;
      Params p;
      while (ls >> kv) {
        const auto eq = kv.find('=');
        p[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
      transcendental = type == "WarmupCosineLR" ||
                       ((type == "WarmupLR" || type == "WarmupDecayLR") && p.count("warmup_type") == 0);
      s.emplace(options_from(type, p), optimizer_lr);
      CHECK(s->name() == type);
      ++schedules;
      continue;
    }
    CAPTURE(header);
    CAPTURE(line);
    std::int64_t it = 0;
    std::string lr_text, b1_text, b2_text;
    ls >> it >> lr_text >> b1_text >> b2_text;
    REQUIRE(!ls.fail());
    // Reach `it` the way an engine does: stepping once per applied step, or restoring a checkpoint.
    if (it == s->last_batch_iteration() + 1) s->step();
    else if (it != -1) s->load_state({it});
    REQUIRE(s->last_batch_iteration() == it);
    CHECK(same_value(s->lr(), std::stod(lr_text), transcendental));
    const auto betas = s->betas();
    CHECK(betas.has_value() == (b1_text != "-"));
    if (betas && b1_text != "-") {
      CHECK(betas->beta1 == std::stod(b1_text));
      CHECK(betas->beta2 == std::stod(b2_text));
      CHECK(s->momentum() == betas->beta1);
    }
    ++rows;
  }
  CHECK(schedules == 16);
  CHECK(rows > 600);
}

TEST_CASE("WarmupLR: closed form at -1, 0, 1, N-1, N, N+1, T, T+1000") {
  const double lo = 1e-4, hi = 1e-3;
  SUBCASE("log") {
    WarmupLR s({.warmup_min_lr = lo, .warmup_max_lr = hi, .warmup_num_steps = 10});
    check_closed_form(s, 10, 50, [&](std::int64_t it) {
      if (it < 0) return lo;  // the first optimizer step runs at the minimum
      return it < 10 ? lo + (hi - lo) * std::log(it + 1.0) / std::log(10.0) : hi;
    });
  }
  SUBCASE("linear; the peak defaults to the optimizer's lr") {
    WarmupLR s({.warmup_min_lr = lo, .warmup_num_steps = 8, .warmup_type = WarmupType::linear}, hi);
    check_closed_form(s, 8, 50, [&](std::int64_t it) {
      if (it < 0) return lo;
      return it < 8 ? lo + (hi - lo) * static_cast<double>(it) / 8.0 : hi;
    });
  }
  SUBCASE("warmup_num_steps 1 behaves as 2") {
    WarmupLR s({.warmup_min_lr = lo, .warmup_max_lr = hi, .warmup_num_steps = 1});
    CHECK(s.warmup_num_steps() == 2);
    CHECK(s.lr_at(0) == lo);
    CHECK(s.lr_at(1) == doctest::Approx(lo + (hi - lo) * std::log(2.0) / std::log(2.0)));
    CHECK(s.lr_at(2) == doctest::Approx(hi));
  }
}

TEST_CASE("WarmupDecayLR: closed form at -1, 0, 1, N-1, N, N+1, T, T+1000") {
  const double lo = 2e-5, hi = 4e-3;
  const std::int64_t n = 10, t = 60;
  for (WarmupType type : {WarmupType::log, WarmupType::linear}) {
    CAPTURE(optim::to_string(type));
    WarmupDecayLR s({.total_num_steps = t, .warmup_min_lr = lo, .warmup_max_lr = hi, .warmup_num_steps = n,
                     .warmup_type = type});
    check_closed_form(s, n, t, [&](std::int64_t it) {
      if (it < 0) return lo;
      double gamma;
      if (it < n) gamma = type == WarmupType::log ? std::log(it + 1.0) / std::log(double(n)) : double(it) / double(n);
      else gamma = std::max(0.0, double(t - it) / double(t - n));
      return lo + (hi - lo) * gamma;
    });
    CHECK(s.lr_at(t) == lo);  // decayed to the minimum at T and after
  }
  WarmupDecayLR dflt({.total_num_steps = 100});
  CHECK(dflt.lr_at(5000) == 0.0);
  CHECK(dflt.lr_at(999) == doctest::Approx(1e-3 * std::log(1000.0) / std::log(1000.0)));
  CHECK(dflt.lr_at(1000) == 0.0);  // T < N: the decay is already at 0 after the warm-up
}

TEST_CASE("WarmupCosineLR: closed form at -1, 0, 1, N-1, N, N+1, T, T+1000") {
  const double base = 0.05, wmr = 0.2, cmr = 0.01;
  const std::int64_t n = 10, t = 60;
  WarmupCosineLR s({.total_num_steps = t, .warmup_min_ratio = wmr, .warmup_num_steps = n, .cos_min_ratio = cmr},
                   base);
  check_closed_form(s, n, t, [&](std::int64_t it) {
    if (it < 0) return 0.0;  // DeepSpeed installs lr 0 before the first step
    if (it < n) return base * (wmr + (1 - wmr) * std::log(it + 1.0) / std::log(double(n)));
    const double p = std::min(1.0, double(it - n + 1) / double(t - n));
    return base * (cmr + (1 - cmr) * 0.5 * (1 + std::cos(std::numbers::pi * p)));
  });
  CHECK(s.lr_at(t - 1) == doctest::Approx(base * cmr));  // p reaches 1 at it = T-1
  CHECK(s.lr_at(t + 1000) == doctest::Approx(base * cmr));
  WarmupCosineLR degenerate({.total_num_steps = 3, .warmup_num_steps = 3}, base);  // T == N: no division by 0
  CHECK(degenerate.lr_at(3) == doctest::Approx(base * 1e-4));
}

TEST_CASE("OneCycle: closed form of lr and momentum at -1, 0, 1, N-1, N, N+1, T, T+1000") {
  const double lo = 1e-4, hi = 1e-3, mlo = 0.85, mhi = 0.95, rate = 0.1, mrate = 0.01;
  const std::int64_t s1 = 20, s2 = 30, total = s1 + s2, decay = 5;
  OneCycle s({.cycle_min_lr = lo, .cycle_max_lr = hi, .decay_lr_rate = rate, .cycle_first_step_size = s1,
              .cycle_second_step_size = s2, .decay_step_size = decay, .cycle_min_mom = mlo, .cycle_max_mom = mhi,
              .decay_mom_rate = mrate});
  // Textbook triangle: up over s1 steps (b = it+1 batches done), down over s2 steps.
  auto tri = [&](std::int64_t it) {
    const double b = double(it + 1);
    return b <= s1 ? b / s1 : (double(total) - b) / s2;
  };
  auto lr = [&](std::int64_t it) {
    if (it < total) return lo + (hi - lo) * tri(it);
    return lo / (1 + rate * double(it - total + 1) / decay);
  };
  auto mom = [&](std::int64_t it) {
    if (it < 0) return mlo;  // DeepSpeed installs cycle_min_mom before the first step
    if (it < total) return mhi - (mhi - mlo) * tri(it);
    return mhi * (1 + mrate * double(it - total + 1) / decay);
  };
  for (std::int64_t it : probe_steps(s1, total)) {
    CAPTURE(it);
    CHECK(s.lr_at(it) == doctest::Approx(lr(it)).epsilon(1e-13));
    REQUIRE(s.momentum_at(it).has_value());
    CHECK(*s.momentum_at(it) == doctest::Approx(mom(it)).epsilon(1e-13));
    CHECK(s.betas_at(it)->beta2 == 0.99);
  }
  CHECK(s.lr_at(s1 - 1) == doctest::Approx(hi));      // the peak after s1 steps
  CHECK(s.scale_factor(-1) == 0.0);                   // the cycle formula at -1 would give max momentum...
  CHECK(*s.momentum_at(-1) == mlo);                   // ...but DeepSpeed starts at the minimum

  OneCycle flat({.cycle_min_lr = lo, .cycle_max_lr = hi, .cycle_first_step_size = 4, .cycle_momentum = false});
  CHECK(flat.lr_at(8) == lo);     // no decay configured: the minimum after the cycle
  CHECK(flat.lr_at(10000) == lo);
  CHECK_FALSE(flat.momentum_at(3).has_value());
  CHECK_FALSE(flat.betas().has_value());

  OneCycle stairs({.cycle_min_lr = 0.0, .cycle_max_lr = 1.0, .cycle_first_step_size = 6,
                   .cycle_second_step_size = 4, .cycle_first_stair_count = 3, .cycle_second_stair_count = 2});
  // Up: 6 batches in 3 stairs (0,0,1/3,1/3,2/3,2/3,1); down: 4 batches in 2 stairs.
  const double want[] = {0.0, 0.0, 1.0 / 3, 1.0 / 3, 2.0 / 3, 2.0 / 3, 1.0, 0.5, 0.5, 0.0, 0.0};
  for (std::int64_t it = -1; it < 10; ++it) {
    CAPTURE(it);
    CHECK(stairs.lr_at(it) == doctest::Approx(want[it + 1]));
  }
}

TEST_CASE("LRRangeTest: closed form at -1, 0, 1, N-1, N, N+1, T, T+1000") {
  const double lo = 1e-5, rate = 0.5;
  const std::int64_t size = 7, t = 50;
  LRRangeTest cont({.lr_range_test_min_lr = lo, .lr_range_test_step_size = size, .lr_range_test_step_rate = rate});
  check_closed_form(cont, size, t, [&](std::int64_t it) { return lo * (1 + rate * double(it + 1) / size); });
  LRRangeTest stair({.lr_range_test_min_lr = lo, .lr_range_test_step_size = size, .lr_range_test_step_rate = rate,
                     .lr_range_test_staircase = true});
  check_closed_form(stair, size, t, [&](std::int64_t it) { return lo * (1 + rate * double((it + 1) / size)); });
  CHECK(stair.lr_at(size - 2) == lo);
  CHECK(stair.lr_at(size - 1) == lo * 1.5);
}

TEST_CASE("invalid schedule parameters are config errors naming the parameter") {
  const std::string p = "/scheduler/params/";
  CHECK(where_of([] { WarmupLR({.warmup_num_steps = 0}); }) == p + "warmup_num_steps");
  CHECK(where_of([] { WarmupLR({.warmup_num_steps = -5}); }) == p + "warmup_num_steps");
  CHECK(where_of([] { WarmupLR({.warmup_min_lr = -1}); }) == p + "warmup_min_lr");
  CHECK(where_of([] { WarmupLR({.warmup_max_lr = NAN}); }) == p + "warmup_max_lr");
  CHECK(where_of([] { WarmupLR({}, -1.0); }) == "/optimizer/params/lr");
  CHECK(where_of([] { WarmupLR({.warmup_max_lr = 1e-3}, -1.0); }) == "(no config_error)");  // lr unused then
  CHECK(where_of([] { WarmupDecayLR({}); }) == p + "total_num_steps");
  CHECK(where_of([] { WarmupDecayLR({.total_num_steps = -1}); }) == p + "total_num_steps");
  CHECK(where_of([] { WarmupDecayLR({.total_num_steps = 10, .warmup_max_lr = -1}); }) == p + "warmup_max_lr");
  CHECK(where_of([] { WarmupDecayLR({.total_num_steps = 10, .warmup_num_steps = 0}); }) == p + "warmup_num_steps");
  CHECK(where_of([] { WarmupCosineLR({}, 1e-3); }) == p + "total_num_steps");
  CHECK(where_of([] { WarmupCosineLR({.total_num_steps = 9, .warmup_min_ratio = -0.1}, 1e-3); }) ==
        p + "warmup_min_ratio");
  CHECK(where_of([] { WarmupCosineLR({.total_num_steps = 9, .cos_min_ratio = INFINITY}, 1e-3); }) ==
        p + "cos_min_ratio");
  CHECK(where_of([] { WarmupCosineLR({.total_num_steps = 9, .warmup_num_steps = 0}, 1e-3); }) ==
        p + "warmup_num_steps");
  CHECK(where_of([] { WarmupCosineLR({.total_num_steps = 9}, NAN); }) == "/optimizer/params/lr");
  CHECK(where_of([] { OneCycle({.cycle_max_lr = 1}); }) == p + "cycle_min_lr");
  CHECK(where_of([] { OneCycle({.cycle_min_lr = 1}); }) == p + "cycle_max_lr");
  const OneCycleOptions ok{.cycle_min_lr = 1e-4, .cycle_max_lr = 1e-3};
  auto one_cycle_where = [&](auto mutate) {
    OneCycleOptions o = ok;
    mutate(o);
    return where_of([&] { OneCycle{o}; });
  };
  CHECK(one_cycle_where([](OneCycleOptions&) {}) == "(no config_error)");
  CHECK(one_cycle_where([](OneCycleOptions& o) { o.cycle_first_step_size = 0; }) == p + "cycle_first_step_size");
  CHECK(one_cycle_where([](OneCycleOptions& o) { o.cycle_first_step_size = -3; }) == p + "cycle_first_step_size");
  CHECK(one_cycle_where([](OneCycleOptions& o) { o.cycle_second_step_size = -1; }) == p + "cycle_second_step_size");
  CHECK(one_cycle_where([](OneCycleOptions& o) { o.cycle_first_stair_count = -1; }) ==
        p + "cycle_first_stair_count");
  CHECK(one_cycle_where([](OneCycleOptions& o) { o.cycle_second_stair_count = -1; }) ==
        p + "cycle_second_stair_count");
  CHECK(one_cycle_where([](OneCycleOptions& o) { o.decay_step_size = -1; }) == p + "decay_step_size");
  CHECK(one_cycle_where([](OneCycleOptions& o) { o.decay_lr_rate = -0.5; }) == p + "decay_lr_rate");
  CHECK(one_cycle_where([](OneCycleOptions& o) { o.cycle_min_mom = -0.5; }) == p + "cycle_min_mom");
  CHECK(one_cycle_where([](OneCycleOptions& o) { o.cycle_max_mom = NAN; }) == p + "cycle_max_mom");
  CHECK(one_cycle_where([](OneCycleOptions& o) { o.decay_mom_rate = -1; }) == p + "decay_mom_rate");
  CHECK(where_of([] { LRRangeTest({.lr_range_test_step_size = 0}); }) == p + "lr_range_test_step_size");
  CHECK(where_of([] { LRRangeTest({.lr_range_test_min_lr = -1}); }) == p + "lr_range_test_min_lr");
  CHECK(where_of([] { LRRangeTest({.lr_range_test_step_rate = -1}); }) == p + "lr_range_test_step_rate");
  CHECK(where_of([] { warmup_type_from_string("cosine"); }) == p + "warmup_type");
  CHECK(warmup_type_from_string("linear") == WarmupType::linear);
  try {
    WarmupLR({.warmup_num_steps = 0});
  } catch (const config_error& e) {
    CHECK(e.value() == "0");
    CHECK(std::string(e.what()).find("warmup_num_steps") != std::string::npos);
  }
}

TEST_CASE("iterations before -1 are usage errors") {
  WarmupLR s;
  CHECK_THROWS_AS(s.lr_at(-2), usage_error);
  CHECK_THROWS_AS(s.load_state({-2}), usage_error);
  CHECK(s.last_batch_iteration() == -1);
}

TEST_CASE("LrScheduler: type-erased schedule, state saved and restored") {
  const std::vector<LrSchedulerOptions> all = {
      WarmupLROptions{.warmup_num_steps = 5},
      WarmupDecayLROptions{.total_num_steps = 20, .warmup_num_steps = 5},
      WarmupCosineLROptions{.total_num_steps = 20, .warmup_num_steps = 5},
      OneCycleOptions{.cycle_min_lr = 1e-4, .cycle_max_lr = 1e-3, .cycle_first_step_size = 4},
      LRRangeTestOptions{.lr_range_test_step_size = 3},
  };
  const char* names[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"};
  for (std::size_t i = 0; i < all.size(); ++i) {
    CAPTURE(names[i]);
    LrScheduler a(all[i], 2e-3);
    CHECK(a.name() == names[i]);
    CHECK(a.last_batch_iteration() == -1);
    CHECK(a.lr() == a.lr_at(-1));
    CHECK(a.momentum().has_value() == (i == 3));
    for (int k = 0; k < 7; ++k) a.step();
    const SchedulerState saved = a.state();
    CHECK(saved.last_batch_iteration == 6);
    LrScheduler b(all[i], 2e-3);
    b.load_state(saved);
    for (int k = 0; k < 30; ++k) {
      REQUIRE(b.lr() == a.lr());
      REQUIRE(b.momentum() == a.momentum());
      a.step();
      b.step();
    }
  }
  LrScheduler wrapped = OneCycle({.cycle_min_lr = 0.1, .cycle_max_lr = 0.2});
  REQUIRE(wrapped.get_if<OneCycle>() != nullptr);
  CHECK(wrapped.get_if<WarmupLR>() == nullptr);
  CHECK(wrapped.betas() == Betas{0.8, 0.99});
}

TEST_CASE("the scheduler advances once per applied step: skipped (overflow) steps keep the lr") {
  LossScaler<Dynamic> scaler({.initial_scale_power = 8, .loss_scale_window = 3, .hysteresis = 1,
                              .raise_error_at_min_scale = false});
  WarmupDecayLR sched({.total_num_steps = 30, .warmup_num_steps = 10, .warmup_type = WarmupType::linear});
  const bool overflow[] = {1, 1, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1};
  std::int64_t applied = 0;
  for (bool o : overflow) {
    const double lr_used = sched.lr();
    if (!scaler.update(o)) {
      ++applied;
      CHECK(lr_used == sched.lr_at(applied - 2));  // the k-th applied step runs at lr_at(k-2)
      sched.step();
    }
  }
  CHECK(sched.last_batch_iteration() == applied - 1);
  CHECK(applied == 13);
}

}  // namespace test_schedulers
