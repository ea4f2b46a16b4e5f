// Overlap of gradient reduction with backward (ZeRO stage 2, threads communicator, 2 ranks).
//
// The threads back end moves bytes at memory speed, so to see scheduling this benchmark wraps it in a
// communicator whose operations complete no sooner than a modelled network would deliver them
// (latency + bytes / bandwidth, counted from the moment the operation is issued). Each layer's
// forward and backward spins for a fixed time. With overlap the step should take about
// max(compute, communication); without it, compute + communication.
//
//   build/default/bench/engine/zerotk_bench_overlap --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "zerotk/comm/threads.hpp"
#include "zerotk/engine.hpp"

namespace {

using Clock = std::chrono::steady_clock;

void spin_for(std::chrono::microseconds d) {
  const auto until = Clock::now() + d;
  while (Clock::now() < until) {
  }
}

/// A communicator that completes each operation no sooner than a modelled link would.
template <class Inner>
class ModelledLink {
 public:
  ModelledLink(Inner& inner, double gbytes_per_s, std::chrono::microseconds latency)
      : inner_(&inner), bytes_per_us_(gbytes_per_s * 1e3), latency_(latency) {}
  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }
  const zerotk::comm::CommStats& stats() const { return inner_->stats(); }

#define ZT_FORWARD(name)                                      \
  template <class... A>                                                        \
  zerotk::comm::Work name(A&&... a) {                                          \
    const std::uint64_t before = inner_->stats().total_wire_bytes();           \
    zerotk::comm::Work w = inner_->name(std::forward<A>(a)...);                \
    const std::uint64_t bytes = inner_->stats().total_wire_bytes() - before;   \
    return delayed(std::move(w), bytes);                                       \
  }
  ZT_FORWARD(all_reduce)
  ZT_FORWARD(reduce_scatter)
  ZT_FORWARD(all_gather)
  ZT_FORWARD(all_gatherv)
  ZT_FORWARD(broadcast)
  ZT_FORWARD(reduce)
  ZT_FORWARD(all_to_all)
  ZT_FORWARD(send)
  ZT_FORWARD(recv)
  ZT_FORWARD(barrier)
#undef ZT_FORWARD
  ModelledLink split(int, int) { throw zerotk::usage_error("ModelledLink cannot split"); }

 private:
  struct State final : zerotk::comm::WorkState {
    zerotk::comm::Work inner;
    Clock::time_point done_at;
    void wait() override {
      inner.wait();
      std::this_thread::sleep_until(done_at);
    }
    bool test() override { return Clock::now() >= done_at && inner.test(); }
  };
  zerotk::comm::Work delayed(zerotk::comm::Work w, std::uint64_t bytes) {
    // The link is busy with earlier operations first: operations queue behind each other.
    const auto start = std::max(Clock::now(), link_free_);
    link_free_ = start + latency_ + std::chrono::microseconds(static_cast<long long>(double(bytes) / bytes_per_us_));
    auto s = std::make_unique<State>();
    s->inner = std::move(w);
    s->done_at = link_free_;
    return zerotk::comm::Work(std::move(s));
  }
  Inner* inner_;
  double bytes_per_us_;
  std::chrono::microseconds latency_;
  Clock::time_point link_free_{};
};

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

}  // namespace

// overlap on/off x {compute only, comm only, both}. 8 layers x 128 KiB: reduce-scatter + all-gather
// move 2 x 1 MiB x (W-1)/W = 1 MiB per step; at 100 MB/s that is ~10.5 ms of link time (half of it
// the reduce-scatters that can hide behind backward, half the all-gathers at the end of the step,
// which overlap=2 hides behind the next forward).
BENCHMARK(BM_Stage2Step)->ArgNames({"overlap", "compute_us", "MBps"})
    ->Args({1, 1000, 0})->Args({1, 0, 100})->Args({1, 1000, 100})->Args({0, 1000, 100})->Args({2, 1000, 100})
    ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);

BENCHMARK_MAIN();
