#pragma once
/// \file zerotk/context/sparsity.hpp
/// Block-sparse attention layouts as data (docs/context.md): DeepSpeed's sparsity configs (Dense,
/// Fixed, Variable, BigBird, BSLongformer, LocalSlidingWindow; deepspeed/ops/sparse_attention/
/// sparsity_config.py defines each) give, per head and query block, the key blocks it attends to.
///
///   zerotk::context::SparsityConfig c{.mode = zerotk::context::SparsityMode::bigbird, .heads = 8, .block = 16};
///   const zerotk::context::BlockLayout l = zerotk::context::make_layout(c, 4096);
///   for (int k : l.keys(head, query_block)) ...     // ascending key blocks
///
/// The rules are DeepSpeed's, including its quirks (Variable's random blocks ignore `attention`;
/// BigBird and BSLongformer apply the unidirectional mask after the global rows; Fixed's last
/// window may be short). The random blocks (Variable, BigBird) are drawn as DeepSpeed draws them,
/// with Python's `random.sample` over Python's Mersenne Twister: `SparsityConfig::seed` s gives the
/// layout DeepSpeed makes after `random.seed(s)` (tests/golden/make_sparsity_layouts.py runs
/// DeepSpeed's file to check it). What DeepSpeed refuses is refused here in words, naming the key.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/core/error.hpp"

namespace zerotk::context {

enum class SparsityMode : std::uint8_t { dense, fixed, variable, bigbird, bslongformer, local_sliding_window };

constexpr std::string_view to_string(SparsityMode m) noexcept {
  switch (m) {
    case SparsityMode::dense: return "dense";
    case SparsityMode::fixed: return "fixed";
    case SparsityMode::variable: return "variable";
    case SparsityMode::bigbird: return "bigbird";
    case SparsityMode::bslongformer: return "bslongformer";
    case SparsityMode::local_sliding_window: return "local_sliding_window";
  }
  return "unknown";
}

/// One sparsity config, DeepSpeed's keys (the `sparse_attention` block's, and the classes'
/// arguments); a key a mode does not read is ignored, as DeepSpeed ignores it. Defaults are the
/// classes' (LocalSlidingWindow's attention defaults to unidirectional in DeepSpeed: set it).
struct SparsityConfig {
  SparsityMode mode = SparsityMode::fixed;
  int heads = 1;  ///< num_heads (the model's, not the config block's)
  int block = 16;
  bool different_layout_per_head = false;
  int num_local_blocks = 4;               ///< fixed
  int num_global_blocks = 1;              ///< fixed, bigbird
  bool unidirectional = false;            ///< attention: "unidirectional" (else "bidirectional")
  bool horizontal_global_attention = false;   ///< fixed, variable
  int num_different_global_patterns = 1;      ///< fixed
  int num_random_blocks = 0;              ///< variable (default 0), bigbird (DeepSpeed's default 1)
  std::vector<int> local_window_blocks{4};    ///< variable
  std::vector<int> global_block_indices{0};   ///< variable, bslongformer
  std::optional<std::vector<int>> global_block_end_indices{};  ///< variable, bslongformer
  int num_sliding_window_blocks = 3;      ///< bigbird, bslongformer, local_sliding_window
  std::uint64_t seed = 0;                 ///< the random blocks: Python's random.seed(seed)
};

/// Which key blocks each (head, query block) attends to: `keys(h, q)` ascending.
class BlockLayout {
 public:
  BlockLayout() = default;
  BlockLayout(int heads, int blocks, int block_size)
      : heads_(heads), blocks_(blocks), block_(block_size),
        mask_(static_cast<std::size_t>(heads) * static_cast<std::size_t>(blocks) * static_cast<std::size_t>(blocks), 0) {}

  int heads() const noexcept { return heads_; }
  int blocks() const noexcept { return blocks_; }
  int block_size() const noexcept { return block_; }
  bool has(int h, int q, int k) const { return mask_[at(h, q, k)] != 0; }
  void set(int h, int q, int k, bool on = true) { mask_[at(h, q, k)] = on ? 1 : 0; }
  /// The key blocks of query block q in head h, ascending.
  std::vector<int> keys(int h, int q) const {
    std::vector<int> out;
    for (int k = 0; k < blocks_; ++k) {
      if (has(h, q, k)) out.push_back(k);
    }
    return out;
  }
  /// The mask, [heads][blocks][blocks] bytes (1: kept): what the kernels read (rows::MaskView).
  std::span<const std::uint8_t> mask_data() const noexcept { return mask_; }
  /// Blocks kept, over every head.
  std::size_t kept() const noexcept { return static_cast<std::size_t>(std::count(mask_.begin(), mask_.end(), 1)); }
  bool operator==(const BlockLayout&) const = default;

 private:
  std::size_t at(int h, int q, int k) const {
    return (static_cast<std::size_t>(h) * static_cast<std::size_t>(blocks_) + static_cast<std::size_t>(q)) *
               static_cast<std::size_t>(blocks_) +
           static_cast<std::size_t>(k);
  }
  int heads_ = 0, blocks_ = 0, block_ = 0;
  std::vector<std::uint8_t> mask_;
};

/// What a ring of `ranks` chunks needs of `l`: entry [from * ranks + to] lists, ascending, the key
/// blocks of rank `from`'s chunk that some query block of rank `to`'s chunk attends to in any head
/// (when causal, only blocks starting at or before `to`'s last query). The chunks are equal runs of
/// whole blocks (l.blocks() must divide by ranks). MaskedRing sends by it; the planner counts it.
inline std::vector<std::vector<int>> ring_needs(const BlockLayout& l, int ranks, bool causal) {
  if (ranks <= 0 || l.blocks() % ranks != 0) {
    throw usage_error("the layout's blocks must divide into the ring's chunks", "zerotk::context::ring_needs",
                      std::to_string(l.blocks()) + " blocks over " + std::to_string(ranks) + " ranks");
  }
  const int per = l.blocks() / ranks;
  std::vector<std::vector<int>> needs(static_cast<std::size_t>(ranks) * static_cast<std::size_t>(ranks));
  for (int to = 0; to < ranks; ++to) {
    const int last_query_block = (to + 1) * per - 1;  // a key block starts after the last query iff it is later
    for (int from = 0; from < ranks; ++from) {
      for (int kb = from * per; kb < (from + 1) * per; ++kb) {
        if (causal && kb > last_query_block) continue;
        bool any = false;
        for (int h = 0; h < l.heads() && !any; ++h) {
          for (int qb = to * per; qb < (to + 1) * per && !any; ++qb) any = l.has(h, qb, kb);
        }
        if (any) needs[static_cast<std::size_t>(from * ranks + to)].push_back(kb);
      }
    }
  }
  return needs;
}

namespace detail {

/// Python's `random` module as DeepSpeed uses it: MT19937 seeded as `random.seed(n)` seeds it (the
/// integer's 32-bit words, least significant first, through init_by_array), `getrandbits(k)` for
/// k <= 32, `_randbelow` by rejection, and `sample(range(n), k)`'s two strategies (a pool for small
/// populations, a set of picks otherwise), so the same seed draws the same blocks.
class PythonRandom {
 public:
  explicit PythonRandom(std::uint64_t seed) {
    std::uint32_t key[2] = {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
    init_by_array(key, seed >> 32 ? 2 : 1);
  }

  std::uint32_t getrandbits(int k) { return k == 0 ? 0 : next() >> (32 - k); }

  std::uint32_t randbelow(std::uint32_t n) {
    int k = 0;
    while ((n >> k) != 0) ++k;  // n.bit_length()
    std::uint32_t r = getrandbits(k);
    while (r >= n) r = getrandbits(k);
    return r;
  }

  /// random.sample(range(first, first + n), k).
  std::vector<int> sample(int first, int n, int k) {
    std::vector<int> out(static_cast<std::size_t>(k));
    int setsize = 21;
    if (k > 5) setsize += static_cast<int>(std::pow(4.0, std::ceil(std::log(k * 3.0) / std::log(4.0))));
    if (n <= setsize) {
      std::vector<int> pool(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) pool[static_cast<std::size_t>(i)] = first + i;
      for (int i = 0; i < k; ++i) {
        const auto j = static_cast<std::size_t>(randbelow(static_cast<std::uint32_t>(n - i)));
        out[static_cast<std::size_t>(i)] = pool[j];
        pool[j] = pool[static_cast<std::size_t>(n - i - 1)];
      }
    } else {
      std::vector<char> picked(static_cast<std::size_t>(n), 0);
      for (int i = 0; i < k; ++i) {
        auto j = static_cast<std::size_t>(randbelow(static_cast<std::uint32_t>(n)));
        while (picked[j]) j = static_cast<std::size_t>(randbelow(static_cast<std::uint32_t>(n)));
        picked[j] = 1;
        out[static_cast<std::size_t>(i)] = first + static_cast<int>(j);
      }
    }
    return out;
  }

 private:
  static constexpr int kN = 624, kM = 397;

  void init_genrand(std::uint32_t s) {
    mt_[0] = s;
    for (int i = 1; i < kN; ++i) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + static_cast<std::uint32_t>(i);
    mti_ = kN;
  }
  void init_by_array(const std::uint32_t* key, int length) {
    init_genrand(19650218u);
    int i = 1, j = 0;
    for (int k = std::max(kN, length); k > 0; --k) {
      mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + static_cast<std::uint32_t>(j);
      ++i, ++j;
      if (i >= kN) mt_[0] = mt_[kN - 1], i = 1;
      if (j >= length) j = 0;
    }
    for (int k = kN - 1; k > 0; --k) {
      mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - static_cast<std::uint32_t>(i);
      ++i;
      if (i >= kN) mt_[0] = mt_[kN - 1], i = 1;
    }
    mt_[0] = 0x80000000u;
  }
  std::uint32_t next() {
    if (mti_ >= kN) {
      for (int k = 0; k < kN; ++k) {
        const std::uint32_t y = (mt_[k] & 0x80000000u) | (mt_[(k + 1) % kN] & 0x7fffffffu);
        mt_[k] = mt_[(k + kM) % kN] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
      }
      mti_ = 0;
    }
    std::uint32_t y = mt_[mti_++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
  }

  std::uint32_t mt_[kN] = {};
  int mti_ = kN + 1;
};

[[noreturn]] inline void refuse(const SparsityConfig& c, std::string why, std::string key, std::string value) {
  throw config_error(std::move(why), "sparse_attention (" + std::string(to_string(c.mode)) + "): " + key, std::move(value));
}

inline void check_direction(const SparsityConfig& c) {
  if (c.unidirectional && c.horizontal_global_attention) {
    refuse(c, "only bidirectional attention takes horizontal global attention (DeepSpeed refuses it too)",
           "horizontal_global_attention", "true with attention unidirectional");
  }
}

inline void check_global_ends(const SparsityConfig& c) {
  if (!c.global_block_end_indices) return;
  const auto& ends = *c.global_block_end_indices;
  if (ends.size() != c.global_block_indices.size()) {
    refuse(c, "must have as many entries as global_block_indices (" + std::to_string(c.global_block_indices.size()) + ")",
           "global_block_end_indices", std::to_string(ends.size()) + " entries");
  }
  for (std::size_t i = 0; i < ends.size(); ++i) {
    if (c.global_block_indices[i] >= ends[i]) {
      refuse(c, "each start must be below its end", "global_block_indices / global_block_end_indices",
             std::to_string(c.global_block_indices[i]) + " >= " + std::to_string(ends[i]));
    }
  }
}

// Rows [r0, r1) x columns [c0, c1) of head h, clipped to the layout.
inline void fill(BlockLayout& l, int h, int r0, int r1, int c0, int c1) {
  for (int r = std::max(0, r0); r < std::min(r1, l.blocks()); ++r) {
    for (int k = std::max(0, c0); k < std::min(c1, l.blocks()); ++k) l.set(h, r, k);
  }
}

inline void tril(BlockLayout& l, int h) {
  for (int r = 0; r < l.blocks(); ++r) {
    for (int k = r + 1; k < l.blocks(); ++k) l.set(h, r, k, false);
  }
}

inline void sliding_window(BlockLayout& l, int h, int window, bool causal_end) {
  const int n = l.blocks(), w = window / 2;
  for (int r = 0; r < n; ++r) fill(l, h, r, r + 1, r - w, causal_end ? r + 1 : r + w + 1);
}

// Global rows (when `rows`) and columns over [start, end) clipped, columns from `first_row`.
inline void global_blocks(BlockLayout& l, int h, int start, int end, bool rows, int first_row) {
  if (rows) fill(l, h, start, end, 0, l.blocks());
  fill(l, h, first_row, l.blocks(), start, end);
}

inline void fixed(const SparsityConfig& c, BlockLayout& l, int h) {
  const int n = l.blocks(), L = c.num_local_blocks, G = c.num_global_blocks;
  for (int i = 0; i < n; i += L) {  // local windows
    const int end = std::min(i + L, n);
    for (int r = i; r < end; ++r) fill(l, h, r, r + 1, i, c.unidirectional ? r + 1 : end);
  }
  const int first = L - (1 + h % c.num_different_global_patterns) * G;
  const int end = n - n % L;
  for (int i = first; i < end; i += L) global_blocks(l, h, i, i + G, c.horizontal_global_attention, c.unidirectional ? i : 0);
  if (end < n) {  // the short last window's global blocks
    const int start = std::min(end + first, n - G);
    global_blocks(l, h, start, start + G, c.horizontal_global_attention, c.unidirectional ? start : 0);
  }
}

inline void random_blocks(const SparsityConfig& c, BlockLayout& l, int h, PythonRandom& rng, bool causal_range) {
  const int n = l.blocks(), k = c.num_random_blocks;
  if (n < k) {
    refuse(c, "must not exceed the blocks in a row (" + std::to_string(n) + ")", "num_random_blocks", std::to_string(k));
  }
  for (int r = 0; r < n; ++r) {
    const int population = causal_range ? r + 1 : n;
    if (k > population) {
      refuse(c, "unidirectional: row " + std::to_string(r) + " has only " + std::to_string(population) +
                    " blocks to draw from (DeepSpeed's random.sample raises ValueError here too)",
             "num_random_blocks", std::to_string(k));
    }
    for (int col : rng.sample(0, population, k)) l.set(h, r, col);
  }
}

inline void variable(const SparsityConfig& c, BlockLayout& l, int h, PythonRandom& rng) {
  random_blocks(c, l, h, rng, false);  // DeepSpeed draws over the whole row whatever the attention
  const int n = l.blocks();
  int start = 0, end = 0, last = 0;
  for (int w : c.local_window_blocks) {
    end = std::min(end + w, n);
    for (int r = start; r < end; ++r) fill(l, h, r, r + 1, start, c.unidirectional ? r + 1 : end);
    start += w;
    last = w;
  }
  for (int i = start; i < n; i += last) {  // the remaining windows take the last size
    const int e = std::min(i + last, n);
    for (int r = i; r < e; ++r) fill(l, h, r, r + 1, i, c.unidirectional ? r + 1 : e);
  }
  for (std::size_t g = 0; g < c.global_block_indices.size(); ++g) {
    const int s = c.global_block_indices[g];
    if (s >= n) continue;
    const int e = c.global_block_end_indices ? std::min((*c.global_block_end_indices)[g], n) : s + 1;
    global_blocks(l, h, s, e, c.horizontal_global_attention, c.unidirectional ? s : 0);
  }
}

inline void bigbird(const SparsityConfig& c, BlockLayout& l, int h, PythonRandom& rng) {
  random_blocks(c, l, h, rng, c.unidirectional);
  if (l.blocks() < c.num_sliding_window_blocks) {
    refuse(c, "must not exceed the blocks in a row (" + std::to_string(l.blocks()) + ")", "num_sliding_window_blocks",
           std::to_string(c.num_sliding_window_blocks));
  }
  sliding_window(l, h, c.num_sliding_window_blocks, false);
  if (l.blocks() < c.num_global_blocks) {
    refuse(c, "must not exceed the blocks in a row (" + std::to_string(l.blocks()) + ")", "num_global_blocks",
           std::to_string(c.num_global_blocks));
  }
  global_blocks(l, h, 0, c.num_global_blocks, true, 0);
  if (c.unidirectional) tril(l, h);
}

inline void bslongformer(const SparsityConfig& c, BlockLayout& l, int h) {
  if (l.blocks() < c.num_sliding_window_blocks) {
    refuse(c, "must not exceed the blocks in a row (" + std::to_string(l.blocks()) + ")", "num_sliding_window_blocks",
           std::to_string(c.num_sliding_window_blocks));
  }
  sliding_window(l, h, c.num_sliding_window_blocks, false);
  for (std::size_t g = 0; g < c.global_block_indices.size(); ++g) {
    const int s = c.global_block_indices[g];
    if (s >= l.blocks()) continue;
    const int e = c.global_block_end_indices ? std::min((*c.global_block_end_indices)[g], l.blocks()) : s + 1;
    global_blocks(l, h, s, e, true, 0);
  }
  if (c.unidirectional) tril(l, h);
}

}  // namespace detail

/// The checks DeepSpeed's sparsity classes make of their arguments at construction (those that
/// need the sequence length are make_layout's): a config_error naming the key.
inline void check_config(const SparsityConfig& c) {
  if (c.heads < 1 || c.block < 1) {
    detail::refuse(c, "heads and block must be >= 1", "num_heads / block", std::to_string(c.heads) + " / " + std::to_string(c.block));
  }
  switch (c.mode) {
    case SparsityMode::fixed:
      if (c.num_global_blocks < 1 || c.num_local_blocks < 1 || c.num_local_blocks % c.num_global_blocks != 0) {
        detail::refuse(c, "num_local_blocks must be a multiple of num_global_blocks", "num_local_blocks",
                       std::to_string(c.num_local_blocks) + " with num_global_blocks " + std::to_string(c.num_global_blocks));
      }
      detail::check_direction(c);
      if (c.num_different_global_patterns > 1 && !c.different_layout_per_head) {
        detail::refuse(c, "more than one global pattern needs different_layout_per_head", "num_different_global_patterns",
                       std::to_string(c.num_different_global_patterns));
      }
      if (c.num_different_global_patterns < 1 || c.num_different_global_patterns > c.num_local_blocks / c.num_global_blocks) {
        detail::refuse(c, "must be in [1, num_local_blocks / num_global_blocks = " +
                              std::to_string(c.num_local_blocks / c.num_global_blocks) + "]",
                       "num_different_global_patterns", std::to_string(c.num_different_global_patterns));
      }
      break;
    case SparsityMode::variable:
      detail::check_direction(c);
      detail::check_global_ends(c);
      if (c.local_window_blocks.empty() ||
          std::any_of(c.local_window_blocks.begin(), c.local_window_blocks.end(), [](int w) { return w < 1; })) {
        detail::refuse(c, "must list at least one window of at least one block", "local_window_blocks",
                       std::to_string(c.local_window_blocks.size()) + " entries");
      }
      break;
    case SparsityMode::bslongformer:
      detail::check_global_ends(c);
      break;
    default:
      break;
  }
}

/// The layout of `c` for a sequence of `seq_len` tokens (a multiple of c.block): DeepSpeed's
/// make_layout. A config DeepSpeed refuses is a config_error naming the key.
inline BlockLayout make_layout(const SparsityConfig& c, std::size_t seq_len) {
  check_config(c);
  if (seq_len % static_cast<std::size_t>(c.block) != 0) {
    detail::refuse(c, "the sequence length must divide by the block size", "block",
                   std::to_string(c.block) + " for " + std::to_string(seq_len) + " tokens");
  }
  const int n = static_cast<int>(seq_len / static_cast<std::size_t>(c.block));
  BlockLayout l(c.heads, n, c.block);
  detail::PythonRandom rng(c.seed);
  const int layout_heads = c.different_layout_per_head && c.mode != SparsityMode::local_sliding_window ? c.heads : 1;
  for (int h = 0; h < layout_heads; ++h) {
    switch (c.mode) {
      case SparsityMode::dense: detail::fill(l, h, 0, n, 0, n); break;
      case SparsityMode::fixed: detail::fixed(c, l, h); break;
      case SparsityMode::variable: detail::variable(c, l, h, rng); break;
      case SparsityMode::bigbird: detail::bigbird(c, l, h, rng); break;
      case SparsityMode::bslongformer: detail::bslongformer(c, l, h); break;
      case SparsityMode::local_sliding_window:
        if (n < c.num_sliding_window_blocks) {
          detail::refuse(c, "must not exceed the blocks in a row (" + std::to_string(n) + ")", "num_sliding_window_blocks",
                         std::to_string(c.num_sliding_window_blocks));
        }
        detail::sliding_window(l, h, c.num_sliding_window_blocks, c.unidirectional);
        break;
    }
  }
  // Heads share head 0's layout unless each has its own (Dense always: every block).
  const int from = c.mode == SparsityMode::dense ? 0 : layout_heads;
  for (int h = std::max(from, 1); h < c.heads; ++h) {
    for (int q = 0; q < n; ++q) {
      for (int k = 0; k < n; ++k) l.set(h, q, k, c.mode == SparsityMode::dense || l.has(0, q, k));
    }
  }
  return l;
}

}  // namespace zerotk::context
