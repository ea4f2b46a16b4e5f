#pragma once
/// \file zerotk/checkpoint/grid_table.hpp
/// One shard table for a whole process grid. An engine on a grid knows its own model part (its
/// tensor rank's shards) and its data group's fragments; a checkpoint of the grid needs every part:
/// each rank sends its part's parameters and its own fragments to every rank (one all-gather of
/// sizes, one of words), and every rank merges them the same way into a table indexed by world
/// rank. A parameter split across the tensor group keeps one entry per tensor rank; a replicated
/// one, held alike by every tensor rank, is one entry that every part's fragments point at.

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "zerotk/checkpoint/agree.hpp"
#include "zerotk/comm/typed.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/engine/shards.hpp"

namespace zerotk::checkpoint {

namespace detail {

/// A shard table's parameters and one data rank's fragments as 64-bit words, and back.
class TableWords {
 public:
  /// `rank_in(g)`: this rank's index among group g's ranks.
  template <class RankIn>
  static std::vector<std::uint64_t> encode(const engine::ShardTable& t, RankIn&& rank_in) {
    TableWords w;
    w.put(t.params.size());
    for (const engine::ShardParam& p : t.params) {
      w.put_text(p.name);
      w.put_text(p.dtype);
      w.put(p.numel);
      w.put(p.shape.size());
      for (std::uint64_t d : p.shape) w.put(d);
      w.put(p.group);
      w.put(p.optimizer_group);
      w.put(static_cast<std::uint64_t>(p.tensor_index));
      w.put(static_cast<std::uint64_t>(p.tensor_size));
      w.put(static_cast<std::uint64_t>(p.tensor_split.dim));
      w.put(static_cast<std::uint64_t>(p.tensor_split.parts));
    }
    w.put(t.fragments.size());
    for (std::size_t g = 0; g < t.fragments.size(); ++g) {
      const auto d = static_cast<std::size_t>(rank_in(g));
      w.put(t.owned_numel[g][d]);
      w.put(t.fragments[g][d].size());
      for (const zero::Fragment& f : t.fragments[g][d]) {
        w.put(f.param);
        w.put(f.param_offset);
        w.put(f.numel);
        w.put(f.owned_offset);
      }
    }
    return std::move(w.words_);
  }

  /// A table of one rank: its part's parameters, fragments[g] = {that rank's}, owned_numel[g] = {its}.
  static engine::ShardTable decode(const std::uint64_t* words, std::size_t n) {
    TableWords w;
    w.in_ = words;
    w.end_ = words + n;
    engine::ShardTable t;
    t.params.resize(w.count());
    for (engine::ShardParam& p : t.params) {
      p.name = w.text();
      p.dtype = w.text();
      p.numel = w.get();
      p.shape.resize(w.count());
      for (std::uint64_t& d : p.shape) d = w.get();
      p.group = static_cast<std::uint32_t>(w.get());
      p.optimizer_group = static_cast<std::uint32_t>(w.get());
      p.tensor_index = static_cast<int>(w.get());
      p.tensor_size = static_cast<int>(w.get());
      p.tensor_split.dim = static_cast<parallel::SplitDim>(w.get());
      p.tensor_split.parts = static_cast<int>(w.get());
    }
    const std::size_t groups = w.count();
    for (std::size_t g = 0; g < groups; ++g) {
      t.owned_numel.push_back({w.get()});
      auto& frags = t.fragments.emplace_back(1);
      frags[0].resize(w.count());
      for (zero::Fragment& f : frags[0]) {
        f.param = static_cast<std::uint32_t>(w.get());
        f.param_offset = w.get();
        f.numel = w.get();
        f.owned_offset = w.get();
      }
    }
    if (w.in_ != w.end_) throw io_error("a rank's shard table has trailing words", "checkpoint grid table");
    return t;
  }

 private:
  void put(std::uint64_t v) { words_.push_back(v); }
  void put_text(const std::string& s) {
    put(s.size());
    for (std::size_t i = 0; i < s.size(); i += 8) {
      std::uint64_t v = 0;
      for (std::size_t k = 0; k < 8 && i + k < s.size(); ++k) v |= std::uint64_t{static_cast<unsigned char>(s[i + k])} << (8 * k);
      put(v);
    }
  }
  std::uint64_t get() {
    if (in_ == end_) throw io_error("a rank's shard table ends early", "checkpoint grid table");
    return *in_++;
  }
  std::size_t count() {
    const std::uint64_t v = get();
    if (v > static_cast<std::uint64_t>(end_ - in_) * 8 + 8) throw io_error("a rank's shard table is malformed", "checkpoint grid table");
    return static_cast<std::size_t>(v);
  }
  std::string text() {
    std::string s(count(), '\0');
    for (std::size_t i = 0; i < s.size(); i += 8) {
      const std::uint64_t v = get();
      for (std::size_t k = 0; k < 8 && i + k < s.size(); ++k) s[i + k] = static_cast<char>((v >> (8 * k)) & 0xFF);
    }
    return s;
  }

  std::vector<std::uint64_t> words_;
  const std::uint64_t* in_ = nullptr;
  const std::uint64_t* end_ = nullptr;
};

/// `t` with its entries in the order described at gather_grid_table, `lists[r]` being rank r's
/// entries (indices into t.params) in its own order; the fragments follow their entries.
inline engine::ShardTable canonical_order(engine::ShardTable t, const std::vector<std::vector<std::uint32_t>>& lists) {
  std::list<std::uint32_t> order;
  std::vector<std::list<std::uint32_t>::iterator> at(t.params.size(), order.end());  // end(): not placed yet
  for (const std::vector<std::uint32_t>& list : lists) {
    auto anchor = order.end();  // the next entry of this rank's list already placed
    for (auto i = list.rbegin(); i != list.rend(); ++i) {
      if (at[*i] == order.end()) at[*i] = order.insert(anchor, *i);
      anchor = at[*i];
    }
  }
  std::vector<std::uint32_t> new_id(t.params.size());
  std::vector<engine::ShardParam> params;
  params.reserve(t.params.size());
  for (std::uint32_t old : order) {
    new_id[old] = static_cast<std::uint32_t>(params.size());
    params.push_back(std::move(t.params[old]));
  }
  t.params = std::move(params);
  for (auto& group : t.fragments) {
    for (auto& rank : group) {
      for (zero::Fragment& f : rank) f.param = new_id.at(f.param);
    }
  }
  return t;
}

}  // namespace detail

/// The shard table of every rank of a grid, indexed by world rank. `local` is this rank's engine
/// table (its data group's), `data_rank` its index in the data group of `data_size` ranks,
/// `expert_data_rank` its index in the expert-data group (default: the data rank): a group of the
/// table with other than `data_size` ranks is the experts', over the expert-data group
/// (engine/shards.hpp).
/// Collective over `world`; the result is the same on every rank. usage_error when two ranks
/// disagree about a replicated parameter or their number of flat groups (they would not be one model).
/// Entries are in a canonical order that does not depend on how the grid splits the model: each
/// rank's entries that no earlier rank listed go right before the next entry of its own list already
/// placed. So rank r's experts follow rank r - 1's inside each block, whatever the expert size (a
/// checkpoint saved at expert parallel 4 lists its parameters as one saved at 2 does), and a tensor
/// rank's shards follow the previous rank's.
template <HostCommunicator C>
engine::ShardTable gather_grid_table(C& world, const engine::ShardTable& local, int data_rank, int expert_data_rank = -1,
                                     int data_size = -1) {
  const std::vector<std::uint64_t> mine = detail::TableWords::encode(local, [&](std::size_t g) {
    const bool experts = expert_data_rank >= 0 && local.fragments[g].size() != static_cast<std::size_t>(data_size);
    return experts ? expert_data_rank : data_rank;
  });
  const std::vector<std::uint64_t> sizes = all_gather_u64(world, {mine.size()});
  std::vector<std::size_t> counts(sizes.begin(), sizes.end());
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  std::vector<std::uint64_t> all(total);
  std::vector<std::size_t> byte_counts(counts.size());
  for (std::size_t r = 0; r < counts.size(); ++r) byte_counts[r] = counts[r] * sizeof(std::uint64_t);
  world.all_gatherv(mine.data(), mine.size() * sizeof(std::uint64_t), all.data(), byte_counts, DType::uint8).wait();

  engine::ShardTable out;
  std::map<std::pair<std::string, int>, std::uint32_t> ids;  // (name, tensor index or -1) -> global entry
  std::size_t at = 0;
  std::vector<std::vector<std::uint32_t>> lists(counts.size());  // each rank's entries, in its order
  for (std::size_t r = 0; r < counts.size(); ++r) {
    const engine::ShardTable t = detail::TableWords::decode(all.data() + at, counts[r]);
    at += counts[r];
    const std::string where = "rank " + std::to_string(r);
    if (r == 0) {
      out.fragments.resize(t.fragments.size());
      out.owned_numel.resize(t.fragments.size());
    } else if (t.fragments.size() != out.fragments.size()) {
      throw usage_error("ranks of the grid keep different numbers of flat groups (fp32-kept and working precision), so "
                        "they cannot be checkpointed as one model",
                        where, std::to_string(t.fragments.size()) + " here, " + std::to_string(out.fragments.size()) + " on rank 0");
    }
    std::vector<std::uint32_t> id(t.params.size());
    for (std::size_t i = 0; i < t.params.size(); ++i) {
      const engine::ShardParam& p = t.params[i];
      const auto [it, fresh] = ids.emplace(std::pair{p.name, p.is_shard() ? p.tensor_index : -1},
                                           static_cast<std::uint32_t>(out.params.size()));
      if (fresh) {
        out.params.push_back(p);
      } else if (!(out.params[it->second] == p)) {
        throw usage_error("ranks of the grid hold this parameter differently (shape, type, group or split)", p.name,
                          where + " against an earlier rank");
      }
      id[i] = it->second;
    }
    for (std::size_t g = 0; g < t.fragments.size(); ++g) {
      std::vector<zero::Fragment> frags = t.fragments[g][0];
      for (zero::Fragment& f : frags) f.param = id.at(f.param);
      out.fragments[g].push_back(std::move(frags));
      out.owned_numel[g].push_back(t.owned_numel[g][0]);
    }
    lists[r] = std::move(id);
  }
  return detail::canonical_order(std::move(out), lists);
}

}  // namespace zerotk::checkpoint
