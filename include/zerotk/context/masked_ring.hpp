#pragma once
/// \file zerotk/context/masked_ring.hpp
/// Ring attention that reads a block-sparse layout (docs/context.md): rank r of the context group
/// holds tokens [r n, (r + 1) n), and of every other rank's keys and values it receives only the
/// layout blocks some query block of its own attends to (in any head; at or before its last query
/// when causal). Blocks go straight from their owner to the rank that needs them, in the ring's
/// steps (step s: to rank r + s, from rank r - s), so a sliding window that reaches only the
/// previous rank moves one neighbour's edge instead of P - 1 whole chunks.
///
///   zerotk::context::MaskedRing ring(cp_group, layout, n, heads * d, /*causal=*/true);
///   ring.forward(k, v, [&](int source, std::span<const int> blocks, auto kb, auto vb) {
///     attn.forward(q, kb, vb, o_b, lse_b, {.queries_from = r * n, .key_blocks = blocks});
///     zerotk::context::merge_partial(o, lse, o_b, lse_b, d);
///   });
///   ring.backward(k, v, dk, dv, [&](int source, std::span<const int> blocks, auto kb, auto vb, auto dkb, auto dvb) {
///     attn.backward(q, kb, vb, o, lse, d_o, dq, dkb, dvb, {.queries_from = r * n, .key_blocks = blocks});
///   });
///
/// The results are the dense ring's (context/ring.hpp) with the same kernel, bit for bit: the
/// sources come in the same order (r, r - 1, ...; those with nothing needed skipped, which the
/// dense ring's kernel would have left unchanged), and a block's gradient is one running fp32 sum
/// that visits the ranks needing it in ring order (r + 1, r + 2, ...; each sends it straight to the
/// next, the last one home), as the dense ring's travelling sum does, rounded once at home.

#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/context/sparsity.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::context {

template <comm::Communicator C, class T = float>
class MaskedRing {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bfloat16> || std::is_same_v<T, half>,
                "context::MaskedRing: elements are float, zerotk::bfloat16 or zerotk::half");

 public:
  /// `tokens` per rank (a multiple of the layout's block), `row` elements per token of K (and of V).
  MaskedRing(C& group, const BlockLayout& layout, std::size_t tokens, std::size_t row, bool causal)
      : c_(&group), n_(tokens), row_(row), block_(static_cast<std::size_t>(layout.block_size())) {
    const std::string where = "zerotk::context::MaskedRing on rank " + std::to_string(group.rank());
    if (row == 0 || block_ == 0 || tokens % block_ != 0 ||
        static_cast<std::size_t>(layout.blocks()) * block_ != tokens * static_cast<std::size_t>(P())) {
      throw usage_error("each rank's tokens must be whole layout blocks, and the ranks' chunks the layout's sequence",
                        where,
                        std::to_string(tokens) + " tokens x " + std::to_string(P()) + " ranks against " +
                            std::to_string(layout.blocks()) + " blocks of " + std::to_string(block_));
    }
    needed_ = ring_needs(layout, P(), causal);
  }

  /// The key blocks rank `to` receives of rank `from`'s chunk (from == to: its own it computes with), ascending.
  const std::vector<int>& needed(int from, int to) const { return needed_[pair(from, to)]; }

  /// Calls block(source, blocks, k, v) for source = rank, rank-1, ..., rank-P+1 (mod P) where
  /// `needed(source, rank)` is not empty; k and v hold those blocks' rows, one after the other.
  template <class F>
  void forward(std::span<const T> k, std::span<const T> v, F&& block) {
    check(k.size(), v.size(), "forward");
    exchange(k, v, [&](int source, const std::vector<int>& blocks, std::span<const T> kb, std::span<const T> vb) {
      block(source, std::span<const int>(blocks), kb, vb);
    });
  }

  /// Calls grad(source, blocks, k, v, dk_part, dv_part) in the forward's order; the user adds its
  /// queries' contributions into dk_part and dv_part (fp32, the blocks' rows: add, never
  /// overwrite) and into its own dq. dk and dv receive this rank's chunk's gradient: its own
  /// queries' contribution plus the running sum of the others', in fp32, rounded once.
  template <class F>
  void backward(std::span<const T> k, std::span<const T> v, std::span<T> dk, std::span<T> dv, F&& grad) {
    check(k.size(), v.size(), "backward");
    check(dk.size(), dv.size(), "backward (dk, dv)");
    const int r = c_->rank();
    std::vector<float> own(2 * n_ * row_, 0.f), travel(2 * n_ * row_, 0.f);
    std::vector<comm::Work> pending;
    std::vector<std::vector<float>> outbox;  // kept alive until the sends complete
    exchange(k, v, [&](int source, const std::vector<int>& blocks, std::span<const T> kb, std::span<const T> vb) {
      const std::size_t m = blocks.size() * block_ * row_;
      if (source == r) {  // own queries over own blocks: into `own` at the blocks' places
        std::vector<float> part(2 * m, 0.f);
        grad(source, std::span<const int>(blocks), kb, vb, std::span<float>(part.data(), m), std::span<float>(part.data() + m, m));
        scatter(part, blocks, own);
        return;
      }
      // The running sums of these blocks: from the previous rank needing each (or zero), by sender.
      std::vector<float> part(2 * m, 0.f);
      for (const auto& [from, idx] : group_by(blocks, source, -1)) {
        std::vector<float> got(2 * idx.size() * block_ * row_);
        c_->recv(got.data(), got.size(), DType::fp32, from, tag(source)).wait();
        unpack(got, idx, part, blocks.size());
      }
      grad(source, std::span<const int>(blocks), kb, vb, std::span<float>(part.data(), m), std::span<float>(part.data() + m, m));
      for (const auto& [to, idx] : group_by(blocks, source, +1)) {  // on to the next rank needing each, or home
        outbox.push_back(pack(part, idx, blocks.size()));
        pending.push_back(c_->send(outbox.back().data(), outbox.back().size(), DType::fp32, to, tag(source)));
      }
    });
    // Home: each of this rank's blocks that others needed, from the last of them.
    std::vector<int> mine;
    for (int b = 0; b < static_cast<int>(n_ / block_); ++b) mine.push_back(r * static_cast<int>(n_ / block_) + b);
    std::map<int, std::vector<std::size_t>> home;
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const int last = neighbour(mine[i], r, r, -1);
      if (last != r) home[last].push_back(i);
    }
    for (const auto& [from, idx] : home) {
      std::vector<float> got(2 * idx.size() * block_ * row_);
      c_->recv(got.data(), got.size(), DType::fp32, from, tag(r)).wait();
      unpack(got, idx, travel, mine.size());
    }
    for (comm::Work& w : pending) w.wait();
    const std::size_t half = n_ * row_;
    for (std::size_t i = 0; i < half; ++i) {
      dk[i] = from_float<T>(P() > 1 ? own[i] + travel[i] : own[i]);
      dv[i] = from_float<T>(P() > 1 ? own[half + i] + travel[half + i] : own[half + i]);
    }
  }

 private:
  static constexpr int kKeyTag = 0x5b10, kValueTag = 0x5b11, kGradTagBase = 0x4000;

  int P() const { return c_->size(); }
  std::size_t pair(int from, int to) const { return static_cast<std::size_t>(from * P() + to); }
  static int tag(int source) { return kGradTagBase + source; }
  bool needs(int rank, int kb) const {
    const int owner = kb / static_cast<int>(n_ / block_);
    for (int b : needed(owner, rank)) {
      if (b == kb) return true;
    }
    return false;
  }
  // Walking from `rank` in direction `dir` (ring order), the first rank other than the owner that
  // needs block kb; the owner `source` when none does before it comes round.
  int neighbour(int kb, int source, int rank, int dir) const {
    for (int q = (rank + dir + P()) % P(); q != source; q = (q + dir + P()) % P()) {
      if (needs(q, kb)) return q;
    }
    return source;
  }
  // blocks' indices grouped by the neighbour each goes to (+1) or comes from (-1); from none (-1
  // reaching the owner) means the running sum starts here: not listed.
  std::map<int, std::vector<std::size_t>> group_by(const std::vector<int>& blocks, int source, int dir) const {
    std::map<int, std::vector<std::size_t>> out;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const int q = neighbour(blocks[i], source, c_->rank(), dir);
      if (dir < 0 && q == source) continue;
      out[q].push_back(i);
    }
    return out;
  }
  // part = [dk of the blocks | dv of the blocks]; a message = [dk of idx | dv of idx].
  std::vector<float> pack(const std::vector<float>& part, const std::vector<std::size_t>& idx, std::size_t count) const {
    const std::size_t b = block_ * row_, half = count * b;
    std::vector<float> out;
    for (std::size_t side = 0; side < 2; ++side) {
      for (std::size_t i : idx) out.insert(out.end(), part.begin() + static_cast<std::ptrdiff_t>(side * half + i * b),
                                           part.begin() + static_cast<std::ptrdiff_t>(side * half + (i + 1) * b));
    }
    return out;
  }
  void unpack(const std::vector<float>& msg, const std::vector<std::size_t>& idx, std::vector<float>& part, std::size_t count) const {
    const std::size_t b = block_ * row_, half = count * b;
    std::size_t at = 0;
    for (std::size_t side = 0; side < 2; ++side) {
      for (std::size_t i : idx) {
        for (std::size_t e = 0; e < b; ++e) part[side * half + i * b + e] = msg[at++];
      }
    }
  }
  // A rank's own blocks' part into its chunk-wide [dk | dv] buffer.
  void scatter(const std::vector<float>& part, const std::vector<int>& blocks, std::vector<float>& chunk) const {
    const std::size_t b = block_ * row_, half = n_ * row_, m = blocks.size() * b;
    const std::size_t first = static_cast<std::size_t>(c_->rank()) * (n_ / block_);
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const std::size_t at = (static_cast<std::size_t>(blocks[i]) - first) * b;
      for (std::size_t e = 0; e < b; ++e) {
        chunk[at + e] += part[i * b + e];
        chunk[half + at + e] += part[m + i * b + e];
      }
    }
  }

  void check(std::size_t k, std::size_t v, const char* what) const {
    if (k != n_ * row_ || v != n_ * row_) {
      throw usage_error("key and value chunks must be tokens x row elements",
                        std::string("zerotk::context::MaskedRing::") + what + " on rank " + std::to_string(c_->rank()),
                        std::to_string(k) + " and " + std::to_string(v) + " (expected " + std::to_string(n_ * row_) + ")");
    }
  }

  // This rank's blocks go to every rank that needs them at once (step s: rank r + s), so no
  // receiver waits on a sender's compute; then fn(source, blocks, k, v) for each source with
  // blocks, in the order r, r - 1, ..., its blocks received at that step.
  template <class F>
  void exchange(std::span<const T> k, std::span<const T> v, F&& fn) {
    const int r = c_->rank();
    const auto dt = dtype_of_v<T>;
    const std::size_t b = block_ * row_, first = static_cast<std::size_t>(r) * (n_ / block_);
    std::vector<std::vector<T>> sent;
    sent.reserve(2 * static_cast<std::size_t>(P()));  // the buffers stay where the sends read them
    std::vector<comm::Work> sends;
    for (int s = 1; s < P(); ++s) {
      const int to = (r + s) % P();
      if (!needed(r, to).empty()) {
        std::vector<T> kk, vv;
        for (int kb : needed(r, to)) {
          const std::size_t at = (static_cast<std::size_t>(kb) - first) * b;
          kk.insert(kk.end(), k.begin() + static_cast<std::ptrdiff_t>(at), k.begin() + static_cast<std::ptrdiff_t>(at + b));
          vv.insert(vv.end(), v.begin() + static_cast<std::ptrdiff_t>(at), v.begin() + static_cast<std::ptrdiff_t>(at + b));
        }
        sent.push_back(std::move(kk));
        sends.push_back(c_->send(sent.back().data(), sent.back().size(), dt, to, kKeyTag));
        sent.push_back(std::move(vv));
        sends.push_back(c_->send(sent.back().data(), sent.back().size(), dt, to, kValueTag));
      }
    }
    for (int s = 0; s < P(); ++s) {
      const int from = (r - s + P()) % P();
      const std::vector<int>& blocks = needed(from, r);
      if (blocks.empty()) continue;
      std::vector<T> kk(blocks.size() * b), vv(blocks.size() * b);
      if (s == 0) {
        for (std::size_t i = 0; i < blocks.size(); ++i) {
          const std::size_t at = (static_cast<std::size_t>(blocks[i]) - first) * b;
          std::copy_n(k.data() + at, b, kk.data() + i * b);
          std::copy_n(v.data() + at, b, vv.data() + i * b);
        }
      } else {
        comm::Work wk = c_->recv(kk.data(), kk.size(), dt, from, kKeyTag);
        comm::Work wv = c_->recv(vv.data(), vv.size(), dt, from, kValueTag);
        wk.wait(), wv.wait();
      }
      fn(from, blocks, std::span<const T>(kk), std::span<const T>(vv));
    }
    for (comm::Work& w : sends) w.wait();
  }

  C* c_;
  std::size_t n_, row_, block_;
  std::vector<std::vector<int>> needed_;  // [from * P + to]
};

}  // namespace zerotk::context
