#pragma once
/// \file zerotk/context/block_sparse.hpp
/// Block-sparse attention over a BlockLayout (context/sparsity.hpp), forward and backward, on the
/// host (docs/context.md): query block qb of head a attends only to the key blocks
/// layout.keys(a, qb), and with `causal` only to keys at or before the query. q, k, v and o are
/// [tokens x heads x d], lse [tokens x heads] (the log-sum-exp of each row's scores; -inf for a row
/// that attends to nothing, whose output is 0).
///
///   const zerotk::context::BlockSparseAttention attn{.layout = &layout, .head_dim = d, .causal = true};
///   attn.forward(q, k, v, o, lse);
///   attn.backward(q, k, v, o, lse, d_o, dq, dk, dv);   // adds into dq, dk, dv
///
/// The keys of a row are visited in ascending order, kept blocks only, in fp32: the result is that
/// of dense attention under the same element mask when it visits the keys in that order, bit for
/// bit, at the cost of the kept blocks alone. The per-row definitions are
/// context/block_sparse_rows.hpp's, which the CUDA kernels (context/cuda/block_sparse.cuh) share; the
/// host runs their fused forms (each score once), which give the same bits. `keys_from` (optional)
/// restricts the keys to those at positions [keys_from, keys_from + keys) of the layout, for a ring
/// step's block (k and v then hold those rows only), with the queries at [queries_from,
/// queries_from + rows); `key_blocks` names the layout blocks k and v hold instead, for keys that are
/// not contiguous.

#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "zerotk/context/block_sparse_rows.hpp"
#include "zerotk/context/sparsity.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::context {

/// Which rows a BlockSparseAttention call holds: queries at global positions [queries_from, + the
/// rows of q); keys at [keys_from, + the rows of k), or, when `key_blocks` is not empty, the rows
/// of those layout blocks (ascending), one after the other (what a MaskedRing step delivers).
struct AttentionWindow {
  std::size_t queries_from = 0, keys_from = 0;
  std::span<const int> key_blocks{};
};

struct BlockSparseAttention {
  using Window = AttentionWindow;

  const BlockLayout* layout = nullptr;
  std::size_t head_dim = 0;
  bool causal = false;

  static constexpr float kNoKeys = rows::kNoKeys;

  void forward(std::span<const float> q, std::span<const float> k, std::span<const float> v, std::span<float> o,
               std::span<float> lse, Window w = {}) const {
    const rows::Rows r = shape(q.size(), k.size(), v.size(), o.size(), lse.size(), w, "forward");
    const rows::MaskView m = mask();
    std::vector<float> scores(r.nk);
    for (std::size_t t = 0; t < r.nq; ++t) {
      for (std::size_t a = 0; a < r.heads; ++a) {
        rows::forward_row_scored(m, r, q.data(), k.data(), v.data(), o.data(), lse.data(), t, a, scores.data());
      }
    }
  }

  /// Adds the gradients of q, k and v, given the final o and lse (of every key the rows attend to)
  /// and d_o.
  void backward(std::span<const float> q, std::span<const float> k, std::span<const float> v, std::span<const float> o,
                std::span<const float> lse, std::span<const float> d_o, std::span<float> dq, std::span<float> dk,
                std::span<float> dv, Window w = {}) const {
    const rows::Rows r = shape(q.size(), k.size(), v.size(), o.size(), lse.size(), w, "backward");
    if (d_o.size() != o.size() || dq.size() != q.size() || dk.size() != k.size() || dv.size() != v.size()) {
      throw usage_error("d_o, dq, dk and dv must have o's, q's, k's and v's sizes", "zerotk::context::BlockSparseAttention::backward",
                        std::to_string(d_o.size()) + ", " + std::to_string(dq.size()) + ", " + std::to_string(dk.size()) + ", " +
                            std::to_string(dv.size()));
    }
    const rows::MaskView m = mask();
    for (std::size_t t = 0; t < r.nq; ++t) {
      for (std::size_t a = 0; a < r.heads; ++a) {
        rows::backward_row_fused(m, r, q.data(), k.data(), v.data(), o.data(), lse.data(), d_o.data(), dq.data(), dk.data(),
                                 dv.data(), t, a);
      }
    }
  }

  /// The layout as the per-row definitions read it (and a device copy of mask_data() for the kernels).
  rows::MaskView mask() const {
    return {layout->mask_data().data(), layout->heads(), layout->blocks(), layout->block_size()};
  }

  /// The call's rows as the per-row definitions read them; a usage_error naming the sizes when
  /// they do not fit the layout.
  rows::Rows shape(std::size_t q, std::size_t k, std::size_t v, std::size_t o, std::size_t lse, const Window& w,
                   const char* what) const {
    const std::string where = std::string("zerotk::context::BlockSparseAttention::") + what;
    if (!layout || head_dim == 0) throw usage_error("needs a layout and head_dim >= 1", where, "");
    const auto heads = static_cast<std::size_t>(layout->heads()), block = static_cast<std::size_t>(layout->block_size());
    const std::size_t row = heads * head_dim, total = static_cast<std::size_t>(layout->blocks()) * block;
    if (q % row != 0 || k % row != 0 || v != k || o != q || lse != q / head_dim) {
      throw usage_error("q, k, v, o must be rows x heads x head_dim (k and v alike, o as q) and lse rows x heads", where,
                        "q " + std::to_string(q) + ", k " + std::to_string(k) + ", v " + std::to_string(v) + ", o " +
                            std::to_string(o) + ", lse " + std::to_string(lse) + " with " + std::to_string(heads) +
                            " heads of " + std::to_string(head_dim));
    }
    if (!w.key_blocks.empty()) {
      bool ascending = true;
      for (std::size_t i = 0; i < w.key_blocks.size(); ++i) {
        ascending = ascending && w.key_blocks[i] >= 0 && w.key_blocks[i] < layout->blocks() &&
                    (i == 0 || w.key_blocks[i - 1] < w.key_blocks[i]);
      }
      if (!ascending || k / row != w.key_blocks.size() * block) {
        throw usage_error("key_blocks must be ascending blocks of the layout, and k hold block_size rows of each", where,
                          std::to_string(w.key_blocks.size()) + " blocks, " + std::to_string(k / row) + " key rows");
      }
    }
    if (w.queries_from + q / row > total || (w.key_blocks.empty() && w.keys_from + k / row > total)) {
      throw usage_error("the rows run past the layout's " + std::to_string(total) + " tokens", where,
                        "queries [" + std::to_string(w.queries_from) + ", +" + std::to_string(q / row) + "), keys [" +
                            std::to_string(w.keys_from) + ", +" + std::to_string(k / row) + ")");
    }
    rows::Rows r;
    r.heads = heads, r.head_dim = head_dim, r.nq = q / row, r.nk = k / row;
    r.queries_from = w.queries_from, r.keys_from = w.keys_from;
    r.key_blocks = w.key_blocks.data(), r.key_block_count = w.key_blocks.size();
    r.causal = causal;
    r.scale = 1.f / std::sqrt(static_cast<float>(head_dim));
    return r;
  }
};

}  // namespace zerotk::context
