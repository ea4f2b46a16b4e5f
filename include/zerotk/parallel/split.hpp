#pragma once
/// \file zerotk/parallel/split.hpp
/// How a parameter is split across the tensor-parallel group (Megatron's layouts), and which
/// elements of the full parameter each tensor rank holds.
///
/// A parameter is a row-major [rows, cols] matrix (a vector is [n, 1]). `TensorSplit::rows()` cuts
/// dim 0 (the output features of y = x W^T: column-parallel linear, vocab-parallel embedding, their
/// biases); `TensorSplit::cols()` cuts dim 1 (the input features: row-parallel linear);
/// `TensorSplit::replicated()` keeps the whole parameter on every tensor rank (LayerNorm, the bias of
/// a row-parallel linear).
///
/// Fused parameters stack `parts` equal blocks along the split dimension, and each block is cut on
/// its own, so a rank holds its piece of every block in order:
///   - QKV stacked as [q; k; v] (each [heads x head_dim, d]): `rows(3)`, a rank gets the q, k and v
///     rows of its heads. Megatron's own layout interleaves per head ([heads, 3, head_dim]); that is
///     `rows(1)`. Either way the heads must divide by the tensor size (check_heads).
///   - a gated MLP's [gate; up]: `rows(2)`, a rank gets its gate rows and the matching up rows.
///
///   const auto s = zerotk::parallel::TensorSplit::rows(3);
///   zerotk::parallel::check_split("block0.qkv.weight", {3 * 512, 512}, s, tp);   // usage_error if it cannot
///   zerotk::parallel::take_shard<float>(full, {3 * 512, 512}, s, rank, tp, shard);

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "zerotk/core/error.hpp"
#include "zerotk/core/macros.hpp"

namespace zerotk::parallel {

enum class SplitDim : std::uint8_t { none, rows, cols };

constexpr std::string_view to_string(SplitDim d) noexcept {
  return d == SplitDim::none ? "replicated" : d == SplitDim::rows ? "rows (dim 0)" : "cols (dim 1)";
}

struct TensorSplit {
  SplitDim dim = SplitDim::none;
  int parts = 1;  ///< fused blocks stacked along `dim`, each cut on its own

  static constexpr TensorSplit replicated() noexcept { return {}; }
  static constexpr TensorSplit rows(int parts = 1) noexcept { return {SplitDim::rows, parts}; }
  static constexpr TensorSplit cols(int parts = 1) noexcept { return {SplitDim::cols, parts}; }
  constexpr bool is_split() const noexcept { return dim != SplitDim::none; }
  friend constexpr bool operator==(const TensorSplit&, const TensorSplit&) = default;
};

/// A row-major matrix's extent.
struct MatrixShape {
  std::size_t rows = 0, cols = 1;
  constexpr std::size_t numel() const noexcept { return rows * cols; }
  friend constexpr bool operator==(const MatrixShape&, const MatrixShape&) = default;
};

inline std::string to_text(MatrixShape s) { return "[" + std::to_string(s.rows) + ", " + std::to_string(s.cols) + "]"; }
inline std::string to_text(TensorSplit s) {
  std::string t(to_string(s.dim));
  if (s.parts != 1) t += " in " + std::to_string(s.parts) + " fused parts";
  return t;
}

/// Why `split` of parameter `name` with `shape` cannot be cut into `size` pieces, or empty.
inline std::string split_problem(MatrixShape shape, TensorSplit split, int size) {
  if (size < 1) return "the tensor size must be >= 1";
  if (split.parts < 1) return "the fused part count must be >= 1";
  if (!split.is_split()) return {};
  const std::size_t extent = split.dim == SplitDim::rows ? shape.rows : shape.cols;
  const char* dim = split.dim == SplitDim::rows ? "dim 0 (rows)" : "dim 1 (cols)";
  const auto parts = static_cast<std::size_t>(split.parts), n = static_cast<std::size_t>(size);
  if (extent % parts != 0) {
    return std::string(dim) + " = " + std::to_string(extent) + " does not divide into " + std::to_string(parts) +
           " fused parts";
  }
  if ((extent / parts) % n != 0) {
    return std::string(dim) + " = " + std::to_string(extent) + (parts > 1 ? " (" + std::to_string(parts) + " parts of " +
                                                                                std::to_string(extent / parts) + ")"
                                                                          : std::string()) +
           " is not divisible by the tensor size " + std::to_string(size);
  }
  return {};
}

/// Throws usage_error (where = `name`) naming the dimension and both sizes when split_problem says so.
inline void check_split(std::string_view name, MatrixShape shape, TensorSplit split, int size) {
  if (auto p = split_problem(shape, split, size); !p.empty()) {
    throw usage_error("cannot split across the tensor group: " + p, std::string(name),
                      to_text(shape) + " split " + to_text(split));
  }
}

/// Attention heads must divide by the tensor size (each rank computes whole heads).
inline void check_heads(std::string_view name, int heads, int size) {
  if (heads < 1 || size < 1 || heads % size != 0) {
    throw usage_error("the attention heads are not divisible by the tensor size " + std::to_string(size) +
                          " (each tensor rank computes whole heads)",
                      std::string(name), std::to_string(heads) + " heads");
  }
}

/// The extent of one rank's shard (check_split first).
constexpr MatrixShape shard_shape(MatrixShape full, TensorSplit split, int size) noexcept {
  const auto n = static_cast<std::size_t>(size);
  if (split.dim == SplitDim::rows) return {full.rows / n, full.cols};
  if (split.dim == SplitDim::cols) return {full.rows, full.cols / n};
  return full;
}

/// The whole parameter's extent, from the extent of one rank's shard of it.
constexpr MatrixShape full_shape(MatrixShape shard, TensorSplit split, int size) noexcept {
  const auto n = static_cast<std::size_t>(size);
  if (split.dim == SplitDim::rows) return {shard.rows * n, shard.cols};
  if (split.dim == SplitDim::cols) return {shard.rows, shard.cols * n};
  return shard;
}

/// Per element: the index in the full parameter of element `i` of rank `rank`'s shard. The one
/// definition the host loops below and device kernels use.
ZEROTK_HD constexpr std::size_t full_index(std::size_t i, MatrixShape full, TensorSplit split, int rank,
                                           int size) noexcept {
  const auto n = static_cast<std::size_t>(size), r = static_cast<std::size_t>(rank);
  const auto parts = static_cast<std::size_t>(split.parts);
  if (split.dim == SplitDim::rows) {
    const std::size_t row = i / full.cols, col = i % full.cols;
    const std::size_t piece = full.rows / parts / n;  // rows of one part on one rank
    const std::size_t part = row / piece, k = row % piece;
    return (part * (full.rows / parts) + r * piece + k) * full.cols + col;
  }
  if (split.dim == SplitDim::cols) {
    const std::size_t shard_cols = full.cols / n;
    const std::size_t row = i / shard_cols, col = i % shard_cols;
    const std::size_t piece = full.cols / parts / n;
    const std::size_t part = col / piece, k = col % piece;
    return row * full.cols + part * (full.cols / parts) + r * piece + k;
  }
  return i;
}

/// Calls `run(shard_offset, full_offset, count)` for each stretch of elements [begin, begin + count)
/// of rank `rank`'s shard that sits contiguously in the full parameter, in shard order: what a
/// checkpoint merges or splits by (rows: one stretch per fused part; cols: one per row and part).
/// The same mapping as full_index, a run at a time (check_split first).
template <class Run>
void for_each_run(MatrixShape full, TensorSplit split, int rank, int size, std::size_t begin, std::size_t count,
                  Run&& run) {
  const std::size_t end = begin + count, n = static_cast<std::size_t>(size), r = static_cast<std::size_t>(rank);
  const auto parts = static_cast<std::size_t>(split.parts);
  for (std::size_t at = begin; at < end;) {
    std::size_t full_at = at, len = end - at;
    if (split.dim == SplitDim::rows) {
      const std::size_t piece = full.rows / parts / n, stretch = piece * full.cols;  // one part's rows on this rank
      const std::size_t part = at / stretch, within = at % stretch;
      full_at = (part * (full.rows / parts) + r * piece) * full.cols + within;
      len = std::min(len, stretch - within);
    } else if (split.dim == SplitDim::cols) {
      const std::size_t shard_cols = full.cols / n, piece = full.cols / parts / n;
      const std::size_t row = at / shard_cols, col = at % shard_cols, part = col / piece, k = col % piece;
      full_at = row * full.cols + part * (full.cols / parts) + r * piece + k;
      len = std::min(len, piece - k);
    }
    run(at, full_at, len);
    at += len;
  }
}

namespace detail {
inline void check_spans(std::size_t full_size, std::size_t shard_size, MatrixShape full, TensorSplit split, int rank,
                        int size, const char* fn) {
  check_split(fn, full, split, size);
  if (rank < 0 || rank >= size) {
    throw usage_error("the rank is outside the tensor group", fn, std::to_string(rank) + " of " + std::to_string(size));
  }
  if (full_size != full.numel() || shard_size != shard_shape(full, split, size).numel()) {
    throw usage_error("buffer sizes do not match the shape", fn,
                      "full " + std::to_string(full_size) + " (shape " + to_text(full) + "), shard " +
                          std::to_string(shard_size) + " (expected " +
                          std::to_string(shard_shape(full, split, size).numel()) + ")");
  }
}
}  // namespace detail

/// Copies rank `rank`'s shard of `full` into `shard`.
template <class T>
void take_shard(std::span<const T> full, MatrixShape shape, TensorSplit split, int rank, int size, std::span<T> shard) {
  detail::check_spans(full.size(), shard.size(), shape, split, rank, size, "zerotk::parallel::take_shard");
  for (std::size_t i = 0; i < shard.size(); ++i) shard[i] = full[full_index(i, shape, split, rank, size)];
}

/// Writes rank `rank`'s shard back into its place in `full` (merging: once per rank).
template <class T>
void put_shard(std::span<const T> shard, MatrixShape shape, TensorSplit split, int rank, int size, std::span<T> full) {
  detail::check_spans(full.size(), shard.size(), shape, split, rank, size, "zerotk::parallel::put_shard");
  for (std::size_t i = 0; i < shard.size(); ++i) full[full_index(i, shape, split, rank, size)] = shard[i];
}

}  // namespace zerotk::parallel
