#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "overflow_patterns.hpp"
#include "zerotk/policies.hpp"
#include "zerotk/precision.hpp"

using namespace zerotk;
using zerotk_test::Fnv1a64;
using zerotk_test::overflow_pattern;

namespace {

/// An independent model of SEMANTICS.md section 1, phrased with a counter of consecutive clean
/// updates instead of DeepSpeed's iteration arithmetic: growth happens on the (k*window+1)-th clean
/// update in a row.
struct ReferenceScaler {
  LossScalerOptions o;
  double scale;
  int hyst;
  std::int64_t clean_run = 0;  // clean updates since the last overflow (or the start), this one included

  explicit ReferenceScaler(const LossScalerOptions& opt)
      : o(opt), scale(std::pow(2.0, opt.initial_scale_power)), hyst(opt.hysteresis) {}

  /// Returns false where the real scaler must throw (state left alone).
  bool step(bool overflow) {
    if (overflow) {
      clean_run = 0;
      if (hyst > 1 && o.hysteresis > 1) {
        --hyst;
        return true;
      }
      if (scale == o.min_loss_scale && o.raise_error_at_min_scale) return false;
      scale = scale / 2 < o.min_loss_scale ? o.min_loss_scale : scale / 2;
      return true;
    }
    ++clean_run;
    if (o.consecutive_hysteresis) hyst = o.hysteresis;
    if (clean_run > 1 && (clean_run - 1) % o.loss_scale_window == 0) {
      scale *= 2;
      hyst = o.hysteresis;
    }
    return true;
  }
};

struct Event {
  std::int64_t iter;
  double old_scale, new_scale;
  std::string reason;
  int hyst;
  bool operator==(const Event&) const = default;
};

void record_into(LossScaler<Dynamic>& s, std::vector<Event>& events) {
  s.on_change([&events](const ScaleChange& c) {
    events.push_back({c.iter, c.old_scale, c.new_scale, std::string(c.reason), c.hysteresis_left});
  });
}

template <class F>
std::string where_of(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.where();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("LossScaler<Dynamic>: the worked example of SEMANTICS.md section 1") {
  LossScaler<Dynamic> s({.initial_scale_power = 16, .loss_scale_window = 4, .hysteresis = 2});
  std::vector<Event> events;
  record_into(s, events);
  const int pattern[] = {1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1};
  const double expected[] = {65536, 32768, 16384, 16384, 16384, 16384, 16384, 32768, 32768, 32768, 32768, 16384};
  for (int i = 0; i < 12; ++i) {
    CAPTURE(i);
    CHECK(s.update(pattern[i] == 1) == (pattern[i] == 1));
    CHECK(s.scale() == expected[i]);
  }
  CHECK(s.iteration() == 12);
  CHECK(s.state() == LossScalerState{16384, 12, 11, 1});
  const std::vector<Event> want = {
      {0, 65536, 65536, "hysteresis", 1}, {1, 65536, 32768, "overflow", 1}, {2, 32768, 16384, "overflow", 1},
      {7, 16384, 32768, "growth", 2},     {9, 32768, 32768, "hysteresis", 1}, {11, 32768, 16384, "overflow", 1},
  };
  CHECK(events == want);
}

TEST_CASE("LossScaler<Dynamic>: first growth on the (window+1)-th clean step; hysteresis refills only on growth") {
  LossScaler<Dynamic> s({.initial_scale_power = 4, .loss_scale_window = 3, .hysteresis = 3});
  for (int i = 0; i < 3; ++i) s.update(false);
  CHECK(s.scale() == 16);  // three clean steps: no growth yet
  s.update(false);
  CHECK(s.scale() == 32);  // the fourth
  s.update(true);
  s.update(true);
  CHECK(s.state().hyst == 1);
  s.update(true);
  CHECK(s.scale() == 16);
  CHECK(s.state().hyst == 1);  // not refilled by the halving
  s.update(true);
  CHECK(s.scale() == 8);
  for (int i = 0; i < 3; ++i) s.update(false);
  CHECK(s.state().hyst == 1);
  s.update(false);
  CHECK(s.scale() == 16);
  CHECK(s.state().hyst == 3);
}

TEST_CASE("LossScaler<Dynamic>: consecutive_hysteresis refills on every clean step") {
  LossScaler<Dynamic> s({.initial_scale_power = 10, .loss_scale_window = 100, .hysteresis = 2,
                         .consecutive_hysteresis = true});
  for (int round = 0; round < 5; ++round) {  // overflow, clean, overflow, ...: never two in a row
    s.update(true);
    CHECK(s.state().hyst == 1);
    s.update(false);
    CHECK(s.state().hyst == 2);
  }
  CHECK(s.scale() == 1024);
  s.update(true);
  s.update(true);
  CHECK(s.scale() == 512);
}

TEST_CASE("LossScaler<Dynamic>: the minimum scale raises, leaving the state untouched, or clamps") {
  SUBCASE("raise") {
    LossScaler<Dynamic> s({.initial_scale_power = 2, .hysteresis = 1, .min_loss_scale = 1});
    s.update(true);
    s.update(true);
    CHECK(s.scale() == 1);
    const auto before = s.state();
    try {
      s.update(true);
      FAIL("expected numerics_error");
    } catch (const numerics_error& e) {
      CHECK(e.message().find("minimum") != std::string::npos);
      CHECK(e.where().find("iteration 2") != std::string::npos);
      CHECK(e.value() == "1");
    }
    CHECK(s.state() == before);
    CHECK_FALSE(s.update(false));  // the run can go on (e.g. after the caller lowered the lr)
    CHECK(s.iteration() == 3);
  }
  SUBCASE("clamp at a minimum that halving does not hit") {
    LossScaler<Dynamic> s({.initial_scale_power = 3, .hysteresis = 1, .min_loss_scale = 3,
                           .raise_error_at_min_scale = false});
    std::vector<Event> events;
    record_into(s, events);
    s.update(true);  // 8 -> 4
    s.update(true);  // 4 -> max(2, 3) = 3
    s.update(true);  // stays 3
    CHECK(s.scale() == 3);
    REQUIRE(events.size() == 3);
    CHECK(events[1] == Event{1, 4, 3, "overflow", 1});
    CHECK(events[2] == Event{2, 3, 3, "overflow_at_minimum", 1});
  }
  SUBCASE("hysteresis still absorbs overflows at the minimum") {
    LossScaler<Dynamic> s({.initial_scale_power = 0, .hysteresis = 2, .min_loss_scale = 1});
    CHECK(s.update(true));  // absorbed: no error
    CHECK_THROWS_AS(s.update(true), numerics_error);
  }
}

TEST_CASE("LossScaler<Dynamic>: DeepSpeed's own traces (tests/golden/loss_scaler_reference.txt)") {
  std::ifstream in(ZEROTK_TEST_SOURCE_DIR "/golden/loss_scaler_reference.txt");
  REQUIRE(in.good());
  std::string line;
  int cases = 0, errors_seen = 0, growth_to_huge = 0;
  std::string header;
  LossScalerOptions o;
  std::uint64_t seed = 0;
  int steps = 0;
  double p_calm = 0, p_storm = 0;
  std::vector<bool> pattern;
  std::optional<LossScaler<Dynamic>> s;
  Fnv1a64 hash;
  int done = 0;
  bool stopped = false;

  auto advance_to = [&](int target) {
    while (done < target && !stopped) {
      s->update(pattern[static_cast<std::size_t>(done)]);
      const auto st = s->state();
      hash.step(pattern[static_cast<std::size_t>(done)], st.scale, st.hyst);
      ++done;
    }
  };

  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string tag;
    ls >> tag;
    if (tag == "case") {
      header = line;
      int consecutive = 0, raise = 0;
      ls >> o.initial_scale_power >> o.loss_scale_window >> o.hysteresis >> consecutive >> o.min_loss_scale >> raise >>
          seed >> steps >> p_calm >> p_storm;
      REQUIRE(!ls.fail());
      o.consecutive_hysteresis = consecutive != 0;
      o.raise_error_at_min_scale = raise != 0;
      pattern = overflow_pattern(seed, steps, p_calm, p_storm);
      s.emplace(o);
      hash = {};
      done = 0;
      stopped = false;
      ++cases;
      continue;
    }
    CAPTURE(header);
    CAPTURE(line);
    int iter = 0, hyst = 0;
    double scale = 0;
    std::int64_t last = 0;
    std::string hex;
    ls >> iter >> scale >> hyst >> last >> hex;
    REQUIRE(!ls.fail());
    const std::uint64_t want_hash = std::stoull(hex, nullptr, 16);
    int error_iter = -1;
    if (tag == "end") ls >> error_iter;
    advance_to(iter);
    if (tag == "end" && error_iter >= 0) {
      const auto before = s->state();
      CHECK_THROWS_AS(s->update(pattern[static_cast<std::size_t>(error_iter)]), numerics_error);
      CHECK(s->state() == before);
      ++errors_seen;
    } else if (tag == "end") {
      CHECK(done == steps);
    }
    const auto st = s->state();
    CHECK(st.iter == iter);
    CHECK(st.scale == scale);
    CHECK(st.hyst == hyst);
    CHECK(st.last_overflow_iter == last);
    CHECK(hash.h == want_hash);
    if (st.scale > 1e100) ++growth_to_huge;
  }
  CHECK(cases == 144);
  CHECK(errors_seen > 10);     // the grid does reach the minimum-scale error
  CHECK(growth_to_huge > 0);   // and unbounded growth
}

TEST_CASE("LossScaler<Dynamic>: random patterns against an independent model, every option combination") {
  int combos = 0, throws = 0;
  for (double power : {16.0, 3.0, 2.5})
    for (std::int64_t window : {1, 2, 5, 16})
      for (int hysteresis : {1, 2, 4})
        for (bool consecutive : {false, true})
          for (double min_scale : {1.0, 0.25, 3.0})
            for (bool raise : {false, true}) {
              if (std::exp2(power) < min_scale) continue;
              const LossScalerOptions o{.initial_scale_power = power, .loss_scale_window = window,
                                        .hysteresis = hysteresis, .consecutive_hysteresis = consecutive,
                                        .min_loss_scale = min_scale, .raise_error_at_min_scale = raise};
              ++combos;
              for (std::uint64_t seed : {1u, 2u}) {
                CAPTURE(power);
                CAPTURE(window);
                CAPTURE(hysteresis);
                CAPTURE(consecutive);
                CAPTURE(min_scale);
                CAPTURE(raise);
                CAPTURE(seed);
                LossScaler<Dynamic> s(o);
                ReferenceScaler ref(o);
                const auto pattern = overflow_pattern(seed * 7919 + static_cast<std::uint64_t>(combos), 600, 0.05, 0.7);
                for (std::size_t i = 0; i < pattern.size(); ++i) {
                  if (!ref.step(pattern[i])) {
                    CHECK_THROWS_AS(s.update(pattern[i]), numerics_error);
                    ++throws;
                    break;
                  }
                  const bool skip = s.update(pattern[i]);
                  if (skip != pattern[i] || s.scale() != ref.scale || s.state().hyst != ref.hyst) {
                    CAPTURE(i);
                    CHECK(skip == pattern[i]);
                    CHECK(s.scale() == ref.scale);
                    CHECK(s.state().hyst == ref.hyst);
                    break;
                  }
                }
              }
            }
  CHECK(combos > 300);
  CHECK(throws > 20);
}

TEST_CASE("LossScaler<Dynamic>: save and restore mid-run continues bit-identically") {
  const LossScalerOptions o{.loss_scale_window = 4, .hysteresis = 3, .consecutive_hysteresis = true,
                            .min_loss_scale = 0.5, .raise_error_at_min_scale = false};
  const auto pattern = overflow_pattern(42, 500, 0.05, 0.6);
  for (std::size_t cut : {std::size_t{0}, std::size_t{1}, std::size_t{137}, std::size_t{499}}) {
    CAPTURE(cut);
    LossScaler<Dynamic> straight(o), first(o);
    for (std::size_t i = 0; i < cut; ++i) {
      straight.update(pattern[i]);
      first.update(pattern[i]);
    }
    const LossScalerState saved = first.state();
    LossScaler<Dynamic> resumed(o);
    resumed.load_state(saved);
    CHECK(resumed.state() == saved);
    for (std::size_t i = cut; i < pattern.size(); ++i) {
      CHECK(resumed.update(pattern[i]) == straight.update(pattern[i]));
      REQUIRE(resumed.state() == straight.state());
    }
  }
}

TEST_CASE("LossScaler: load_state rejects impossible states, naming the field") {
  LossScaler<Dynamic> d;
  CHECK_THROWS_AS(d.load_state({0.0, 1, -1, 1}), usage_error);
  CHECK_THROWS_AS(d.load_state({INFINITY, 1, -1, 1}), usage_error);
  CHECK_THROWS_AS(d.load_state({NAN, 1, -1, 1}), usage_error);
  CHECK_THROWS_AS(d.load_state({8.0, -1, -1, 1}), usage_error);
  CHECK_THROWS_AS(d.load_state({8.0, 5, 5, 1}), usage_error);  // last overflow cannot be the current iteration
  CHECK_THROWS_AS(d.load_state({8.0, 5, -2, 1}), usage_error);
  try {
    d.load_state({8.0, 5, 2, 0});
    FAIL("expected usage_error");
  } catch (const usage_error& e) {
    CHECK(e.message().find("hyst") != std::string::npos);
  }
  CHECK(d.state() == LossScaler<Dynamic>().state());  // untouched by the failed loads
  LossScaler<None> n;
  CHECK_THROWS_AS(n.load_state({2.0, 5, 2, 0}), usage_error);
  n.load_state({1.0, 5, 2, 0});
  CHECK(n.iteration() == 5);
}

TEST_CASE("LossScaler options: invalid values name the DeepSpeed key") {
  using D = LossScaler<Dynamic>;
  CHECK(where_of([] { D({.loss_scale_window = 0}); }) == "/fp16/loss_scale_window");
  CHECK(where_of([] { D({.hysteresis = 0}); }) == "/fp16/hysteresis");
  CHECK(where_of([] { D({.min_loss_scale = 0}); }) == "/fp16/min_loss_scale");
  CHECK(where_of([] { D({.min_loss_scale = -1}); }) == "/fp16/min_loss_scale");
  CHECK(where_of([] { D({.min_loss_scale = INFINITY}); }) == "/fp16/min_loss_scale");
  CHECK(where_of([] { D({.initial_scale_power = NAN}); }) == "/fp16/initial_scale_power");
  CHECK(where_of([] { D({.initial_scale_power = 2000}); }) == "/fp16/initial_scale_power");
  CHECK(where_of([] { D({.initial_scale_power = 0, .min_loss_scale = 2}); }) == "/fp16/initial_scale_power");
  CHECK(where_of([] { D({.static_scale = 128}); }) == "/fp16/loss_scale");
  CHECK(where_of([] { LossScaler<Static>(LossScalerOptions{}); }) == "/fp16/loss_scale");
  CHECK(where_of([] { LossScaler<Static>(-4.0); }) == "/fp16/loss_scale");
  CHECK(where_of([] { LossScaler<Static>(NAN); }) == "/fp16/loss_scale");
  CHECK_THROWS_AS(D({.hysteresis = -3}), config_error);
  CHECK(where_of([] { D({.initial_scale_power = 0, .min_loss_scale = 1}); }) == "(no error)");
}

TEST_CASE("LossScaler<Static>: fixed scale, overflow still skips, no history events") {
  LossScaler<Static> s(1024.0);
  int events = 0;
  s.on_change([&events](const ScaleChange&) { ++events; });
  CHECK(s.scale() == 1024);
  CHECK(s.inv_scale() == 1.0f / 1024);
  const auto pattern = overflow_pattern(7, 300, 0.1, 0.9);
  std::int64_t last = -1;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    CHECK(s.update(pattern[i]) == pattern[i]);
    if (pattern[i]) last = static_cast<std::int64_t>(i);
  }
  CHECK(s.scale() == 1024);
  CHECK(events == 0);
  CHECK(s.state() == LossScalerState{1024, 300, last, 0});
  LossScaler<Static> r(LossScalerOptions{.static_scale = 8});
  r.load_state(s.state());  // restored exactly, scale included (DeepSpeed restores its scaler object)
  CHECK(r.state() == s.state());
}

TEST_CASE("LossScaler<None>: scale 1; non-finite steps skip unless switched off") {
  LossScaler<None> s;
  CHECK(s.scale() == 1);
  CHECK(s.inv_scale() == 1.0f);
  CHECK(s.update(true));
  CHECK_FALSE(s.update(false));
  CHECK(s.state() == LossScalerState{1, 2, 0, 0});
  LossScaler<None> keep_going({.skip_on_overflow = false});
  CHECK_FALSE(keep_going.update(true));
  CHECK(keep_going.state().last_overflow_iter == 0);  // still recorded
  static_assert(!LossScaler<None>::kScales && LossScaler<Dynamic>::kScales && LossScaler<Static>::kScales);
}

TEST_CASE_TEMPLATE("LossScaler policies plug into policy packs", S, LossScaler<Dynamic>, LossScaler<Static>,
                   LossScaler<None>) {
  static_assert(std::is_same_v<typename S::policy_kind, policy::loss_scaler>);
  static_assert(LossScalePolicy<S>);
  static_assert(PolicyPackCheck<Precision<fp16>, S, Device<Host>>::value);
  static_assert(std::is_same_v<find_policy_t<policy::loss_scaler, missing_policy, Precision<fp16>, S>, S>);
  CHECK(!S::kName.empty());
}

TEST_CASE("LossScaler: the hook sees the updated state and may throw without corrupting it") {
  LossScaler<Dynamic> s({.initial_scale_power = 5, .hysteresis = 1});
  s.on_change([&s](const ScaleChange& c) {
    CHECK(s.scale() == c.new_scale);
    throw std::runtime_error("logger failed");
  });
  CHECK_THROWS_AS(s.update(true), std::runtime_error);
  CHECK(s.state() == LossScalerState{16, 1, 0, 1});
  s.on_change({});  // removed
  CHECK(s.update(true));
  CHECK(s.scale() == 8);
}
