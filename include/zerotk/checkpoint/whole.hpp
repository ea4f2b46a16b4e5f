#pragma once
/// \file zerotk/checkpoint/whole.hpp
/// A checkpoint's parameters as whole tensors, and where each of their elements was saved.
///
/// A shard table (engine/shards.hpp) lists a parameter once when it is whole, or once per tensor
/// rank when it is split across the tensor group (each entry that rank's shard, in the shard's own
/// coordinates). Loading on another tensor size, data size or stage, and exporting, all work in the
/// whole parameter's coordinates: WholeIndex maps every saved fragment there (through
/// parallel::for_each_run, a contiguous stretch at a time) and answers "which saved rank holds
/// elements [a, b) of parameter p, at which offset of its owned buffer".

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/checkpoint/manifest.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/engine/shards.hpp"
#include "zerotk/parallel/split.hpp"

namespace zerotk::checkpoint {

/// One copy of `numel` consecutive elements of flat group `group`, from a saved rank's owned
/// buffer to this rank's (or to an export's tensor, at dst_offset).
struct PieceCopy {
  std::size_t group = 0;
  std::uint64_t src_offset = 0, dst_offset = 0, numel = 0;
};

/// A parameter of the model, whole: what its table entries (one, or a shard per tensor rank) make up.
struct WholeParam {
  std::string name;
  std::vector<std::uint64_t> shape;  ///< the whole parameter's
  std::uint64_t numel = 0;
  std::string dtype;
  std::uint32_t group = 0, optimizer_group = 0;
  std::vector<std::uint32_t> entries;  ///< table entries: the whole one, or the shards by tensor index
};

/// The whole parameters of table `t`, in the order of their first entries. `where` names the table
/// in errors (a manifest path): entries of one name must be one whole entry, or shards 0..T-1 of
/// one split that agree on everything else.
inline std::vector<WholeParam> whole_params(const engine::ShardTable& t, const std::string& where) {
  std::vector<WholeParam> out;
  std::map<std::string, std::pair<std::size_t, std::size_t>> index;  // name -> (whole, its first entry)
  for (std::size_t i = 0; i < t.params.size(); ++i) {
    const engine::ShardParam& p = t.params[i];
    const auto [it, fresh] = index.emplace(p.name, std::pair{out.size(), i});
    if (fresh) {
      out.push_back(WholeParam{p.name, p.full_shape(), p.full_numel(), p.dtype, p.group, p.optimizer_group, {}});
      out.back().entries.assign(static_cast<std::size_t>(std::max(p.tensor_size, 1)), static_cast<std::uint32_t>(t.params.size()));
    }
    WholeParam& w = out[it->second.first];
    const engine::ShardParam& first = t.params[it->second.second];
    const bool fits = p.tensor_size == first.tensor_size && p.tensor_split == first.tensor_split && p.shape == first.shape &&
                      p.dtype == w.dtype && p.group == w.group && p.optimizer_group == w.optimizer_group &&
                      p.tensor_index >= 0 && p.tensor_index < p.tensor_size &&
                      w.entries[static_cast<std::size_t>(p.tensor_index)] == t.params.size();
    if (!fits) {
      throw io_error("the table's entries of this parameter do not make up one whole tensor (a duplicate, or shards "
                     "that differ in size, split, type or group)",
                     where, "\"" + p.name + "\", entry " + std::to_string(i));
    }
    w.entries[static_cast<std::size_t>(p.tensor_index)] = static_cast<std::uint32_t>(i);
  }
  for (const WholeParam& w : out) {
    if (std::find(w.entries.begin(), w.entries.end(), t.params.size()) != w.entries.end()) {
      throw io_error("a tensor shard of this parameter is missing from the table", where,
                     "\"" + w.name + "\", " + std::to_string(w.entries.size()) + " shards expected");
    }
  }
  return out;
}

/// Every saved fragment in whole-parameter coordinates, indexed once per manifest.
class WholeIndex {
 public:
  WholeIndex(const Manifest& m, std::string manifest_path) : path_(std::move(manifest_path)) {
    whole_ = whole_params(m.shards, path_);
    std::vector<std::size_t> whole_of(m.shards.params.size());
    for (std::size_t w = 0; w < whole_.size(); ++w) {
      by_name_.emplace(whole_[w].name, w);
      for (std::uint32_t e : whole_[w].entries) whole_of[e] = w;
    }
    held_.resize(whole_.size());
    for (std::size_t g = 0; g < m.shards.fragments.size(); ++g) {
      for (std::size_t r = 0; r < m.shards.fragments[g].size(); ++r) {
        for (const zero::Fragment& f : m.shards.fragments[g][r]) {
          const engine::ShardParam& p = m.shards.params[f.param];
          auto& pieces = held_[whole_of[f.param]][static_cast<int>(r)];
          runs(p, f.param_offset, f.numel, [&](std::uint64_t at, std::uint64_t full_at, std::uint64_t n) {
            pieces.push_back(Held{full_at, n, f.owned_offset + (at - f.param_offset)});
          });
        }
      }
    }
    for (auto& per_rank : held_) {
      for (auto& [rank, pieces] : per_rank) {
        std::sort(pieces.begin(), pieces.end(), [](const Held& a, const Held& b) { return a.full_begin < b.full_begin; });
      }
    }
  }

  const std::vector<WholeParam>& params() const noexcept { return whole_; }

  /// Adds to `plan` (by saved rank) the copies that fill elements [begin, begin + n) of whole
  /// parameter `w`, placed from `dst` on in flat group `group`; each element once, from saved rank
  /// `prefer` when it held it, else from the lowest saved rank that did. io_error if none did.
  void cover_whole(std::size_t w, std::uint64_t begin, std::uint64_t n, std::uint64_t dst, std::size_t group, int prefer,
                   std::map<int, std::vector<PieceCopy>>& plan) const {
    const auto& per_rank = held_[w];
    for (std::uint64_t at = begin, end = begin + n; at < end;) {
      int rank = -1;
      const Held* h = nullptr;
      if (const auto it = per_rank.find(prefer); it != per_rank.end()) h = holding(it->second, at);
      if (h != nullptr) {
        rank = prefer;
      } else {
        for (const auto& [r, pieces] : per_rank) {
          if ((h = holding(pieces, at)) != nullptr) {
            rank = r;
            break;
          }
        }
      }
      if (h == nullptr) {
        throw io_error("no saved rank holds element " + std::to_string(at) + " of parameter \"" + whole_[w].name + "\"", path_);
      }
      const std::uint64_t len = std::min(end, h->full_begin + h->numel) - at;
      plan[rank].push_back(PieceCopy{group, h->owned_offset + (at - h->full_begin), dst + (at - begin), len});
      at += len;
    }
  }

  /// The copies that fill fragment `want` of a loading engine's table entry `p` (a whole parameter
  /// or one tensor rank's shard of it, in its own coordinates) at want.owned_offset of `group`.
  void cover(const engine::ShardParam& p, const zero::Fragment& want, std::size_t group, int prefer,
             std::map<int, std::vector<PieceCopy>>& plan) const {
    const auto it = by_name_.find(p.name);
    if (it == by_name_.end()) throw io_error("the checkpoint has no parameter \"" + p.name + "\"", path_);
    runs(p, want.param_offset, want.numel, [&](std::uint64_t at, std::uint64_t full_at, std::uint64_t n) {
      cover_whole(it->second, full_at, n, want.owned_offset + (at - want.param_offset), group, prefer, plan);
    });
  }

 private:
  struct Held {
    std::uint64_t full_begin, numel, owned_offset;
  };

  /// Elements [begin, begin + n) of entry `p` as stretches of the whole parameter.
  template <class F>
  static void runs(const engine::ShardParam& p, std::uint64_t begin, std::uint64_t n, F&& f) {
    if (!p.is_shard()) {
      f(begin, begin, n);
      return;
    }
    parallel::for_each_run(p.full_matrix(), p.tensor_split, p.tensor_index, p.tensor_size, static_cast<std::size_t>(begin),
                           static_cast<std::size_t>(n), [&](std::size_t at, std::size_t full_at, std::size_t len) {
                             f(static_cast<std::uint64_t>(at), static_cast<std::uint64_t>(full_at),
                               static_cast<std::uint64_t>(len));
                           });
  }

  /// The piece of one rank's (sorted, non-overlapping) pieces that holds element `at`, or null.
  static const Held* holding(const std::vector<Held>& pieces, std::uint64_t at) {
    auto it = std::upper_bound(pieces.begin(), pieces.end(), at, [](std::uint64_t a, const Held& h) { return a < h.full_begin; });
    if (it == pieces.begin()) return nullptr;
    --it;
    return at < it->full_begin + it->numel ? &*it : nullptr;
  }

  std::string path_;
  std::vector<WholeParam> whole_;
  std::map<std::string, std::size_t> by_name_;
  std::vector<std::map<int, std::vector<Held>>> held_;  // [whole param] saved rank -> pieces by full offset
};

}  // namespace zerotk::checkpoint
