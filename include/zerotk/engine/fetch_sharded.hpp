#pragma once
/// \file zerotk/engine/fetch_sharded.hpp
/// ShardedFetch: the fetch schedule of ZeRO stage 3. Parameters live as shards
/// (zero/params/fetch_on_demand.hpp); a layer's scope gathers the buckets holding its parameters and
/// its external_parameters before the user's code runs, and gives them back when the scope closes.
///
/// - Order. Every scope is an event: (phase, the layer's first parameter). The sequence of one
///   micro-step is kept as the trace the next micro-step follows. At step() the ranks compare their
///   sequences with one small all-reduce (length and a hash): ranks whose layers ran in different
///   orders get an error naming the micro-step and both sequences, instead of a hang or silently
///   mixed values. A sequence that changes the same way on every rank is recorded again.
/// - Prefetch. While the current micro-step follows the trace, opening event i also starts the
///   gathers of the buckets of events i+1, i+2, ... up to `prefetch_bucket_size` elements, so
///   communication overlaps the layers before them.
/// - Reuse. A bucket whose last hold ends stays gathered if the trace needs it again within
///   `max_reuse_distance` fetched elements; else it goes back to the pool at once.
/// - Live bound. Prefetch and reuse never take the gathered elements past `max_live_parameters`;
///   what open scopes need is always gathered.
/// - Read-ahead. Where a group's shards live in a file (OffloadParams<Nvme>), opening event i also
///   names to it the next buckets of the trace whose fetch will read the file, beyond the prefetch,
///   as many as its read buffers hold: their disk reads run while the layers before them compute.
/// - `reshard_after_forward = false`: a layer's buckets stay held from its forward to its backward.
///   `ReshardAfterForward::group(g)` (hpZ) changes nothing here: the parameter path gathers a bucket
///   from its secondary shard, inside the group, whenever that holds the current values
///   (zero/params/secondary_shard.hpp).
///
/// Every decision is a function of the trace and of what is resident, which are the same on every
/// rank, so every rank issues the same collectives in the same order.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/engine/fetch.hpp"
#include "zerotk/zero/layout.hpp"

namespace zerotk::engine {

template <class Context>
class ShardedFetch {
 public:
  explicit ShardedFetch(const Context& c) : c_(c) {}

  /// Each parameter's fetch unit: its module's (a bucket never spans two fetch units), and
  /// persistent parameters form units of their own. A parameter is persistent when small
  /// (`stage3_param_persistence_threshold`, while `stage3_model_persistence_threshold` lasts, in
  /// visiting order) or kept unpartitioned by its module's type (outside the budget).
  static auto unit_rule(const Stage3Options& o) {
    return [o, persistent_numel = std::size_t{0}](const ParamEntry& e) mutable -> std::optional<FetchUnit> {
      const bool small = !e.replicated && e.numel <= o.param_persistence_threshold &&
                         persistent_numel + e.numel <= o.model_persistence_threshold;
      if (small) persistent_numel += e.numel;
      const bool persistent = small || e.replicated;
      return FetchUnit{2 * e.unit + (persistent ? 1u : 0u), persistent};
    };
  }
  /// Which modules' parameters are partitioned (zero_allowed_param_types, zero_force_param_types).
  static void registry_rules(ParamRegistry::Rules& r, const Stage3Options& o) {
    r.partitioned_module_types = o.partitioned_module_types;
    r.replicated_module_types = o.replicated_module_types;
  }
  /// hpZ's group size (1: off).
  static int hpz_group_size(const Stage3Options& o) noexcept { return o.reshard_after_forward.group_size(); }

  /// A gather scope (Engine::gather): the buckets are held, outside the recorded order, with the
  /// shards' exact values (never qwZ's quantized ones).
  void hold(const ModuleEntry& m) {
    const Event e = event_of(m, Phase::forward);
    for (const Unit& u : e.units) with_params(u, [&](auto& p) { p.fetch(u.bucket, true); });
    for (const Unit& u : e.units) with_params(u, [&](auto& p) { p.acquire(u.bucket, true); });
  }
  void unhold(const ModuleEntry& m) { release(event_of(m, Phase::forward), /*reuse=*/false); }

  void before(const ModuleEntry& m, Phase phase) {
    Event e = event_of(m, phase);
    const std::size_t i = current_.size();
    on_trace_ = on_trace_ && i < trace_.size() && trace_[i].key == e.key;
    const bool held = phase == Phase::backward && !c_.options.reshard_after_forward && take_forward_hold(e.key);
    if (!held) {
      for (const Unit& u : e.units) with_params(u, [&](auto& p) { p.fetch(u.bucket); });
      if (on_trace_) prefetch(i, e);
    }
    if (on_trace_) stage_ahead_from(i + 1);  // before the waits: the reads overlap the gathers and the layer
    if (!held) {
      try {
        for (const Unit& u : e.units) with_params(u, [&](auto& p) { p.acquire(u.bucket); });
      } catch (const comm_error& x) {
        throw_context(x, e, i);
      }
    }
    current_.push_back(std::move(e));
  }

  void after(const ModuleEntry& m, Phase phase) {
    const Event e = event_of(m, phase);
    if (phase == Phase::forward && !c_.options.reshard_after_forward) {
      forward_holds_.push_back(e);  // the backward event of the same layer takes these holds
      return;
    }
    release(e);
  }

  /// The micro-step's sequence is complete: compared across ranks, then the trace of the next.
  void end_micro_step(std::int64_t micro_step) {
    for (const Event& e : forward_holds_) release(e);  // a forward whose backward never came
    forward_holds_.clear();
    check_same_order(micro_step);
    if (!on_trace_ || current_.size() != trace_.size()) trace_ = std::move(current_);
    current_.clear();
    on_trace_ = true;
  }

  /// step() is done (the update, if it was a boundary, is committed): the shard homes read the
  /// blocks the recorded order fetches first ahead, so that the next micro-step's first layers
  /// find them staged too, between micro-steps of one accumulation and across an update alike. A
  /// read-ahead that cannot even be submitted is left to its fetch, which reads the block itself
  /// and reports the error where it happens.
  void ready_next() {
    if (trace_.empty()) return;
    try {
      stage_ahead_from(0);
    } catch (const io_error&) {
    }
  }

  /// Gathered elements now (pool buffers in use; persistent buckets not counted), over every group.
  std::size_t live_numel() const {
    std::size_t n = 0;
    std::as_const(*c_.groups).each([&](const auto& g) { n += g.params().live_numel(); });
    return n;
  }
  std::size_t held_numel() const {
    std::size_t n = 0;
    std::as_const(*c_.groups).each([&](const auto& g) { n += g.params().held_numel(); });
    return n;
  }

 private:
  struct Unit {
    GroupKind group = GroupKind::main;
    std::uint32_t bucket = 0;
    std::size_t numel = 0;
    bool operator==(const Unit& o) const noexcept { return group == o.group && bucket == o.bucket; }
  };
  struct Event {
    std::uint32_t key = 0;  ///< (first parameter id << 1) | backward
    std::vector<Unit> units;
    std::size_t numel = 0;
  };

  template <class F>
  void with_params(const Unit& u, F&& f) {
    c_.groups->with(u.group, [&](auto& g) { f(g.params()); });
  }

  Event event_of(const ModuleEntry& m, Phase phase) const {
    Event e;
    const ParamId first = !m.own.empty() ? m.own.front() : (!m.external.empty() ? m.external.front() : 0);
    e.key = (first << 1) | (phase == Phase::backward ? 1u : 0u);
    auto add = [&](const std::vector<ParamId>& ids) {
      for (ParamId id : ids) {
        const ParamEntry& p = (*c_.registry)[id];
        Unit u;
        u.group = p.group;
        std::as_const(*c_.groups).with(p.group, [&](const auto& g) {
          const zero::BucketLayout& l = g.layout();
          u.bucket = static_cast<std::uint32_t>(l.param(p.local).bucket);
          u.numel = l.buckets()[u.bucket].numel;
        });
        if (std::find(e.units.begin(), e.units.end(), u) == e.units.end()) {
          e.units.push_back(u);
          e.numel += u.numel;
        }
      }
    };
    add(m.own);
    add(m.external);
    return e;
  }

  /// reshard_after_forward = false: the holds the same layer's forward kept, if any.
  bool take_forward_hold(std::uint32_t backward_key) {
    for (std::size_t j = forward_holds_.size(); j-- > 0;) {
      if ((forward_holds_[j].key | 1u) != backward_key) continue;
      forward_holds_.erase(forward_holds_.begin() + static_cast<std::ptrdiff_t>(j));
      return true;
    }
    return false;
  }

  /// Gives e's buckets back; one nobody holds any more goes back to the pool unless `reuse` and the
  /// recorded order needs it again soon.
  void release(const Event& e, bool reuse = true) {
    for (const Unit& u : e.units) {
      with_params(u, [&](auto& p) {
        p.release(u.bucket);
        if (p.holds(u.bucket) == 0 && !(reuse && keep_for_reuse(u))) p.evict(u.bucket);
      });
    }
  }

  bool resident_or_flying(const Unit& u) {
    bool r = false;
    with_params(u, [&](auto& p) { r = p.resident(u.bucket); });
    return r;
  }

  /// Starts the gathers of the events after i in the trace, while the elements gathered ahead of
  /// use (resident, held by no scope) stay within the prefetch budget. Event i's own buckets, just
  /// fetched and about to be held, are not ahead of use.
  void prefetch(std::size_t i, const Event& current) {
    std::size_t opening = 0;
    for (const Unit& u : current.units) {
      with_params(u, [&](auto& p) {
        if (p.holds(u.bucket) == 0 && !p.persistent(u.bucket)) opening += u.numel;
      });
    }
    const std::size_t unheld = live_numel() - held_numel();
    const std::size_t ahead = unheld > opening ? unheld - opening : 0;
    if (ahead >= c_.options.prefetch_bucket_size) return;
    std::size_t budget = c_.options.prefetch_bucket_size - ahead;
    for (std::size_t j = i + 1; j < trace_.size() && budget > 0; ++j) {
      for (const Unit& u : trace_[j].units) {
        if (resident_or_flying(u)) continue;
        if (u.numel > budget || live_numel() + u.numel > c_.options.max_live_parameters) return;
        with_params(u, [&](auto& p) { p.fetch(u.bucket); });
        budget -= u.numel;
      }
    }
  }

  /// Names to each group's shard home the buckets of events `from`, `from` + 1, ... in the trace
  /// whose fetch will read it, nearest first, as many as it can read ahead (none for homes that
  /// cannot).
  void stage_ahead_from(std::size_t from) {
    c_.groups->each([&](auto& g) {
      auto& p = g.params();
      const GroupKind group = g.kind();
      const std::size_t capacity = p.stage_capacity();
      if (capacity == 0) return;
      next_.clear();
      for (std::size_t j = from; j < trace_.size() && next_.size() < capacity; ++j) {
        for (const Unit& u : trace_[j].units) {
          if (u.group != group || next_.size() == capacity || !p.reads_home(u.bucket)) continue;
          if (std::find(next_.begin(), next_.end(), u.bucket) == next_.end()) next_.push_back(u.bucket);
        }
      }
      p.stage_ahead(next_);
    });
  }

  /// Whether the trace needs bucket u again soon after the current event.
  bool keep_for_reuse(const Unit& u) const {
    if (!on_trace_ || c_.options.max_reuse_distance == 0) return false;
    if (live_numel() > c_.options.max_live_parameters) return false;
    std::size_t distance = 0;
    for (std::size_t j = current_.size(); j < trace_.size(); ++j) {
      const Event& e = trace_[j];
      if (std::find(e.units.begin(), e.units.end(), u) != e.units.end()) return true;
      distance += e.numel;
      if (distance > c_.options.max_reuse_distance) return false;
    }
    return false;
  }

  std::string event_name(std::uint32_t key) const {
    return std::string(key & 1u ? "backward " : "forward ") + (*c_.registry)[key >> 1].name;
  }

  std::string sequence_text(const std::vector<std::uint32_t>& keys, std::size_t around) const {
    std::string s = "[";
    const std::size_t from = around > 2 ? around - 2 : 0, to = std::min(keys.size(), around + 3);
    if (from > 0) s += "... ";
    for (std::size_t j = from; j < to; ++j) s += (j > from ? ", " : "") + event_name(keys[j]);
    if (to < keys.size()) s += ", ...";
    s += "] (" + std::to_string(keys.size()) + " scopes)";
    return s;
  }

  [[noreturn]] void throw_context(const error& x, const Event& e, std::size_t i) const {
    throw comm_error("gathering the parameters of " + event_name(e.key) + " (scope " + std::to_string(i + 1) +
                         " of this micro-step) failed; " + order_context(&e) + ": " + x.message(),
                     x.where(), x.value());
  }

  /// This rank's scopes so far and the recorded order, for an error. The different-orders diagnosis
  /// only when this rank's scopes so far differ from the recorded order (issue 57 item 3: an
  /// unrelated failure on a rank that kept its order is not blamed on the order).
  std::string order_context(const Event* opening = nullptr) const {  // opening: the scope being opened (not in current_ yet)
    std::vector<std::uint32_t> now, then;
    for (const Event& e : current_) now.push_back(e.key);
    if (opening != nullptr) now.push_back(opening->key);
    for (const Event& e : trace_) then.push_back(e.key);
    const std::size_t at = now.size() > 0 ? now.size() - 1 : 0;
    const bool same = now.size() <= then.size() && std::equal(now.begin(), now.end(), then.begin());
    if (same || then.empty()) {
      return "rank " + std::to_string(c_.comm->rank()) + " ran " + sequence_text(now, at) + " in this micro-step" +
             (then.empty() ? " (its first: no recorded order yet)" : ", in the same order as the previous one");
    }
    return "ranks that run their layers in different orders make ZeRO stage 3's collectives mismatch (rank " +
           std::to_string(c_.comm->rank()) + " ran " + sequence_text(now, at) + " in this micro-step; the previous one ran " +
           sequence_text(then, at) + ")";
  }

 public:
  /// A collective failed during the micro-step (step() waits for the reductions): the same error
  /// with this rank's order of scopes.
  [[noreturn]] void rethrow_with_order(const comm_error& x) const {
    throw comm_error(order_context() + ": " + x.message(), x.where(), x.value());
  }

 private:

  /// One all-reduce (max) of {n, -n, h1, -h1, h2, -h2} over ranks: equal everywhere iff every rank
  /// ran the same sequence. On a difference, the sequences themselves are summed into one table so
  /// every rank can name both and throws the same error.
  void check_same_order(std::int64_t micro_step) {
    std::uint64_t h = 1469598103934665603ull;
    for (const Event& e : current_) {
      h ^= e.key;
      h *= 1099511628211ull;
    }
    const double n = static_cast<double>(current_.size());
    const double h1 = static_cast<double>(h & 0x3ffffffu), h2 = static_cast<double>((h >> 26) & 0x3ffffffu);
    double in[6] = {n, -n, h1, -h1, h2, -h2}, out[6];
    c_.comm->all_reduce_host(in, out, 6, comm::ReduceOp::max);
    if (out[0] == -out[1] && out[2] == -out[3] && out[4] == -out[5]) return;

    const int world = c_.comm->size(), rank = c_.comm->rank();
    const auto longest = static_cast<std::size_t>(out[0]);
    std::vector<double> table(static_cast<std::size_t>(world) * (longest + 1), 0.0), all(table.size());
    double* mine = table.data() + static_cast<std::size_t>(rank) * (longest + 1);
    mine[0] = n;
    for (std::size_t j = 0; j < current_.size(); ++j) mine[j + 1] = static_cast<double>(current_[j].key);
    c_.comm->all_reduce_host(table.data(), all.data(), all.size(), comm::ReduceOp::sum);
    std::vector<std::vector<std::uint32_t>> seq(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) {
      const double* row = all.data() + static_cast<std::size_t>(r) * (longest + 1);
      for (std::size_t j = 0; j < static_cast<std::size_t>(row[0]); ++j) seq[static_cast<std::size_t>(r)].push_back(static_cast<std::uint32_t>(row[j + 1]));
    }
    // The first rank whose sequence differs from rank 0's, and where.
    for (std::size_t r = 1; r < seq.size(); ++r) {
      if (seq[r] == seq[0]) continue;
      std::size_t at = 0;
      while (at < seq[0].size() && at < seq[r].size() && seq[0][at] == seq[r][at]) ++at;
      throw usage_error("ranks ran their layers' scopes in different orders; ZeRO stage 3 gathers each layer's "
                        "parameters with collectives every rank must issue in the same order (first difference at "
                        "scope " + std::to_string(at + 1) + ")",
                        "Engine::step: micro-step " + std::to_string(micro_step),
                        "rank 0: " + sequence_text(seq[0], at) + "; rank " + std::to_string(r) + ": " +
                            sequence_text(seq[r], at));
    }
    throw usage_error("ranks ran their layers' scopes in different orders (the sequences hash differently)",
                      "Engine::step: micro-step " + std::to_string(micro_step));
  }

  Context c_;
  std::vector<Event> trace_, current_;
  std::vector<Event> forward_holds_;  // forwards that kept their buckets for their layer's backward
  std::vector<std::size_t> next_;     // stage_ahead's list (kept: no allocation per scope)
  bool on_trace_ = true;
};

}  // namespace zerotk::engine
