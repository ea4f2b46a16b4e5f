// Topology-aware collectives in the engine (issue 46), on simulated links with a slow link across
// nodes: the engine's step time with the data group hierarchical (communication.topology 2:
// reduce-scatter inside the node, then across nodes on 1/L of the data; all-gather the mirror
// image; docs/comm.md) against the flat ring over the same ranks; and ZeRO++'s qwZ / qgZ inter-node
// bytes against plain stage 3.
//
// Time is simulated (bench/common/simulated_links.hpp): each rank's virtual clock advances by the
// modelled compute of each layer and moves to each collective's modelled completion (ring: steps x
// latency + wire bytes / bandwidth, over the inter-node link whenever the group spans two nodes;
// one link of each kind per rank). The threads back end still moves and reduces the real data, the
// engine runs its real schedule (overlap of reductions with backward, stage 3's prefetch, the
// hierarchical phases that run to completion inside the call), and the figures do not depend on the
// load of the machine: every run gives the same numbers. Real CPU time (the engine's copies and
// the threads back end's sums, which compete for 2 cores here) is not in the simulated time; it is
// reported beside it (cpu_ms: mean thread CPU time per rank per step).
//
// Model: 8 layers of 256 Ki bf16 parameters (2 Mi in all, 4 MiB), one bucket per layer; forward and
// backward of each layer take `compute_us` of simulated time each. Links: across nodes 1 GB/s and
// 10 us per ring step, inside a node 10x the bandwidth (10 GB/s) and 2 us.
//
//   build/default/bench/engine/zerotk_bench_topology      (--benchmark_format=json for a file: the
//                                                         csv reporter aborts on counters that differ between benchmarks)
//
// No repetitions are needed: the simulated figures are deterministic (two runs agree to the last
// digit in every counter but the cpu_ms ones). bench/RESULTS.md, "Topology".
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/simulated_links.hpp"
#include "common/thread_cpu.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

namespace {

using zerotk::bench::NetworkModel;
using zerotk::bench::SimulatedLinks;
using zerotk::bench::SimulatedNetwork;
using zerotk::bench::VirtualClock;
using Links = SimulatedLinks<zerotk::comm::ThreadsCommunicator>;

constexpr int kLayers = 8;
constexpr std::size_t kLayerNumel = std::size_t{1} << 18;  // 512 KiB of bf16: one bucket each
constexpr int kSteps = 4;                                  // timed, after one warm-up step

template <int S>
using Engine = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<S>>, zerotk::Optimizer<zerotk::AdamW>,
                              zerotk::Precision<zerotk::bf16>, zerotk::Bucketer<zerotk::Bytes<(512 << 10)>>>;

struct Layer {
  zerotk::Param<zerotk::bfloat16> w;
  Layer(int i, std::size_t n) : w("layer" + std::to_string(i), {n}) {}
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

NetworkModel network(int ranks_per_node) {
  return NetworkModel{.ranks_per_node = ranks_per_node, .intra = {10.0, 2.0}, .inter = {1.0, 10.0}};
}

/// What one configuration of one run gives, per step (rank 0's bytes; the slowest rank's time).
struct Figures {
  double step_ms = 0;
  double cpu_ms = 0;              // mean over ranks of the thread CPU time per step
  std::uint64_t inter_bytes = 0;  // wire bytes rank 0 sent across nodes per step
  std::uint64_t intra_bytes = 0;  // ... inside its node
};

enum class Plus { none, qwz, qgz, both, both_hpz };
constexpr const char* kPlusNames[] = {"plain", "qwZ", "qgZ", "qwZ+qgZ", "qwZ+qgZ+hpZ"};

/// Bytes rank 0's engine sent per link level so far: the hierarchical data group's levels, qgZ's
/// level communicators, and hpZ's group (inside the node here).
template <class E>
void link_bytes(const E& e, std::uint64_t& intra, std::uint64_t& inter) {
  intra = inter = 0;
  if (const auto* l = e.link_stats()) intra += (*l)[0].wire_bytes, inter += (*l)[1].wire_bytes;
  if (const auto* q = e.quantized_gradients_stats()) intra += q->links[0].wire_bytes, inter += q->links[1].wire_bytes;
  if (const auto* g = e.group_comm_stats()) intra += g->total_wire_bytes();
}

/// Steps of Engine<S> on `nodes` x `per_node` thread ranks over simulated links; `hierarchical`:
/// communication.topology 2 with `per_node` ranks per node, else flat.
template <int S>
Figures run(int nodes, int per_node, double compute_us, bool hierarchical, Plus plus = Plus::none) {
  const int world = nodes * per_node;
  SimulatedNetwork net(network(per_node));
  Figures out;
  std::mutex mu;
  std::vector<double> step_us(static_cast<std::size_t>(world)), cpu_ms(static_cast<std::size_t>(world));
  zerotk::comm::run_threads(world, [&](zerotk::comm::ThreadsCommunicator& threads) {
    VirtualClock clock;
    Links links(threads, net, clock);
    Model model;
    for (int i = 0; i < kLayers; ++i) model.layers.emplace_back(i, kLayerNumel);
    zerotk::EngineOptions o;
    if (hierarchical) {
      o.communication.topology.levels = 2;
      o.communication.topology.ranks_per_node = per_node;
    }
    if constexpr (S == 3) {
      o.stage3.param_persistence_threshold = 0;
      o.stage3.max_reuse_distance = 0;  // every layer gathered for forward and again for backward
      o.stage3.prefetch_bucket_size = 2 * kLayerNumel;
      o.stage3.quantized_weights = plus == Plus::qwz || plus == Plus::both || plus == Plus::both_hpz;
      o.stage3.quantized_gradients = plus == Plus::qgz || plus == Plus::both || plus == Plus::both_hpz;
      if (plus == Plus::both_hpz) o.stage3.reshard_after_forward = zerotk::ReshardAfterForward::group(per_node);
    }
    Engine<S> engine(links, model, o);
    {  // values to quantize and gradients to reduce: a ramp of small numbers per layer
      auto g = engine.gather(model);
      for (auto& l : model.layers) {
        for (std::size_t i = 0; i < l.w.numel(); ++i) l.w.data()[i] = zerotk::bfloat16(0.01f * static_cast<float>(i % 97) - 0.48f);
      }
    }
    engine.initialize_master();
    double t0 = 0, c0 = 0;
    std::uint64_t intra0 = 0, inter0 = 0;
    for (int s = -1; s < kSteps; ++s) {
      if (s == 0) {  // step -1 warms up (stage 3 records its fetch order)
        t0 = clock.now_us();
        c0 = zerotk::bench::thread_cpu_ms();
        link_bytes(engine, intra0, inter0);
      }
      for (auto& l : model.layers) {
        auto scope = engine.forward(l);
        clock.advance(compute_us);
      }
      for (auto it = model.layers.rbegin(); it != model.layers.rend(); ++it) {
        auto scope = engine.backward(*it);
        for (std::size_t i = 0; i < it->w.numel(); ++i) it->w.grad()[i] = zerotk::bfloat16(1e-3f * static_cast<float>((i + static_cast<std::size_t>(threads.rank())) % 13));
        clock.advance(compute_us);
      }
      (void)engine.step(0.5);
    }
    engine.synchronize();
    std::uint64_t intra1 = 0, inter1 = 0;
    link_bytes(engine, intra1, inter1);
    const auto r = static_cast<std::size_t>(threads.rank());
    std::lock_guard lock(mu);
    step_us[r] = (clock.now_us() - t0) / kSteps;
    cpu_ms[r] = (zerotk::bench::thread_cpu_ms() - c0) / kSteps;
    if (r == 0) {
      out.inter_bytes = (inter1 - inter0) / kSteps;
      out.intra_bytes = (intra1 - intra0) / kSteps;
    }
  });
  out.step_ms = *std::max_element(step_us.begin(), step_us.end()) / 1e3;
  double c = 0;
  for (double x : cpu_ms) c += x;
  out.cpu_ms = c / static_cast<double>(world);
  return out;
}

/// args: stage (2, 3), ranks per node (2 nodes), compute us per layer and pass. Time = the
/// hierarchical step; speedup = flat / hierarchical, both in this iteration.
void BM_HierarchicalStep(benchmark::State& state) {
  const int stage = static_cast<int>(state.range(0)), per_node = static_cast<int>(state.range(1));
  const double compute_us = static_cast<double>(state.range(2));
  Figures flat, hier;
  for (auto _ : state) {
    flat = stage == 2 ? run<2>(2, per_node, compute_us, false) : run<3>(2, per_node, compute_us, false);
    hier = stage == 2 ? run<2>(2, per_node, compute_us, true) : run<3>(2, per_node, compute_us, true);
    state.SetIterationTime(hier.step_ms / 1e3);
  }
  state.counters["flat_ms"] = flat.step_ms;
  state.counters["hier_ms"] = hier.step_ms;
  state.counters["speedup"] = flat.step_ms / hier.step_ms;
  // The same ratio from docs/comm.md's bytes per link level, bandwidth terms only (no latency, no
  // overlap): flat (W-1)/W P / inter against (L-1)/L P / intra + (N-1)/N P/L / inter.
  const NetworkModel m = network(per_node);
  const double nodes = 2, l = per_node, w = nodes * l;
  state.counters["bw_formula"] = ((w - 1) / w / m.inter.gbytes_per_s) /
                                 ((l - 1) / l / m.intra.gbytes_per_s + (nodes - 1) / nodes / l / m.inter.gbytes_per_s);
  state.counters["compute_ms"] = 2.0 * kLayers * compute_us / 1e3;
  state.counters["flat_cpu_ms"] = flat.cpu_ms;
  state.counters["hier_cpu_ms"] = hier.cpu_ms;
  state.counters["hier_inter_MB"] = static_cast<double>(hier.inter_bytes) / 1e6;
  state.counters["hier_intra_MB"] = static_cast<double>(hier.intra_bytes) / 1e6;
}

/// Stage 3 on the hierarchical data group, plain against ZeRO++ (args: variant 1-4 = qwZ, qgZ,
/// qwZ+qgZ, qwZ+qgZ+hpZ within the node; ranks per node; compute us). vs_plain = plain inter-node
/// bytes / the variant's, both per step in this iteration (the >= 3x the issue expects).
void BM_QuantizedStage3(benchmark::State& state) {
  const auto plus = static_cast<Plus>(state.range(0));
  const int per_node = static_cast<int>(state.range(1));
  const double compute_us = static_cast<double>(state.range(2));
  Figures plain, variant;
  for (auto _ : state) {
    plain = run<3>(2, per_node, compute_us, true);
    variant = run<3>(2, per_node, compute_us, true, plus);
    state.SetIterationTime(variant.step_ms / 1e3);
  }
  state.SetLabel(kPlusNames[static_cast<int>(plus)]);
  state.counters["plain_inter_MB"] = static_cast<double>(plain.inter_bytes) / 1e6;
  state.counters["inter_MB"] = static_cast<double>(variant.inter_bytes) / 1e6;
  state.counters["vs_plain"] = static_cast<double>(plain.inter_bytes) / static_cast<double>(variant.inter_bytes);
  state.counters["intra_MB"] = static_cast<double>(variant.intra_bytes) / 1e6;
  state.counters["plain_ms"] = plain.step_ms;
  state.counters["speedup"] = plain.step_ms / variant.step_ms;
  state.counters["cpu_ms"] = variant.cpu_ms;
  state.counters["plain_cpu_ms"] = plain.cpu_ms;
}

}  // namespace

// 2 nodes x 2 and x 4 ranks; compute 0 (communication alone) and 500 us per layer and pass (8 ms a
// step, about what the flat ring's 6 MiB at stage 2 takes across nodes).
BENCHMARK(BM_HierarchicalStep)->ArgNames({"stage", "per_node", "compute_us"})
    ->Args({2, 2, 0})->Args({2, 2, 500})->Args({2, 4, 0})->Args({2, 4, 500})
    ->Args({3, 2, 0})->Args({3, 2, 500})->Args({3, 4, 0})->Args({3, 4, 500})
    ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);

BENCHMARK(BM_QuantizedStage3)->ArgNames({"variant", "per_node", "compute_us"})
    ->Args({1, 2, 500})->Args({2, 2, 500})->Args({3, 2, 500})->Args({4, 2, 500})
    ->Args({3, 4, 500})->Args({4, 4, 500})
    ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);

BENCHMARK_MAIN();
