#pragma once
/// \file zerotk/context/ulysses.hpp
/// DeepSpeed-Ulysses' re-layout over a context-parallel group (docs/context.md): each of the P ranks
/// holds a contiguous chunk of the sequence with every head; one all-to-all gives each rank the
/// whole sequence for its share of the heads, so attention (the user's kernel) runs per head with no
/// further communication; the inverse brings the output back to the sequence chunks. The backward
/// of each is the other.
///
///   const auto q_heads = zerotk::context::split_heads(H, P);           // uneven when P does not divide H
///   const auto kv_heads = zerotk::context::kv_heads_for(q_heads, H, H_kv);  // GQA: the KV heads each rank needs
///   zerotk::context::Ulysses u(cp_group, n_local, head_dim);
///   u.seq_to_heads(q, q_heads, q_all);    // [n_local x H x d] -> [P n_local x H_r x d]
///   u.seq_to_heads(k, kv_heads, k_all);   // (and v)
///   ... attention over the whole sequence for this rank's heads ...
///   u.heads_to_seq(o_all, q_heads, o);    // [P n_local x H_r x d] -> [n_local x H x d]
///   // backward: d_q_all -> heads_to_seq; d_k_all -> heads_to_seq_sum (a KV head several ranks
///   // needed gets their gradients summed in rank order); d_o -> seq_to_heads
///
/// Layout: token-major, then head, then the head's d elements. Per rank, the all-to-all sends and
/// receives n_local x (heads not its own) x d elements per tensor: with P dividing H and H_kv, the
/// forward's Q, K, V and O move B N (2h + 2h_kv)(P - 1)/P^2 elements per rank (SEMANTICS.md section 17).

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::context {

/// Which heads each rank of the context group holds after seq_to_heads: rank r holds heads
/// [first[r], first[r] + count[r]). Ranges may overlap (GQA's KV heads shared by several ranks).
struct HeadSplit {
  std::vector<int> first, count;
  int total = 0;  ///< heads in the tensor
  int ranks() const noexcept { return static_cast<int>(first.size()); }
};

/// `heads` over `ranks`, contiguous, the first heads % ranks ranks one head more (a rank may get
/// none when ranks > heads).
inline HeadSplit split_heads(int heads, int ranks) {
  if (heads < 1 || ranks < 1) {
    throw usage_error("heads and ranks must be >= 1", "zerotk::context::split_heads",
                      std::to_string(heads) + " heads, " + std::to_string(ranks) + " ranks");
  }
  HeadSplit s;
  s.total = heads;
  int at = 0;
  for (int r = 0; r < ranks; ++r) {
    const int n = heads / ranks + (r < heads % ranks ? 1 : 0);
    s.first.push_back(at);
    s.count.push_back(n);
    at += n;
  }
  return s;
}

/// Grouped-query attention: query head i reads KV head i / (heads / kv_heads). The KV heads each
/// rank needs for its query heads (shared ones go to every rank that needs them).
inline HeadSplit kv_heads_for(const HeadSplit& q, int heads, int kv_heads) {
  if (kv_heads < 1 || heads % kv_heads != 0 || q.total != heads) {
    throw usage_error("kv_heads must divide heads (and the query split must be over those heads)",
                      "zerotk::context::kv_heads_for",
                      std::to_string(heads) + " heads, " + std::to_string(kv_heads) + " kv heads");
  }
  const int group = heads / kv_heads;
  HeadSplit s;
  s.total = kv_heads;
  for (int r = 0; r < q.ranks(); ++r) {
    const auto ur = static_cast<std::size_t>(r);
    if (q.count[ur] == 0) {
      s.first.push_back(0), s.count.push_back(0);
      continue;
    }
    const int lo = q.first[ur] / group, hi = (q.first[ur] + q.count[ur] - 1) / group;
    s.first.push_back(lo), s.count.push_back(hi - lo + 1);
  }
  return s;
}

/// The re-layouts over `group` (the context-parallel group, P ranks), for tensors of `tokens`
/// tokens per rank (the same on every rank) and `head_dim` elements per head, of element type T.
template <comm::Communicator C, class T = float>
class Ulysses {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bfloat16> || std::is_same_v<T, half>,
                "context::Ulysses: elements are float, zerotk::bfloat16 or zerotk::half");

 public:
  Ulysses(C& group, std::size_t tokens, std::size_t head_dim) : c_(&group), n_(tokens), d_(head_dim) {
    if (head_dim == 0) throw usage_error("head_dim must be >= 1", "zerotk::context::Ulysses", "0");
  }

  /// [tokens x split.total x d] on this rank -> [P tokens x split.count[rank] x d]: the whole
  /// sequence, in rank order, for this rank's heads.
  void seq_to_heads(std::span<const T> in, const HeadSplit& split, std::span<T> out) {
    check(split, in.size(), n_ * total(split) * d_, out.size(), P() * n_ * mine(split) * d_, "seq_to_heads");
    std::vector<T> send;
    std::vector<std::size_t> sc(P()), rc(P());
    for (std::size_t r = 0; r < P(); ++r) {  // to rank r: my tokens, its heads
      const std::size_t w = static_cast<std::size_t>(split.count[r]) * d_;
      for (std::size_t t = 0; t < n_; ++t) {
        const T* row = in.data() + (t * total(split) + static_cast<std::size_t>(split.first[r])) * d_;
        send.insert(send.end(), row, row + w);
      }
      sc[r] = n_ * w;
      rc[r] = n_ * mine(split) * d_;
    }
    c_->all_to_all_v(send.data(), sc, out.data(), rc, dtype_of_v<T>).wait();  // lands in rank order: the sequence
  }

  /// The inverse where the ranks' heads do not overlap (query heads, the output): [P tokens x
  /// split.count[rank] x d] -> [tokens x split.total x d].
  void heads_to_seq(std::span<const T> in, const HeadSplit& split, std::span<T> out) {
    gather_back(in, split, out, false, "heads_to_seq");
  }

  /// The inverse where heads may be shared (GQA's KV gradients): each head's rows are the sum, in
  /// rank order and in fp32, of what every rank holding it sends back.
  void heads_to_seq_sum(std::span<const T> in, const HeadSplit& split, std::span<T> out) {
    gather_back(in, split, out, true, "heads_to_seq_sum");
  }

 private:
  std::size_t P() const { return static_cast<std::size_t>(c_->size()); }
  static std::size_t total(const HeadSplit& s) { return static_cast<std::size_t>(s.total); }
  std::size_t mine(const HeadSplit& s) const { return static_cast<std::size_t>(s.count[static_cast<std::size_t>(c_->rank())]); }

  void check(const HeadSplit& s, std::size_t in, std::size_t in_want, std::size_t out, std::size_t out_want,
             const char* what) const {
    const std::string where = std::string("zerotk::context::Ulysses::") + what + " on rank " + std::to_string(c_->rank());
    if (static_cast<std::size_t>(s.ranks()) != P()) {
      throw usage_error("the head split is for another number of ranks", where,
                        std::to_string(s.ranks()) + " vs " + std::to_string(P()));
    }
    if (in != in_want || out != out_want) {
      throw usage_error("buffer sizes do not match tokens x heads x head_dim", where,
                        "in " + std::to_string(in) + " (expected " + std::to_string(in_want) + "), out " +
                            std::to_string(out) + " (expected " + std::to_string(out_want) + ")");
    }
  }

  // Every rank sends back, to rank r, the rows of r's tokens for its own heads.
  void gather_back(std::span<const T> in, const HeadSplit& split, std::span<T> out, bool sum, const char* what) {
    check(split, in.size(), P() * n_ * mine(split) * d_, out.size(), n_ * total(split) * d_, what);
    const std::size_t w = mine(split) * d_;
    std::vector<std::size_t> sc(P(), n_ * w), rc(P());
    for (std::size_t r = 0; r < P(); ++r) rc[r] = n_ * static_cast<std::size_t>(split.count[r]) * d_;
    std::size_t received = 0;
    for (std::size_t v : rc) received += v;
    std::vector<T> got(received);
    c_->all_to_all_v(in.data(), sc, got.data(), rc, dtype_of_v<T>).wait();  // in is already [rank][tokens][heads]
    if (!sum) {
      std::size_t at = 0;
      for (std::size_t r = 0; r < P(); ++r) {
        const std::size_t wr = static_cast<std::size_t>(split.count[r]) * d_;
        for (std::size_t t = 0; t < n_; ++t, at += wr) {
          std::copy_n(got.data() + at, wr, out.data() + (t * total(split) + static_cast<std::size_t>(split.first[r])) * d_);
        }
      }
      return;
    }
    std::vector<float> acc(out.size(), 0.f);
    std::size_t at = 0;
    for (std::size_t r = 0; r < P(); ++r) {  // rank order
      const std::size_t wr = static_cast<std::size_t>(split.count[r]) * d_;
      for (std::size_t t = 0; t < n_; ++t, at += wr) {
        float* dst = acc.data() + (t * total(split) + static_cast<std::size_t>(split.first[r])) * d_;
        for (std::size_t i = 0; i < wr; ++i) dst[i] += to_float(got[at + i]);
      }
    }
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = from_float<T>(acc[i]);
  }

  C* c_;
  std::size_t n_, d_;
};

}  // namespace zerotk::context
