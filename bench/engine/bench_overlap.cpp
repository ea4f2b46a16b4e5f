// Overlap of gradient reduction with backward (ZeRO stage 2), and of parameter gathers with compute
// (ZeRO stage 3, prefetching), on the threads communicator with 2 ranks.
//
// The threads back end moves bytes at memory speed, so to see scheduling this benchmark wraps it in a
// communicator whose operations complete no sooner than a modelled network would deliver them
// (latency + bytes / bandwidth, counted from the moment the operation is issued; ModelledLink in
// bench/common/modelled_link.hpp, shared with bench/compress). Each layer's
// forward and backward spins for a fixed time. With overlap the step should take about
// max(compute, communication); without it, compute + communication.
//
//   build/default/bench/engine/zerotk_bench_overlap --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/modelled_link.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

namespace {

using Clock = std::chrono::steady_clock;

void spin_for(std::chrono::microseconds d) {
  const auto until = Clock::now() + d;
  while (Clock::now() < until) {
  }
}

using zerotk::bench::ModelledLink;

struct Layer {
  zerotk::Param<zerotk::half> w;
  std::chrono::microseconds compute;
  Layer(int i, std::size_t n, std::chrono::microseconds c) : w("layer" + std::to_string(i), {n}), compute(c) {}
  template <class V>
  void parameters(V&& v) {
    v(w.name(), w);
  }
};
struct Model {
  std::vector<Layer> layers;
  template <class V>
  void parameters(V&& v) {
    for (auto& l : layers) l.parameters(v);
  }
};

constexpr int kLayers = 8;
constexpr std::size_t kLayerNumel = 1 << 16;  // 128 KiB of fp16 per layer: one bucket each
constexpr int kSteps = 6;

/// args: overlap (0: none, 1: reductions with backward, 2: also the parameter all-gather with the next
/// forward), compute us per layer (forward and backward each), link MB/s (0: no delay)
void BM_Stage2Step(benchmark::State& state) {
  const bool overlap = state.range(0) != 0;
  const bool overlap_gather = state.range(0) == 2;
  const auto compute = std::chrono::microseconds(state.range(1));
  const double gbps = static_cast<double>(state.range(2)) / 1000.0;  // argument in MB/s
  using Engine = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<2>>, zerotk::Optimizer<zerotk::AdamW>,
                                zerotk::Precision<zerotk::fp16>, zerotk::Bucketer<zerotk::Bytes<(128 << 10)>>>;
  for (auto _ : state) {
    double seconds = 0;
    zerotk::comm::run_threads(2, [&](zerotk::comm::ThreadsCommunicator& threads) {
      ModelledLink<zerotk::comm::ThreadsCommunicator> link(threads, gbps > 0 ? gbps : 1e9, std::chrono::microseconds(gbps > 0 ? 20 : 0));
      Model model;
      for (int i = 0; i < kLayers; ++i) model.layers.emplace_back(i, kLayerNumel, compute);
      zerotk::EngineOptions o;
      o.overlap_comm = overlap;
      o.overlap_param_gather = overlap_gather;
      o.bucket_buffers = 3;
      Engine engine(link, model, o);
      engine.initialize_master();
      Clock::time_point t0;
      for (int s = -1; s < kSteps; ++s) {
        if (s == 0) t0 = Clock::now();  // step -1 warms up
        for (auto& l : model.layers) {
          auto scope = engine.forward(l);
          spin_for(l.compute);
        }
        for (auto it = model.layers.rbegin(); it != model.layers.rend(); ++it) {
          auto scope = engine.backward(*it);
          spin_for(it->compute);
        }
        engine.step(0.0);
      }
      engine.synchronize();
      if (threads.rank() == 0) seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    });
    state.SetIterationTime(seconds / kSteps);
  }
  state.counters["compute_ms"] = 2.0 * kLayers * static_cast<double>(compute.count()) / 1e3;
}

/// ZeRO stage 3 on the same model and link: every layer gathered before its forward and again
/// before its backward, released after (reuse off: 3 Psi of traffic), the next layers prefetched
/// within `prefetch` elements. args: prefetch (layers' worth), compute us per layer, link MB/s.
/// Counter vs_bound = step time / max(compute, link busy time per step): 1.0 is perfect overlap;
/// vs_phase_bound divides by the sum over forward and backward of max(compute, link) instead.
void BM_Stage3Step(benchmark::State& state) {
  const auto prefetch_layers = static_cast<std::size_t>(state.range(0));
  const auto compute = std::chrono::microseconds(state.range(1));
  const double gbps = static_cast<double>(state.range(2)) / 1000.0;
  using Engine = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<3>>, zerotk::Optimizer<zerotk::AdamW>,
                                zerotk::Precision<zerotk::fp16>, zerotk::Bucketer<zerotk::Bytes<(128 << 10)>>>;
  double link_ms = 0, fwd_ms = 0, bwd_ms = 0;  // link busy per step: all, issued in forward, in backward
  for (auto _ : state) {
    double seconds = 0;
    zerotk::comm::run_threads(2, [&](zerotk::comm::ThreadsCommunicator& threads) {
      ModelledLink<zerotk::comm::ThreadsCommunicator> link(threads, gbps, std::chrono::microseconds(20));
      Model model;
      for (int i = 0; i < kLayers; ++i) model.layers.emplace_back(i, kLayerNumel, compute);
      zerotk::EngineOptions o;
      o.stage3.param_persistence_threshold = 0;
      o.stage3.max_reuse_distance = 0;
      o.stage3.prefetch_bucket_size = prefetch_layers * kLayerNumel;
      Engine engine(link, model, o);
      engine.initialize_master();
      Clock::time_point t0;
      std::chrono::microseconds busy0{0}, fwd{0}, bwd{0};
      for (int s = -1; s < kSteps; ++s) {
        if (s == 0) t0 = Clock::now(), busy0 = link.busy();  // step -1 records the order
        const auto b0 = link.busy();
        for (auto& l : model.layers) {
          auto scope = engine.forward(l);
          spin_for(l.compute);
        }
        const auto b1 = link.busy();
        for (auto it = model.layers.rbegin(); it != model.layers.rend(); ++it) {
          auto scope = engine.backward(*it);
          spin_for(it->compute);
        }
        if (s >= 0) fwd += b1 - b0, bwd += link.busy() - b1;
        engine.step(0.0);
      }
      engine.synchronize();
      if (threads.rank() == 0) {
        seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        link_ms = std::chrono::duration<double, std::milli>(link.busy() - busy0).count() / kSteps;
        fwd_ms = std::chrono::duration<double, std::milli>(fwd).count() / kSteps;
        bwd_ms = std::chrono::duration<double, std::milli>(bwd).count() / kSteps;
      }
    });
    state.SetIterationTime(seconds / kSteps);
    const double compute_ms = 2.0 * kLayers * static_cast<double>(compute.count()) / 1e3;
    state.counters["compute_ms"] = compute_ms;
    state.counters["link_ms"] = link_ms;
    state.counters["vs_bound"] = seconds / kSteps * 1e3 / std::max(compute_ms, link_ms);
    // Forward issues only gathers; backward issues gathers and reduce-scatters, so its link time is
    // twice the forward's: with compute = link overall, backward is link-bound and forward not.
    // The phase bound takes each phase's max on its own (step() is outside both).
    state.counters["vs_phase_bound"] =
        seconds / kSteps * 1e3 / (std::max(compute_ms / 2, fwd_ms) + std::max(compute_ms / 2, bwd_ms));
  }
}

}  // namespace

// overlap on/off x {compute only, comm only, both}. 8 layers x 128 KiB: reduce-scatter + all-gather
// move 2 x 1 MiB x (W-1)/W = 1 MiB per step; at 100 MB/s that is ~10.5 ms of link time (half of it
// the reduce-scatters that can hide behind backward, half the all-gathers at the end of the step,
// which overlap=2 hides behind the next forward).
BENCHMARK(BM_Stage2Step)->ArgNames({"overlap", "compute_us", "MBps"})
    ->Args({1, 1000, 0})->Args({1, 0, 100})->Args({1, 1000, 100})->Args({0, 1000, 100})->Args({2, 1000, 100})
    ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);

// Stage 3 moves 3 x 1 MiB x (W-1)/W = 1.5 MiB per step: at 100 MB/s ~16 ms of link time against
// 16 ms of compute (the hardest case: both equal), at 200 MB/s ~8 ms. Prefetch 0 shows the cost of
// gathering each layer only when its scope opens.
BENCHMARK(BM_Stage3Step)->ArgNames({"prefetch_layers", "compute_us", "MBps"})
    ->Args({0, 1000, 100})->Args({1, 1000, 100})->Args({2, 1000, 100})->Args({2, 1000, 200})->Args({2, 0, 100})->Args({2, 1000, 100000})
    ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);

BENCHMARK_MAIN();
