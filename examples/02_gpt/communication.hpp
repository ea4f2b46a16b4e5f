// examples/02_gpt/communication.hpp: the run-time side of the communication flags. --slow-rank R:F
// (a straggler injected on rank R: compute spun on its thread) and what a run sent per link level
// (--topology 2 --ranks-per-node K) and through ZeRO++'s quantized exchanges (--quantized-weights,
// --quantized-gradients). main.cpp turns the flags into the config's `communication` block and
// zero_optimization keys; train.cpp calls these.
#pragma once

#include <time.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <zerotk/comm/hierarchical.hpp>
#include <zerotk/comm/topology.hpp>
#include <zerotk/core/error.hpp>
#include <zerotk/engine/report.hpp>

namespace gpt_demo {

/// --slow-rank RANK:FACTOR.
struct SlowRankFlag {
  int rank = -1;  ///< world rank; -1: none
  double factor = 1;
  bool on() const noexcept { return rank >= 0; }
};

inline SlowRankFlag parse_slow_rank(const std::string& flag) {
  const auto bad = [&] {
    return zerotk::usage_error("must be RANK:FACTOR, RANK a world rank and FACTOR in [1, 100] (e.g. 1:1.3: rank 1 "
                               "computes 1.3x as long as the others)",
                               "--slow-rank", flag);
  };
  const std::size_t colon = flag.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == flag.size()) throw bad();
  const std::string r = flag.substr(0, colon), f = flag.substr(colon + 1);
  char* end = nullptr;
  errno = 0;
  const long rank = std::strtol(r.c_str(), &end, 10);
  if (errno != 0 || end != r.c_str() + r.size() || rank < 0 || rank > 1 << 20) throw bad();
  const double factor = std::strtod(f.c_str(), &end);
  if (end != f.c_str() + f.size() || !std::isfinite(factor) || factor < 1 || factor > 100) throw bad();
  return {static_cast<int>(rank), factor};
}

/// CPU time of the calling thread, ms: the slow-rank detector's clock under --slow-rank. Thread
/// ranks share the cores here, so wall time would charge each rank for the time others ran; CPU
/// time is each rank's own work, and what the injected spin adds.
inline double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

/// --slow-rank R:F on rank R: after each optimizer step, spins for (F - 1) x that step's compute as
/// the engine measured it (StepReport::compute_ms, outside the engine's calls) less the previous
/// spin, so that every step's compute is F x the rank's own. The spin lies between step() and the
/// next forward: the detector reports it in phase "other". Other ranks: nothing.
class SlowRankInjector {
 public:
  SlowRankInjector(const SlowRankFlag& f, int world_rank) : extra_(f.rank == world_rank ? f.factor - 1 : 0) {}

  void after_step(const zerotk::StepReport& r) {
    if (extra_ <= 0 || !r.slow_rank_detection) return;
    const double own = r.compute_ms - spun_ms_;
    spun_ms_ = extra_ * (own > 0 ? own : 0);
    const double until = thread_cpu_ms() + spun_ms_;
    while (thread_cpu_ms() < until) {
    }
  }

 private:
  double extra_;
  double spun_ms_ = 0;
};

/// What rank 0 sent per link level and through ZeRO++'s exchanges over the run (ring convention).
struct LinkFigures {
  std::string topology;           ///< the data group's, as the engine resolved it ("2 nodes x 2 ranks")
  int levels = 1;                 ///< its levels (communication.topology)
  bool hierarchical = false;      ///< more than one level with more than one member: hierarchical collectives
  std::uint64_t intra_node = 0;   ///< the hierarchical collectives' and qgZ's bytes inside the node
  std::uint64_t inter_node = 0;   ///< ... across nodes (the topology's top level)
  std::uint64_t qwz_bytes = 0, qwz_calls = 0;                ///< qwZ's int8 gathers
  std::uint64_t qgz_bytes = 0, qgz_calls = 0, qgz_fallbacks = 0;  ///< qgZ's int4 reduce-scatters
  bool qwz = false, qgz = false;
};

template <class Engine>
LinkFigures link_figures(const Engine& e) {
  LinkFigures f;
  f.topology = e.topology().describe();
  f.levels = e.topology().levels();
  const int top = f.levels - 1;
  const auto add = [&](const zerotk::comm::LinkStats& l) {
    for (int level = 0; level <= top; ++level) (level == top ? f.inter_node : f.intra_node) += l[level].wire_bytes;
  };
  if (const auto* l = e.link_stats()) {
    f.hierarchical = true;
    add(*l);
  }
  if (const auto* q = e.quantized_weights_stats()) {
    f.qwz = true;
    f.qwz_bytes = q->wire_bytes();
    f.qwz_calls = q->calls;
  }
  if (const auto* q = e.quantized_gradients_stats()) {
    f.qgz = true;
    f.qgz_bytes = q->wire_bytes();
    f.qgz_calls = q->calls;
    f.qgz_fallbacks = q->fallbacks;
    if (f.hierarchical) add(q->links);
  }
  return f;
}

}  // namespace gpt_demo
