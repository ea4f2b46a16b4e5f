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
/// bit, at the cost of the kept blocks alone. `keys_from` (optional) restricts the keys to those
/// at positions [keys_from, keys_from + keys) of the layout, for a ring step's block (k and v then
/// hold those rows only), with the queries at [queries_from, queries_from + rows); `key_blocks`
/// names the layout blocks k and v hold instead, for keys that are not contiguous.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <vector>

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

  static constexpr float kNoKeys = -std::numeric_limits<float>::infinity();

  void forward(std::span<const float> q, std::span<const float> k, std::span<const float> v, std::span<float> o,
               std::span<float> lse, Window w = {}) const {
    const Shape s = shape(q.size(), k.size(), v.size(), o.size(), lse.size(), w, "forward");
    std::vector<float> score(s.nk);
    for (std::size_t t = 0; t < s.nq; ++t) {
      for (std::size_t a = 0; a < s.heads; ++a) {
        const std::size_t qa = (t * s.heads + a) * head_dim;
        float top = kNoKeys;
        visit(s, w, t, a, [&](std::size_t j) {
          float dot = 0;
          for (std::size_t i = 0; i < head_dim; ++i) dot += q[qa + i] * k[(j * s.heads + a) * head_dim + i];
          score[j] = dot * s.scale;
          top = std::max(top, score[j]);
        });
        float* out = o.data() + qa;
        std::fill(out, out + head_dim, 0.f);
        lse[t * s.heads + a] = kNoKeys;
        if (top == kNoKeys) continue;
        float sum = 0;
        visit(s, w, t, a, [&](std::size_t j) { sum += std::exp(score[j] - top); });
        visit(s, w, t, a, [&](std::size_t j) {
          const float p = std::exp(score[j] - top) / sum;
          for (std::size_t i = 0; i < head_dim; ++i) out[i] += p * v[(j * s.heads + a) * head_dim + i];
        });
        lse[t * s.heads + a] = top + std::log(sum);
      }
    }
  }

  /// Adds the gradients of q, k and v, given the final o and lse (of every key the rows attend to)
  /// and d_o.
  void backward(std::span<const float> q, std::span<const float> k, std::span<const float> v, std::span<const float> o,
                std::span<const float> lse, std::span<const float> d_o, std::span<float> dq, std::span<float> dk,
                std::span<float> dv, Window w = {}) const {
    const Shape s = shape(q.size(), k.size(), v.size(), o.size(), lse.size(), w, "backward");
    if (d_o.size() != o.size() || dq.size() != q.size() || dk.size() != k.size() || dv.size() != v.size()) {
      throw usage_error("d_o, dq, dk and dv must have o's, q's, k's and v's sizes", "zerotk::context::BlockSparseAttention::backward",
                        std::to_string(d_o.size()) + ", " + std::to_string(dq.size()) + ", " + std::to_string(dk.size()) + ", " +
                            std::to_string(dv.size()));
    }
    for (std::size_t t = 0; t < s.nq; ++t) {
      for (std::size_t a = 0; a < s.heads; ++a) {
        const std::size_t qa = (t * s.heads + a) * head_dim;
        const float l = lse[t * s.heads + a];
        if (l == kNoKeys) continue;
        float D = 0;
        for (std::size_t i = 0; i < head_dim; ++i) D += d_o[qa + i] * o[qa + i];
        visit(s, w, t, a, [&](std::size_t j) {
          const std::size_t ka = (j * s.heads + a) * head_dim;
          float dot = 0, dp = 0;
          for (std::size_t i = 0; i < head_dim; ++i) dot += q[qa + i] * k[ka + i], dp += d_o[qa + i] * v[ka + i];
          const float p = std::exp(dot * s.scale - l);
          const float ds = p * (dp - D) * s.scale;
          for (std::size_t i = 0; i < head_dim; ++i) {
            dv[ka + i] += p * d_o[qa + i];
            dq[qa + i] += ds * k[ka + i];
            dk[ka + i] += ds * q[qa + i];
          }
        });
      }
    }
  }

 private:
  struct Shape {
    std::size_t heads, nq, nk, block;
    float scale;
  };

  Shape shape(std::size_t q, std::size_t k, std::size_t v, std::size_t o, std::size_t lse, const Window& w,
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
    return {heads, q / row, k / row, block, 1.f / std::sqrt(static_cast<float>(head_dim))};
  }

  // f(j) for the local key rows j that query row t of head a attends to, ascending, kept blocks only.
  template <class F>
  void visit(const Shape& s, const Window& w, std::size_t t, std::size_t a, F&& f) const {
    const std::size_t qpos = w.queries_from + t;
    const int qb = static_cast<int>(qpos / s.block);
    if (!w.key_blocks.empty()) {  // the named blocks, one after the other
      for (std::size_t b = 0; b < w.key_blocks.size(); ++b) {
        const int kb = w.key_blocks[b];
        if (!layout->has(static_cast<int>(a), qb, kb)) continue;
        const std::size_t first = static_cast<std::size_t>(kb) * s.block;
        std::size_t last = first + s.block;
        if (causal) last = std::min(last, qpos + 1);
        for (std::size_t pos = first; pos < last; ++pos) f(b * s.block + (pos - first));
      }
      return;
    }
    const std::size_t lo = w.keys_from, hi = w.keys_from + s.nk;  // global key positions held
    for (int kb = static_cast<int>(lo / s.block); kb < layout->blocks() && static_cast<std::size_t>(kb) * s.block < hi; ++kb) {
      if (!layout->has(static_cast<int>(a), qb, kb)) continue;
      const std::size_t first = std::max(lo, static_cast<std::size_t>(kb) * s.block);
      std::size_t last = std::min(hi, static_cast<std::size_t>(kb + 1) * s.block);
      if (causal) last = std::min(last, qpos + 1);
      for (std::size_t pos = first; pos < last; ++pos) f(pos - lo);
    }
  }
};

}  // namespace zerotk::context
