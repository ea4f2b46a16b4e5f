#pragma once
/// \file bench/common/simulated_links.hpp
/// A communicator wrapper for benchmarks that keeps time on a virtual clock instead of the wall
/// clock: each rank has a VirtualClock that its model's compute advances (by the modelled compute
/// time, nothing is spun) and that every collective's completion moves forward to when a modelled
/// network would have delivered it. The wrapped communicator (the threads back end) still moves and
/// reduces the data, so results are the real ones; only the time is modelled. A loaded 2-core
/// machine then measures a schedule exactly: the figures are the same on every run.
/// (bench/common/modelled_link.hpp is the wall-clock sibling: one link per rank, sleeps.)
///
/// Network: ranks on nodes of `ranks_per_node` consecutive world ranks; a link inside a node and a
/// link across nodes, each with a bandwidth and a latency. Each rank has its own link of each kind
/// (one NIC per GPU, as rail-optimised clusters are built), so groups that run side by side do not
/// share a link.
///
/// Time of one collective over a group of s ranks (ring algorithm, as the byte counters assume):
///   busy  = steps x latency + wire_bytes / bandwidth
/// with steps = comm::ring_steps(kind, s) (2(s-1) for all-reduce, s-1 otherwise), wire_bytes the
/// ring-convention bytes the inner communicator counted for the call (the largest over the group's
/// ranks), and the link across nodes whenever the group has ranks on two nodes (a ring is as fast as
/// its slowest hop; a flat ring over two nodes crosses them on every step). Operations of one group
/// run one after the other on its links:
///   start = max(every member's issue time, the group's previous operation's end);  done = start + busy
/// and a rank's wait() (or a test() that returns true) sets its clock to max(clock, done). Groups
/// are independent: a hierarchical collective's level groups and the flat group over the same
/// ranks never contend (they do not run at the same time in the engine's schedule anyway).
///
/// split() gives a SimulatedLinks over the inner split (what HierarchicalCommunicator and the
/// engine's qgZ do), placed by the world ranks of its members. Point-to-point send / recv are not
/// modelled and refused.
///
///   zerotk::bench::SimulatedNetwork net({.ranks_per_node = 2, .intra = {10, 2}, .inter = {1, 10}});
///   zerotk::comm::run_threads(4, [&](zerotk::comm::ThreadsCommunicator& c) {
///     zerotk::bench::VirtualClock clock;
///     zerotk::bench::SimulatedLinks links(c, net, clock);
///     ... engine over `links`; compute: clock.advance(us) ...
///   });

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "zerotk/comm/accounting.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/hierarchical.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::bench {

/// One kind of link: GB/s (10^9 bytes per second) and latency per ring step.
struct LinkModel {
  double gbytes_per_s = 1;
  double latency_us = 0;
  /// Microseconds a ring collective of `steps` steps and `wire_bytes` takes on this link.
  double busy_us(std::uint64_t steps, std::uint64_t wire_bytes) const {
    return static_cast<double>(steps) * latency_us + static_cast<double>(wire_bytes) / (gbytes_per_s * 1e3);
  }
};

struct NetworkModel {
  int ranks_per_node = 1;  ///< world rank r sits on node r / ranks_per_node
  LinkModel intra;         ///< inside a node
  LinkModel inter;         ///< across nodes
};

/// One rank's simulated time, microseconds.
class VirtualClock {
 public:
  double now_us() const noexcept { return us_; }
  /// Modelled compute.
  void advance(double us) noexcept { us_ += us; }
  void at_least(double us) noexcept { us_ = std::max(us_, us); }

 private:
  double us_ = 0;
};

/// The network all ranks (threads of one process) share: the groups' schedules.
class SimulatedNetwork {
 public:
  explicit SimulatedNetwork(NetworkModel m) : model_(m) {
    if (m.ranks_per_node < 1) throw usage_error("must be >= 1", "NetworkModel::ranks_per_node", std::to_string(m.ranks_per_node));
  }
  const NetworkModel& model() const noexcept { return model_; }

  /// A group's operations: each member posts its issue time and bytes, the first waiter after all
  /// posted resolves the schedule up to that operation.
  class Group {
   public:
    explicit Group(int size, const NetworkModel& m) : size_(size), world_of_(static_cast<std::size_t>(size), -1), model_(&m) {}

    /// Called by every member before its first operation.
    void join(int rank, int world_rank) {
      std::lock_guard lock(mu_);
      int& slot = world_of_[static_cast<std::size_t>(rank)];
      if (slot >= 0) throw usage_error("one world SimulatedLinks per rank and network (make a SimulatedNetwork per run)", "zerotk::bench::SimulatedLinks");
      slot = world_rank;
    }
    void post(std::uint64_t seq, double issued_us, comm::OpKind kind, std::uint64_t wire_bytes) {
      std::lock_guard lock(mu_);
      while (slots_.size() <= seq) slots_.emplace_back();
      Slot& s = slots_[seq];
      s.issued = std::max(s.issued, issued_us);
      s.wire_bytes = std::max(s.wire_bytes, wire_bytes);
      s.kind = kind;
      ++s.posted;
    }
    /// When operation `seq` is done. Every member must have posted operations 0 .. seq (true once
    /// the inner operation completed: it needs every member's call, and members post before they call).
    double done_us(std::uint64_t seq) {
      std::lock_guard lock(mu_);
      for (; resolved_ <= seq; ++resolved_) {
        Slot& s = slots_[resolved_];
        if (s.posted != size_) {
          throw usage_error("an operation completed before every member posted it (point-to-point use?)",
                            "zerotk::bench::SimulatedLinks", std::to_string(s.posted) + " of " + std::to_string(size_));
        }
        const double start = std::max(s.issued, free_at_);
        const LinkModel& link = crosses_nodes() ? model_->inter : model_->intra;
        s.done = start + link.busy_us(comm::ring_steps(s.kind, size_), s.wire_bytes);
        free_at_ = s.done;
      }
      return slots_[seq].done;
    }
    /// Whether the members sit on more than one node (known once every member joined).
    bool crosses_nodes() const {
      const int k = model_->ranks_per_node;
      for (int w : world_of_) {
        if (w < 0) throw usage_error("a member has not joined", "zerotk::bench::SimulatedLinks");
        if (w / k != world_of_[0] / k) return true;
      }
      return false;
    }

   private:
    struct Slot {
        double issued = 0, done = 0;
      std::uint64_t wire_bytes = 0;
      comm::OpKind kind = comm::OpKind::barrier;
      int posted = 0;
    };
    std::mutex mu_;
    int size_;
    std::vector<int> world_of_;
    const NetworkModel* model_;
    std::deque<Slot> slots_;
    std::uint64_t resolved_ = 0;
    double free_at_ = 0;
  };

  /// The group of the ranks that got `color` from the `split_index`-th split of `parent` (nullptr:
  /// the world), created by whichever member asks first.
  Group& group(const Group* parent, std::uint64_t split_index, int color, int size) {
    std::lock_guard lock(mu_);
    auto& slot = groups_[{parent, split_index, color}];
    if (!slot) slot = std::make_unique<Group>(size, model_);
    return *slot;
  }

 private:
  NetworkModel model_;
  std::mutex mu_;
  std::map<std::tuple<const Group*, std::uint64_t, int>, std::unique_ptr<Group>> groups_;
};

/// A Communicator over `Inner` whose operations complete on the rank's VirtualClock (see the file
/// comment). Cheap to move; every copy made by moving refers to the same state.
template <class Inner>
class SimulatedLinks {
 public:
  /// The world: `inner`'s ranks are world ranks (rank r on node r / ranks_per_node). `inner`,
  /// `net` and `clock` must outlive this and everything split from it.
  SimulatedLinks(Inner& inner, SimulatedNetwork& net, VirtualClock& clock)
      : SimulatedLinks(std::shared_ptr<Inner>(std::shared_ptr<void>(), &inner), net, clock,
                       net.group(nullptr, 0, 0, inner.size()), inner.rank()) {}

  int rank() const { return s_->inner->rank(); }
  int size() const { return s_->inner->size(); }
  const comm::CommStats& stats() const { return s_->inner->stats(); }
  VirtualClock& clock() const noexcept { return *s_->clock; }

  comm::Work all_reduce(const void* s, void* r, std::size_t n, DType dt, comm::ReduceOp op) {
    return run(comm::OpKind::all_reduce, ring(comm::OpKind::all_reduce, n * size_of(dt)),
               [&](Inner& c) { return c.all_reduce(s, r, n, dt, op); });
  }
  comm::Work reduce_scatter(const void* s, void* r, std::size_t n, DType dt, comm::ReduceOp op) {
    return run(comm::OpKind::reduce_scatter, ring(comm::OpKind::reduce_scatter, whole(n) * size_of(dt)),
               [&](Inner& c) { return c.reduce_scatter(s, r, n, dt, op); });
  }
  comm::Work all_gather(const void* s, void* r, std::size_t n, DType dt) {
    return run(comm::OpKind::all_gather, ring(comm::OpKind::all_gather, whole(n) * size_of(dt)),
               [&](Inner& c) { return c.all_gather(s, r, n, dt); });
  }
  comm::Work all_gatherv(const void* s, std::size_t n, void* r, std::span<const std::size_t> counts, DType dt) {
    return run(comm::OpKind::all_gatherv, comm::all_gatherv_wire_bytes(counts, rank(), size_of(dt)),
               [&](Inner& c) { return c.all_gatherv(s, n, r, counts, dt); });
  }
  comm::Work broadcast(void* b, std::size_t n, DType dt, int root) {
    return run(comm::OpKind::broadcast, ring(comm::OpKind::broadcast, n * size_of(dt)),
               [&](Inner& c) { return c.broadcast(b, n, dt, root); });
  }
  comm::Work reduce(const void* s, void* r, std::size_t n, DType dt, comm::ReduceOp op, int root) {
    return run(comm::OpKind::reduce, ring(comm::OpKind::reduce, n * size_of(dt)),
               [&](Inner& c) { return c.reduce(s, r, n, dt, op, root); });
  }
  comm::Work all_to_all(const void* s, void* r, std::size_t n, DType dt) {
    return run(comm::OpKind::all_to_all, ring(comm::OpKind::all_to_all, whole(n) * size_of(dt)),
               [&](Inner& c) { return c.all_to_all(s, r, n, dt); });
  }
  comm::Work all_to_all_v(const void* s, std::span<const std::size_t> sc, void* r, std::span<const std::size_t> rc,
                          DType dt) {
    return run(comm::OpKind::all_to_all_v, comm::all_to_all_v_wire_bytes(sc, s_->inner->rank(), size_of(dt)),
               [&](Inner& c) { return c.all_to_all_v(s, sc, r, rc, dt); });
  }
  comm::Work barrier() {
    return run(comm::OpKind::barrier, 0, [&](Inner& c) { return c.barrier(); });
  }
  comm::Work send(const void*, std::size_t, DType, int, int) { throw refused("send"); }
  comm::Work recv(void*, std::size_t, DType, int, int) { throw refused("recv"); }

  /// Collective over this communicator, like the inner split.
  SimulatedLinks split(int color, int key) {
    auto part = std::make_shared<Inner>(s_->inner->split(color, key));
    SimulatedNetwork::Group& g = s_->net->group(s_->group, s_->splits++, color, part->size());
    return SimulatedLinks(std::move(part), *s_->net, *s_->clock, g, s_->world_rank);
  }

 private:
  struct State {
    std::shared_ptr<Inner> inner;
    SimulatedNetwork* net;
    VirtualClock* clock;
    SimulatedNetwork::Group* group;
    int world_rank;
    std::uint64_t issued = 0, splits = 0;
  };
  struct Timed final : comm::WorkState {
    comm::Work inner;
    SimulatedNetwork::Group* group;
    VirtualClock* clock;
    std::uint64_t seq;
    void wait() override {
      inner.wait();
      clock->at_least(group->done_us(seq));
    }
    bool test() override {
      if (!inner.test()) return false;
      clock->at_least(group->done_us(seq));
      return true;
    }
  };

  SimulatedLinks(std::shared_ptr<Inner> inner, SimulatedNetwork& net, VirtualClock& clock, SimulatedNetwork::Group& g,
                 int world_rank)
      : s_(std::make_shared<State>()) {
    s_->inner = std::move(inner);
    s_->net = &net;
    s_->clock = &clock;
    s_->group = &g;
    s_->world_rank = world_rank;
    g.join(s_->inner->rank(), world_rank);
  }

  std::uint64_t ring(comm::OpKind kind, std::uint64_t payload) const { return comm::ring_wire_bytes(kind, payload, size()); }
  std::uint64_t whole(std::size_t per_rank) const { return static_cast<std::uint64_t>(per_rank) * static_cast<std::uint64_t>(size()); }

  /// Posts the operation (before the inner call: once it completes, every member has posted it),
  /// issues it, and checks that the inner communicator counted the bytes the schedule was given.
  template <class Issue>
  comm::Work run(comm::OpKind kind, std::uint64_t wire_bytes, Issue&& issue) {
    const std::uint64_t before = s_->inner->stats().total_wire_bytes();
    const std::uint64_t seq = s_->issued++;
    s_->group->post(seq, s_->clock->now_us(), kind, wire_bytes);
    comm::Work w = issue(*s_->inner);
    const std::uint64_t counted = s_->inner->stats().total_wire_bytes() - before;
    if (counted != wire_bytes) {
      throw usage_error("the link model's bytes differ from the communicator's count", "zerotk::bench::SimulatedLinks",
                        std::string(comm::to_string(kind)) + " #" + std::to_string(seq) + ": " + std::to_string(wire_bytes) +
                            " vs " + std::to_string(counted));
    }
    return timed(std::move(w), seq);
  }
  comm::Work timed(comm::Work w, std::uint64_t seq) {
    auto t = std::make_unique<Timed>();
    t->inner = std::move(w);
    t->group = s_->group;
    t->clock = s_->clock;
    t->seq = seq;
    return comm::Work(std::move(t));
  }
  static usage_error refused(const char* op) {
    return usage_error("point-to-point operations are not modelled by the simulated links", "zerotk::bench::SimulatedLinks", op);
  }

  std::shared_ptr<State> s_;
};

}  // namespace zerotk::bench
