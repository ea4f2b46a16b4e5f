#pragma once
/// \file zerotk/config/sparse_attention.hpp
/// DeepSpeed's `sparse_attention` block (docs/context.md), read as DeepSpeed's runtime config reads
/// it: `mode` (dense, fixed, variable, bigbird, bslongformer; default fixed) picks which keys count,
/// each with DeepSpeed's config default (`block` 16, `num_random_blocks` 0 even for bigbird,
/// `attention` bidirectional, ...):
///
///   dense         block
///   fixed         block, different_layout_per_head, num_local_blocks, num_global_blocks, attention,
///                 horizontal_global_attention, num_different_global_patterns
///   variable      block, different_layout_per_head, num_random_blocks, local_window_blocks,
///                 global_block_indices, global_block_end_indices, attention, horizontal_global_attention
///   bigbird       block, different_layout_per_head, num_random_blocks, num_sliding_window_blocks,
///                 num_global_blocks
///   bslongformer  block, different_layout_per_head, num_sliding_window_blocks, global_block_indices,
///                 global_block_end_indices
///
/// A key the mode does not read is noted (DeepSpeed ignores it silently). The result is
/// Config::sparse_attention, a context::SparsityConfig whose `heads` the model fills; the checks the
/// sparsity classes make of their arguments run here, naming the key. Reader::read_sparse_attention
/// is declared in config/reader.hpp and defined here.

#include <array>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/config/options.hpp"
#include "zerotk/config/reader.hpp"
#include "zerotk/context/sparsity.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::config::detail {

/// An array of ints >= `lo` at `key` of `b` (absent or null: unchanged); false after an error.
inline bool read_int_list(Reader& r, Block& b, std::string_view key, int lo, std::vector<int>& out) {
  const Json* v = b.find(key);
  if (v == nullptr || v->is_null()) return true;
  if (!v->is_array()) {
    r.error(b.path_of(key), cat("expected an array of integers >= ", std::to_string(lo)), show(*v));
    return false;
  }
  std::vector<int> got;
  for (std::size_t i = 0; i < v->size(); ++i) {
    const Json& e = (*v)[i];
    if (!e.is_number_integer() || e.get<std::int64_t>() < lo || e.get<std::int64_t>() > std::numeric_limits<int>::max()) {
      r.error(b.path_of(key) + "/" + std::to_string(i), cat("expected an integer >= ", std::to_string(lo)), show(e));
      return false;
    }
    got.push_back(static_cast<int>(e.get<std::int64_t>()));
  }
  out = std::move(got);
  return true;
}

inline void Reader::read_sparse_attention(Block& root, Config& c) {
  Block b(*this, root.get_object("sparse_attention"), root.path_of("sparse_attention"));
  if (!b.present()) return;
  using context::SparsityMode;
  static constexpr std::array<std::string_view, 5> kModes{"dense", "fixed", "variable", "bigbird", "bslongformer"};
  static constexpr std::array<SparsityMode, 5> kModeOf{SparsityMode::dense, SparsityMode::fixed, SparsityMode::variable,
                                                       SparsityMode::bigbird, SparsityMode::bslongformer};
  std::size_t mode = 1;  // DeepSpeed's default: fixed
  if (b.get_choice("mode", mode, kModes) == Got::invalid) return b.finish();
  context::SparsityConfig s;
  s.mode = kModeOf[mode];
  s.num_random_blocks = 0;  // DeepSpeed's config default (the BigBird class's own is 1)
  constexpr int kMax = std::numeric_limits<int>::max();
  bool ok = b.get_int("block", s.block, 1, kMax) != Got::invalid;
  // The keys each mode reads (DeepSpeed's get_sparse_<mode>_config); the others are noted.
  struct Key {
    std::string_view name;
    unsigned modes;  // bit per kModes entry
  };
  static constexpr unsigned F = 2, V = 4, B = 8, L = 16;  // fixed, variable, bigbird, bslongformer
  static constexpr std::array<Key, 11> kKeys{{{"different_layout_per_head", F | V | B | L},
                                              {"num_local_blocks", F},
                                              {"num_global_blocks", F | B},
                                              {"attention", F | V},
                                              {"horizontal_global_attention", F | V},
                                              {"num_different_global_patterns", F},
                                              {"num_random_blocks", V | B},
                                              {"local_window_blocks", V},
                                              {"global_block_indices", V | L},
                                              {"global_block_end_indices", V | L},
                                              {"num_sliding_window_blocks", B | L}}};
  const unsigned mine = 1u << mode;
  for (const Key& k : kKeys) {
    if ((k.modes & mine) == 0) {
      if (const Json* v = b.find(k.name); v != nullptr) {
        unsupported(b.path_of(k.name), cat("not read in mode \"", kModes[mode], "\" (DeepSpeed ignores it too); ignored"), show(*v));
      }
      continue;
    }
    const std::string_view n = k.name;
    if (n == "different_layout_per_head") ok = b.get_bool(n, s.different_layout_per_head) != Got::invalid && ok;
    if (n == "num_local_blocks") ok = b.get_int(n, s.num_local_blocks, 1, kMax) != Got::invalid && ok;
    if (n == "num_global_blocks") ok = b.get_int(n, s.num_global_blocks, 1, kMax) != Got::invalid && ok;
    if (n == "horizontal_global_attention") ok = b.get_bool(n, s.horizontal_global_attention) != Got::invalid && ok;
    if (n == "num_different_global_patterns") ok = b.get_int(n, s.num_different_global_patterns, 1, kMax) != Got::invalid && ok;
    if (n == "num_random_blocks") ok = b.get_int(n, s.num_random_blocks, 0, kMax) != Got::invalid && ok;
    if (n == "num_sliding_window_blocks") ok = b.get_int(n, s.num_sliding_window_blocks, 1, kMax) != Got::invalid && ok;
    if (n == "local_window_blocks") ok = read_int_list(*this, b, n, 1, s.local_window_blocks) && ok;
    if (n == "global_block_indices") ok = read_int_list(*this, b, n, 0, s.global_block_indices) && ok;
    if (n == "global_block_end_indices") {
      std::vector<int> ends;
      const Json* v = b.find(n);
      if (v != nullptr && !v->is_null()) {
        ok = read_int_list(*this, b, n, 0, ends) && ok;
        s.global_block_end_indices = std::move(ends);
      }
    }
    if (n == "attention") {
      std::string a = "bidirectional";
      if (b.get_string(n, a) == Got::value && a != "bidirectional" && a != "unidirectional") {
        error(b.path_of(n), "must be \"unidirectional\" or \"bidirectional\"", show(*b.find(n)));
        ok = false;
      }
      s.unidirectional = a == "unidirectional";
    }
  }
  b.finish();
  if (!ok) return;
  try {
    context::check_config(s);
  } catch (const config_error& e) {
    // "sparse_attention (fixed): num_local_blocks" -> the key's path.
    const std::string& w = e.where();
    const std::size_t colon = w.rfind(": ");
    error(b.path_of(colon == std::string::npos ? std::string_view() : std::string_view(w).substr(colon + 2)), e.message(), e.value());
    return;
  }
  c.sparse_attention = s;
}

}  // namespace zerotk::config::detail
