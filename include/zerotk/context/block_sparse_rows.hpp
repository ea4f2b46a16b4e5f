#pragma once
/// \file zerotk/context/block_sparse_rows.hpp
/// The per-row definitions of block-sparse attention (docs/context.md), ZEROTK_HD, over plain
/// pointers: one query row of one head forward (`forward_row`), its query gradient (`dq_row`), and
/// one key row's key and value gradients (`dkv_row`). The host drivers (context/block_sparse.hpp)
/// run them row by row; the CUDA kernels (context/cuda/block_sparse.cuh) one thread per row and head.
/// Each row keeps the host's order: keys ascending for a query, queries ascending for a key, so the
/// sums are those of a loop nest over queries then keys.
///
/// Layout as in block_sparse.hpp: q, k, v, o [rows x heads x head_dim], lse [rows x heads].

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "zerotk/core/macros.hpp"

namespace zerotk::context::rows {

/// A block layout's mask as data: [heads][blocks][blocks] bytes (BlockLayout::mask_data()).
struct MaskView {
  const std::uint8_t* mask = nullptr;
  int heads = 0, blocks = 0, block = 0;
  ZEROTK_HD bool has(std::size_t h, std::size_t q, std::size_t k) const {
    return mask[(h * static_cast<std::size_t>(blocks) + q) * static_cast<std::size_t>(blocks) + k] != 0;
  }
};

/// What one call holds: queries at global positions [queries_from, + nq); keys at [keys_from, + nk),
/// or the layout blocks key_blocks[0 .. key_block_count) one after the other.
struct Rows {
  std::size_t heads = 0, head_dim = 0, nq = 0, nk = 0;
  std::size_t queries_from = 0, keys_from = 0;
  const int* key_blocks = nullptr;
  std::size_t key_block_count = 0;
  bool causal = false;
  float scale = 1.0f;

  /// The global position of local key row j.
  ZEROTK_HD std::size_t key_position(const MaskView& m, std::size_t j) const {
    if (key_block_count == 0) return keys_from + j;
    const std::size_t b = static_cast<std::size_t>(m.block);
    return static_cast<std::size_t>(key_blocks[j / b]) * b + j % b;
  }
  /// Whether query row t of head a attends to local key row j.
  ZEROTK_HD bool attends(const MaskView& m, std::size_t t, std::size_t a, std::size_t j) const {
    const std::size_t qpos = queries_from + t, kpos = key_position(m, j), b = static_cast<std::size_t>(m.block);
    return (!causal || kpos <= qpos) && m.has(a, qpos / b, kpos / b);
  }
};

inline constexpr float kNoKeys = -INFINITY;

/// The local key rows query row t of head a attends to, ascending, visiting only kept blocks.
class KeyCursor {
 public:
  ZEROTK_HD KeyCursor(const MaskView& m, const Rows& r, std::size_t t, std::size_t a)
      : m_(&m), r_(&r), a_(a), qpos_(r.queries_from + t), qb_(qpos_ / static_cast<std::size_t>(m.block)) {}

  /// The next row into `j`; false when none is left.
  ZEROTK_HD bool next(std::size_t& j) {
    const std::size_t B = static_cast<std::size_t>(m_->block);
    while (true) {
      if (pos_ < end_) {
        j = row_ + (pos_++ - first_);
        return true;
      }
      if (!open_block(B)) return false;
    }
  }

 private:
  // Moves to the next kept block of the held keys; false at the end.
  ZEROTK_HD bool open_block(std::size_t B) {
    while (true) {
      std::size_t kb = 0, lo = 0, hi = 0, row = 0;
      if (r_->key_block_count > 0) {
        if (block_ >= r_->key_block_count) return false;
        kb = static_cast<std::size_t>(r_->key_blocks[block_]);
        lo = kb * B, hi = lo + B, row = block_ * B;
      } else {
        const std::size_t from = r_->keys_from, to = r_->keys_from + r_->nk;
        kb = from / B + block_;
        if (kb * B >= to || kb >= static_cast<std::size_t>(m_->blocks)) return false;
        lo = kb * B > from ? kb * B : from, hi = (kb + 1) * B < to ? (kb + 1) * B : to, row = lo - from;
      }
      ++block_;
      if (!m_->has(a_, qb_, kb)) continue;
      if (r_->causal && hi > qpos_ + 1) hi = qpos_ + 1;
      if (hi <= lo) continue;
      first_ = pos_ = lo, end_ = hi, row_ = row;
      return true;
    }
  }

  const MaskView* m_;
  const Rows* r_;
  std::size_t a_, qpos_, qb_;
  std::size_t block_ = 0, first_ = 0, pos_ = 0, end_ = 0, row_ = 0;
};

ZEROTK_HD inline float dot(const float* x, const float* y, std::size_t d) {
  float s = 0;
  for (std::size_t i = 0; i < d; ++i) s += x[i] * y[i];
  return s;
}

/// Query row t of head a: o (normalized over the held keys) and lse; -inf and zeros without keys.
ZEROTK_HD inline void forward_row(const MaskView& m, const Rows& r, const float* q, const float* k, const float* v,
                                  float* o, float* lse, std::size_t t, std::size_t a) {
  const std::size_t H = r.heads, d = r.head_dim, qa = (t * H + a) * d;
  float* out = o + qa;
  for (std::size_t i = 0; i < d; ++i) out[i] = 0.f;
  float top = kNoKeys;
  std::size_t j = 0;
  for (KeyCursor c(m, r, t, a); c.next(j);) {
    const float s = dot(q + qa, k + (j * H + a) * d, d) * r.scale;
    top = s > top ? s : top;
  }
  lse[t * H + a] = kNoKeys;
  if (top == kNoKeys) return;
  float sum = 0;
  for (KeyCursor c(m, r, t, a); c.next(j);) sum += ::expf(dot(q + qa, k + (j * H + a) * d, d) * r.scale - top);
  for (KeyCursor c(m, r, t, a); c.next(j);) {
    const float p = ::expf(dot(q + qa, k + (j * H + a) * d, d) * r.scale - top) / sum;
    const float* vj = v + (j * H + a) * d;
    for (std::size_t i = 0; i < d; ++i) out[i] += p * vj[i];
  }
  lse[t * H + a] = top + ::logf(sum);
}

/// The backward terms of one (query, key) pair: p = softmax's probability (from the row's lse `l`)
/// and ds = d(score) x scale, given D = d_o . o of the query row. Every backward form uses this.
struct PairTerms {
  float p, ds;
};
ZEROTK_HD inline PairTerms pair_terms(const Rows& r, const float* q, const float* k, const float* v, const float* d_o,
                                      std::size_t qa, std::size_t ka, float l, float D) {
  const std::size_t d = r.head_dim;
  const float p = ::expf(dot(q + qa, k + ka, d) * r.scale - l);
  return {p, p * (dot(d_o + qa, v + ka, d) - D) * r.scale};
}

/// Adds query row t of head a's gradient into dq, keys ascending (o and lse: the final ones).
ZEROTK_HD inline void dq_row(const MaskView& m, const Rows& r, const float* q, const float* k, const float* v, const float* o,
                             const float* lse, const float* d_o, float* dq, std::size_t t, std::size_t a) {
  const std::size_t H = r.heads, d = r.head_dim, qa = (t * H + a) * d;
  const float l = lse[t * H + a];
  if (l == kNoKeys) return;
  const float D = dot(d_o + qa, o + qa, d);
  std::size_t j = 0;
  for (KeyCursor c(m, r, t, a); c.next(j);) {
    const std::size_t ka = (j * H + a) * d;
    const float ds = pair_terms(r, q, k, v, d_o, qa, ka, l, D).ds;
    for (std::size_t i = 0; i < d; ++i) dq[qa + i] += ds * k[ka + i];
  }
}

/// Adds local key row j of head a's gradients into dk and dv, the queries that attend to it ascending.
ZEROTK_HD inline void dkv_row(const MaskView& m, const Rows& r, const float* q, const float* k, const float* v, const float* o,
                              const float* lse, const float* d_o, float* dk, float* dv, std::size_t j, std::size_t a) {
  const std::size_t H = r.heads, d = r.head_dim, ka = (j * H + a) * d;
  for (std::size_t t = 0; t < r.nq; ++t) {
    const float l = lse[t * H + a];
    if (l == kNoKeys || !r.attends(m, t, a, j)) continue;
    const std::size_t qa = (t * H + a) * d;
    const auto [p, ds] = pair_terms(r, q, k, v, d_o, qa, ka, l, dot(d_o + qa, o + qa, d));
    for (std::size_t i = 0; i < d; ++i) {
      dv[ka + i] += p * d_o[qa + i];
      dk[ka + i] += ds * q[qa + i];
    }
  }
}

// ---- the host's drivers: the same sums in the same order, each score computed once ---------------
// A CUDA thread owns one row and cannot share work across rows; the host runs the rows one after
// the other and can. These give forward_row's, dq_row's and dkv_row's results bit for bit (every
// value is computed by the same expression and every sum visits its terms in the same order;
// tests/context/test_block_sparse.cpp compares them) at a third of forward's dot products and half
// of backward's.

/// forward_row with each visited key's score kept in `scores` (room for r.nk floats).
inline void forward_row_scored(const MaskView& m, const Rows& r, const float* q, const float* k, const float* v, float* o,
                               float* lse, std::size_t t, std::size_t a, float* scores) {
  const std::size_t H = r.heads, d = r.head_dim, qa = (t * H + a) * d;
  float* out = o + qa;
  for (std::size_t i = 0; i < d; ++i) out[i] = 0.f;
  float top = kNoKeys;
  std::size_t j = 0, n = 0;
  for (KeyCursor c(m, r, t, a); c.next(j);) {
    const float s = dot(q + qa, k + (j * H + a) * d, d) * r.scale;
    scores[n++] = s;
    top = s > top ? s : top;
  }
  lse[t * H + a] = kNoKeys;
  if (top == kNoKeys) return;
  float sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    scores[i] = ::expf(scores[i] - top);
    sum += scores[i];
  }
  n = 0;
  for (KeyCursor c(m, r, t, a); c.next(j);) {
    const float p = scores[n++] / sum;
    const float* vj = v + (j * H + a) * d;
    for (std::size_t i = 0; i < d; ++i) out[i] += p * vj[i];
  }
  lse[t * H + a] = top + ::logf(sum);
}

/// dq_row and, for every key row it reaches, dkv_row's term for it, at once: called for query rows
/// t = 0, 1, ... in order, each key row's dk and dv receive their terms in query order, as dkv_row
/// adds them, and dq its terms in key order, as dq_row does.
inline void backward_row_fused(const MaskView& m, const Rows& r, const float* q, const float* k, const float* v,
                               const float* o, const float* lse, const float* d_o, float* dq, float* dk, float* dv,
                               std::size_t t, std::size_t a) {
  const std::size_t H = r.heads, d = r.head_dim, qa = (t * H + a) * d;
  const float l = lse[t * H + a];
  if (l == kNoKeys) return;
  const float D = dot(d_o + qa, o + qa, d);
  std::size_t j = 0;
  for (KeyCursor c(m, r, t, a); c.next(j);) {
    const std::size_t ka = (j * H + a) * d;
    const auto [p, ds] = pair_terms(r, q, k, v, d_o, qa, ka, l, D);
    for (std::size_t i = 0; i < d; ++i) {
      dq[qa + i] += ds * k[ka + i];
      dv[ka + i] += p * d_o[qa + i];
      dk[ka + i] += ds * q[qa + i];
    }
  }
}

}  // namespace zerotk::context::rows
