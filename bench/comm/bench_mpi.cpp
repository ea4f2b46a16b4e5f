// MPI communicator against raw MPI calls of the same bytes, in the same binary and run. Each
// iteration times, back to back on the same buffers: the raw nonblocking call + MPI_Wait (what
// zerotk issues), the raw blocking call (what a hand-written trainer would call), zerotk's call +
// Work::wait (which includes the signature check: one 96-byte all-reduce before the data call),
// and that signature all-reduce alone. Counters give each as the median per-call time (one
// preemption on a shared machine costs milliseconds, so means would measure the scheduler), the
// overhead, and the ratio zerotk / raw (of the medians, and paired: the median of per-iteration
// ratios, the figure to read on a loaded machine).
//
// mpi_pipelined/: 8 operations issued back to back, then all waited (the engine's bucketed
// pattern): zerotk's signature exchanges overlap the earlier operations' data; raw = 8 MPI_I*
// calls + MPI_Waitall on the same 8 buffers.
//
// mpi_self/: the same at 4 KiB with every rank alone in its communicator (the MPI call is a local
// copy and no signature is exchanged), which isolates the wrapper's per-call cost.
//
// The threads back end runs the same ops with W = np threads inside rank 0 while the other ranks
// sleep, so the threads/MPI ratio comes from one run.
//
//   mpiexec --bind-to none -np 2 build/default/bench/comm/zerotk_bench_comm_mpi \
//       --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// (--bind-to none: rank 0's threads need every core; as root add --allow-run-as-root.)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "zerotk/comm/mpi.hpp"
#include "zerotk/comm/threads.hpp"

namespace {

using zerotk::DType;
using zerotk::comm::MpiCommunicator;
using zerotk::comm::ReduceOp;

enum class Op { all_reduce, reduce_scatter, all_gather };

MpiCommunicator* g_world = nullptr;
MpiCommunicator* g_self = nullptr;  // this rank alone

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

/// Median over iterations of zerotk / raw measured back to back in the same iteration: a
/// preemption that hits one of the pair moves one ratio, not the median, and slow drifts of load
/// cancel within a pair.
double paired_ratio(const std::vector<double>& ours, const std::vector<double>& raw) {
  std::vector<double> r;
  for (std::size_t i = 0; i < ours.size() && i < raw.size(); ++i) {
    if (raw[i] > 0) r.push_back(ours[i] / raw[i]);
  }
  return median(std::move(r));
}

double bus_factor(Op op, int w) { return op == Op::all_reduce ? 2.0 * (w - 1) / w : static_cast<double>(w - 1) / w; }

/// Buffers of one rank (nccl-tests sizes: see bench_threads.cpp).
struct Buffers {
  std::vector<float> send, recv;
  Buffers(Op op, std::size_t bytes, int w) {
    const std::size_t n = bytes / sizeof(float), block = n / static_cast<std::size_t>(w);
    switch (op) {
      case Op::all_reduce: send.assign(n, 1.f), recv.assign(n, 0.f); break;
      case Op::reduce_scatter: send.assign(block * static_cast<std::size_t>(w), 1.f), recv.assign(block, 0.f); break;
      case Op::all_gather: send.assign(block, 1.f), recv.assign(block * static_cast<std::size_t>(w), 0.f); break;
    }
  }
};

void raw_nonblocking(Op op, MPI_Comm comm, Buffers& b) {
  MPI_Request req;
  const int n = static_cast<int>(op == Op::all_gather ? b.send.size() : b.recv.size());
  switch (op) {
    case Op::all_reduce: MPI_Iallreduce(b.send.data(), b.recv.data(), n, MPI_FLOAT, MPI_SUM, comm, &req); break;
    case Op::reduce_scatter: MPI_Ireduce_scatter_block(b.send.data(), b.recv.data(), n, MPI_FLOAT, MPI_SUM, comm, &req); break;
    case Op::all_gather: MPI_Iallgather(b.send.data(), n, MPI_FLOAT, b.recv.data(), n, MPI_FLOAT, comm, &req); break;
  }
  MPI_Wait(&req, MPI_STATUS_IGNORE);
}

void raw_blocking(Op op, MPI_Comm comm, Buffers& b) {
  const int n = static_cast<int>(op == Op::all_gather ? b.send.size() : b.recv.size());
  switch (op) {
    case Op::all_reduce: MPI_Allreduce(b.send.data(), b.recv.data(), n, MPI_FLOAT, MPI_SUM, comm); break;
    case Op::reduce_scatter: MPI_Reduce_scatter_block(b.send.data(), b.recv.data(), n, MPI_FLOAT, MPI_SUM, comm); break;
    case Op::all_gather: MPI_Allgather(b.send.data(), n, MPI_FLOAT, b.recv.data(), n, MPI_FLOAT, comm); break;
  }
}

/// The signature exchange zerotk runs before each collective, alone (its own duplicate communicator).
struct SignatureExchange {
  MPI_Comm comm = MPI_COMM_NULL;
  zerotk::comm::detail::mpi::SignaturePair pair{};
  explicit SignatureExchange(MPI_Comm parent) { MPI_Comm_dup(parent, &comm); }
  ~SignatureExchange() { MPI_Comm_free(&comm); }
  void run() {
    const auto& u = zerotk::comm::detail::mpi::UserOps::get();
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, &pair, 1, u.signature_type, u.signature_op, comm, &req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
};

template <class C>
zerotk::comm::Work zerotk_op(Op op, C& c, Buffers& b) {
  switch (op) {
    case Op::all_reduce: return c.all_reduce(b.send.data(), b.recv.data(), b.send.size(), DType::fp32, ReduceOp::sum);
    case Op::reduce_scatter:
      return c.reduce_scatter(b.send.data(), b.recv.data(), b.recv.size(), DType::fp32, ReduceOp::sum);
    case Op::all_gather: return c.all_gather(b.send.data(), b.recv.data(), b.send.size(), DType::fp32);
  }
  return {};
}

/// `self`: every rank alone in its own communicator, so the MPI call is a local copy and the
/// difference between raw and zerotk is the wrapper's own cost, free of the peers' scheduling.
void BM_mpi(benchmark::State& state, Op op, bool self) {
  MpiCommunicator& c = self ? *g_self : *g_world;
  const std::size_t bytes = static_cast<std::size_t>(state.range(0));
  Buffers b(op, bytes, c.size());
  raw_nonblocking(op, c.native(), b);  // warm-up: connections, first touch
  zerotk_op(op, c, b).wait();
  // Per-call times; medians, not means: one preemption on a shared machine costs milliseconds.
  SignatureExchange sig(c.native());
  sig.run();
  std::vector<double> raw, blocking, ours, signature;
  const auto n_iter = static_cast<std::size_t>(state.max_iterations);
  raw.reserve(n_iter), blocking.reserve(n_iter), ours.reserve(n_iter), signature.reserve(n_iter);
  bool zerotk_first = false;  // alternate the order so drift and rank skew hit both alike
  for (auto _ : state) {
    double t_ours = 0;
    if (zerotk_first) {
      const double t0 = MPI_Wtime();
      zerotk_op(op, c, b).wait();
      t_ours = MPI_Wtime() - t0;
    }
    const double t1 = MPI_Wtime();
    raw_nonblocking(op, c.native(), b);
    const double t2 = MPI_Wtime();
    raw_blocking(op, c.native(), b);
    const double t3 = MPI_Wtime();
    if (!zerotk_first) {
      zerotk_op(op, c, b).wait();
      t_ours = MPI_Wtime() - t3;
    }
    zerotk_first = !zerotk_first;
    if (c.size() > 1) {
      const double t4 = MPI_Wtime();
      sig.run();
      signature.push_back(MPI_Wtime() - t4);
    }
    raw.push_back(t2 - t1);
    blocking.push_back(t3 - t2);
    ours.push_back(t_ours);
    state.SetIterationTime(t_ours);
  }
  const double t_raw = median(raw), t_blocking = median(blocking), t_ours = median(ours);
  const double bus = static_cast<double>(bytes) * bus_factor(op, c.size()) / 1e9;
  state.counters["raw_us"] = t_raw * 1e6;
  state.counters["raw_blocking_us"] = t_blocking * 1e6;
  state.counters["zerotk_us"] = t_ours * 1e6;
  state.counters["overhead_us"] = (t_ours - t_raw) * 1e6;
  state.counters["overhead_pct"] = (t_ours - t_raw) / t_raw * 100.0;
  state.counters["ratio"] = t_ours / t_raw;  // zerotk / raw MPI of the same bytes
  state.counters["paired_ratio"] = paired_ratio(ours, raw);
  state.counters["signature_us"] = median(signature) * 1e6;  // the check alone
  state.counters["vs_bound"] = t_raw / t_ours;  // bound: the same raw MPI call
  state.counters["bus_GBps"] = bus / t_ours;
  state.counters["raw_bus_GBps"] = bus / t_raw;
  state.counters["raw_blocking_bus_GBps"] = bus / t_blocking;
}

/// 8 operations in flight, then waited: zerotk against raw MPI_I* + MPI_Waitall (same buffers).
void BM_mpi_pipelined(benchmark::State& state, Op op) {
  constexpr int kInFlight = 8;
  MpiCommunicator& c = *g_world;
  const std::size_t bytes = static_cast<std::size_t>(state.range(0));
  std::vector<Buffers> bufs;
  for (int i = 0; i < kInFlight; ++i) bufs.emplace_back(op, bytes, c.size());
  const auto raw_batch = [&] {
    MPI_Request req[kInFlight];
    for (int i = 0; i < kInFlight; ++i) {
      Buffers& b = bufs[static_cast<std::size_t>(i)];
      const int n = static_cast<int>(op == Op::all_gather ? b.send.size() : b.recv.size());
      switch (op) {
        case Op::all_reduce: MPI_Iallreduce(b.send.data(), b.recv.data(), n, MPI_FLOAT, MPI_SUM, c.native(), &req[i]); break;
        case Op::reduce_scatter:
          MPI_Ireduce_scatter_block(b.send.data(), b.recv.data(), n, MPI_FLOAT, MPI_SUM, c.native(), &req[i]);
          break;
        case Op::all_gather: MPI_Iallgather(b.send.data(), n, MPI_FLOAT, b.recv.data(), n, MPI_FLOAT, c.native(), &req[i]); break;
      }
    }
    MPI_Waitall(kInFlight, req, MPI_STATUSES_IGNORE);
  };
  const auto zerotk_batch = [&] {
    std::vector<zerotk::comm::Work> works;
    for (auto& b : bufs) works.push_back(zerotk_op(op, c, b));
    for (auto& w : works) w.wait();
  };
  raw_batch();
  zerotk_batch();
  std::vector<double> raw, ours;
  bool zerotk_first = false;
  for (auto _ : state) {
    double t_ours = 0, t_raw = 0;
    for (int k = 0; k < 2; ++k) {
      const double t0 = MPI_Wtime();
      if (zerotk_first == (k == 0)) {
        zerotk_batch();
        t_ours = MPI_Wtime() - t0;
      } else {
        raw_batch();
        t_raw = MPI_Wtime() - t0;
      }
    }
    zerotk_first = !zerotk_first;
    raw.push_back(t_raw);
    ours.push_back(t_ours);
    state.SetIterationTime(t_ours);
  }
  const double t_raw = median(raw), t_ours = median(ours);
  state.counters["raw_us"] = t_raw * 1e6;
  state.counters["zerotk_us"] = t_ours * 1e6;
  state.counters["overhead_us"] = (t_ours - t_raw) * 1e6;
  state.counters["ratio"] = t_ours / t_raw;
  state.counters["paired_ratio"] = paired_ratio(ours, raw);
  state.counters["vs_bound"] = t_raw / t_ours;
}

/// Ranks other than 0 wait here without spinning while rank 0 runs threads alone.
void sleep_until_all_arrive() {
  MPI_Request req;
  MPI_Ibarrier(g_world->native(), &req);
  int done = 0;
  while (!done) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

/// W = np threads in rank 0, the same ops and sizes: the shared-memory peer of the MPI numbers.
void BM_threads(benchmark::State& state, Op op) {
  const int w = g_world->size();
  const std::size_t bytes = static_cast<std::size_t>(state.range(0));
  if (g_world->rank() != 0) {
    for (auto _ : state) state.SetIterationTime(1e-9);
    sleep_until_all_arrive();
    return;
  }
  auto comms = zerotk::comm::make_threads_communicators(w);
  std::vector<Buffers> bufs;
  for (int r = 0; r < w; ++r) bufs.emplace_back(op, bytes, w);
  const auto iters = static_cast<std::size_t>(state.max_iterations);
  std::vector<std::thread> helpers;
  for (int r = 1; r < w; ++r) {
    helpers.emplace_back([&, r] {
      for (std::size_t i = 0; i <= iters; ++i) zerotk_op(op, comms[static_cast<std::size_t>(r)], bufs[static_cast<std::size_t>(r)]).wait();
    });
  }
  zerotk_op(op, comms[0], bufs[0]).wait();  // warm-up
  std::vector<double> times;
  times.reserve(iters);
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    zerotk_op(op, comms[0], bufs[0]).wait();
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    times.push_back(dt.count());
    state.SetIterationTime(dt.count());
  }
  for (auto& t : helpers) t.join();
  const double t_op = median(times);
  state.counters["zerotk_us"] = t_op * 1e6;
  state.counters["bus_GBps"] = static_cast<double>(bytes) * bus_factor(op, w) / t_op / 1e9;
  state.counters["vs_bound"] = 0;  // the peer is the mpi/ benchmark of the same op and size
  sleep_until_all_arrive();
}

/// Non-root ranks run every benchmark but print nothing.
class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

void register_all() {
  const std::pair<const char*, Op> ops[] = {
      {"all_reduce", Op::all_reduce}, {"reduce_scatter", Op::reduce_scatter}, {"all_gather", Op::all_gather}};
  const std::int64_t sizes[] = {std::int64_t{4} << 10, std::int64_t{64} << 10, std::int64_t{1} << 20,
                                std::int64_t{16} << 20, std::int64_t{256} << 20};
  for (const auto& [name, op] : ops) {
    for (std::int64_t bytes : sizes) {
      // Fixed iteration counts: every rank must run the same number of collectives.
      const std::int64_t iters = std::clamp<std::int64_t>((std::int64_t{256} << 20) / bytes, 3, 1000);
      benchmark::RegisterBenchmark(("mpi/" + std::string(name)).c_str(),
                                   [op = op](benchmark::State& s) { BM_mpi(s, op, false); })
          ->Arg(bytes)
          ->Iterations(iters)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
      if (bytes == (std::int64_t{4} << 10)) {
        benchmark::RegisterBenchmark(("mpi_self/" + std::string(name)).c_str(),
                                     [op = op](benchmark::State& s) { BM_mpi(s, op, true); })
            ->Arg(bytes)
            ->Iterations(20000)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
      if (bytes <= (std::int64_t{16} << 20)) {
        benchmark::RegisterBenchmark(("mpi_pipelined/" + std::string(name)).c_str(),
                                     [op = op](benchmark::State& s) { BM_mpi_pipelined(s, op); })
            ->Arg(bytes)
            ->Iterations(std::max<std::int64_t>(3, iters / 8))
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
      benchmark::RegisterBenchmark(("threads/" + std::string(name)).c_str(),
                                   [op = op](benchmark::State& s) { BM_threads(s, op); })
          ->Arg(bytes)
          ->Iterations(iters)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  zerotk::comm::MpiSession mpi(argc, argv);
  MpiCommunicator world = MpiCommunicator::world();
  MpiCommunicator self = world.split(world.rank(), 0);
  g_world = &world;
  g_self = &self;
  // Only rank 0 writes --benchmark_out (every rank runs the same benchmarks; one file, one writer).
  if (world.rank() != 0) {
    int kept = 1;
    for (int i = 1; i < argc; ++i) {
      if (std::string_view(argv[i]).rfind("--benchmark_out", 0) != 0) argv[kept++] = argv[i];
    }
    argc = kept;
  }
  benchmark::Initialize(&argc, argv);
  register_all();
  if (world.rank() == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    NullReporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
  return 0;
}
