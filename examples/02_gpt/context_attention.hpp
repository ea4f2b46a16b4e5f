#pragma once
// examples/02_gpt/context_attention.hpp: a block's causal self-attention over sequences split across
// the context group (--cp P: context rank c holds tokens [c n, (c + 1) n) of every sequence, n = T / P),
// block-sparse under --sparse-attention, built from zerotk::context's pieces:
//
//   kernel   zerotk::context::BlockSparseAttention: per (sequence, head) row, the keys of the kept
//            blocks in ascending order (a dense layout when no --sparse-attention), keeping the
//            output and each row's log-sum-exp for backward, not a [T][T] probability matrix
//   a2a      Ulysses (zerotk::context::Ulysses): one all-to-all gives each context rank the whole
//            sequence for 1/P of the (sequence, head) pairs, and the inverse brings the output back
//   p2p      the mask-aware ring (zerotk::context::MaskedRing): keys and values of the earlier
//            chunks (of the blocks a query of this rank attends to) come to this rank; partial
//            outputs merge by log-sum-exp (merge_partial)
//   a2a+p2p  Ulysses inside groups of A adjacent context ranks, the ring across the P / A groups
//            (zerotk::context::split_hybrid)
//
// The B sequences of the micro-batch ride together: q, k and v are packed [tokens][B x heads][d],
// the B x heads pairs being the "heads" the context pieces see (each pair's attention is
// independent), so one all-to-all or one ring pass serves the whole micro-batch. The layout given
// to the kernel has one head per pair, a copy of the model head's (DeepSpeed's layouts may differ
// per head; a tensor rank's heads are heads [first_head, first_head + heads) of the model).
//
// Evaluation turns the split off (set_split(false)): every token on this rank, the same kernel.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <zerotk/comm/any.hpp>
#include <zerotk/context/block_sparse.hpp>
#include <zerotk/context/hybrid.hpp>
#include <zerotk/context/masked_ring.hpp>
#include <zerotk/context/ring.hpp>
#include <zerotk/context/sparsity.hpp>
#include <zerotk/context/ulysses.hpp>
#include <zerotk/core/error.hpp>

#include "layers.hpp"

namespace gpt {

/// How the blocks' attention runs: over the context group (--cp, --cp-mode) and with which layout
/// (--sparse-attention). `on` false: the blocks' own dense attention (gpt.hpp), nothing here.
struct ContextParallel {
  using Comm = zerotk::comm::AnyCommunicator;
  bool on = false;   ///< attention through ContextAttention (any --cp or --sparse-attention)
  int size = 1;      ///< P: context ranks a sequence splits over
  int rank = 0;      ///< this rank's chunk: tokens [rank n, (rank + 1) n) of each sequence
  std::shared_ptr<Comm> a2a;   ///< Ulysses' group (A ranks; null: A = 1)
  std::shared_ptr<Comm> ring;  ///< the ring's group (R = P / A ranks; null: R = 1)
  std::optional<zerotk::context::SparsityConfig> sparse;  ///< the layout's config (its `heads` set by the model)

  bool split() const noexcept { return on && size > 1; }
  /// Bytes this rank has sent over its Ulysses group and its ring (their communicators' counters).
  std::uint64_t bytes_sent() const {
    return (a2a ? a2a->stats().total_wire_bytes() : 0) + (ring ? ring->stats().total_wire_bytes() : 0);
  }
  int a2a_size() const noexcept { return a2a ? a2a->size() : 1; }
  int ring_size() const noexcept { return ring ? ring->size() : 1; }
  int ring_rank() const noexcept { return ring ? ring->rank() : 0; }

  /// Throws zerotk::usage_error naming the value when the groups do not make the context group, and
  /// a config_error naming the key of a layout config DeepSpeed refuses. (The model's shape against
  /// the sequence split is checked where the batch is known: context_share, ContextAttention.)
  void check() const {
    if (!on) return;
    if (size < 1 || rank < 0 || rank >= size || a2a_size() * ring_size() != size) {
      throw zerotk::usage_error("the context rank, its Ulysses group and its ring do not make the context group",
                                "gpt::ContextParallel",
                                "rank " + std::to_string(rank) + " of " + std::to_string(size) + ", a2a " +
                                    std::to_string(a2a_size()) + " x ring " + std::to_string(ring_size()));
    }
    if (sparse) zerotk::context::check_config(*sparse);
  }
};

/// The context group of `group` (the grid's context(): this rank's index is its chunk) run as `mode`
/// ("a2a", "p2p" or "a2a+p2p" with Ulysses degree `a2a`, which must divide the group; 0: the context
/// ranks each node holds, zerotk::context::node_a2a_size). Collective over `group` for a2a+p2p (it
/// splits the group); every rank must call it.
template <class C>
ContextParallel context_parallel(C& group, const std::string& mode, int a2a,
                                 std::optional<zerotk::context::SparsityConfig> sparse) {
  ContextParallel cp;
  cp.on = true;
  cp.size = group.size();
  cp.rank = group.rank();
  cp.sparse = std::move(sparse);
  if (cp.size == 1) return cp;
  using Comm = ContextParallel::Comm;
  if (mode == "a2a") {
    cp.a2a = std::make_shared<Comm>(group);
  } else if (mode == "p2p") {
    cp.ring = std::make_shared<Comm>(group);
  } else if (mode == "a2a+p2p") {
    auto g = zerotk::context::split_hybrid(group, a2a > 0 ? a2a : zerotk::context::node_a2a_size(group));
    if (g.a2a.size() > 1) cp.a2a = std::make_shared<Comm>(std::move(g.a2a));
    if (g.ring.size() > 1) cp.ring = std::make_shared<Comm>(std::move(g.ring));
  } else {
    throw zerotk::usage_error("must be a2a, p2p or a2a+p2p", "--cp-mode", mode);
  }
  return cp;
}

/// Context rank `rank`'s share of a whole batch (every rank of a replica reads the same samples):
/// tokens [rank n, (rank + 1) n) of each sequence (n = seq / ranks) with their targets, its first
/// position, and its loss factor P x (its targets) / (the batch's targets), so that its mean loss
/// times the factor, averaged over the P ranks, is the whole batch's mean loss (the engine averages
/// over the data group, context ranks included).
inline void context_share(const Batch& whole, int ranks, int rank, Batch& out) {
  if (ranks < 1 || rank < 0 || rank >= ranks || whole.seq % ranks != 0) {
    throw zerotk::usage_error("each context rank takes seq / P tokens of every sequence: P must divide the sequence length",
                              "gpt::context_share",
                              std::to_string(whole.seq) + " tokens over " + std::to_string(ranks) + " context ranks");
  }
  const int n = whole.seq / ranks;
  out.resize(whole.batch, n);
  out.first_position = whole.first_position + rank * n;
  std::size_t mine = 0, all = 0;
  for (int b = 0; b < whole.batch; ++b) {
    const auto from = static_cast<std::size_t>(b) * static_cast<std::size_t>(whole.seq) + static_cast<std::size_t>(rank * n);
    const auto to = static_cast<std::size_t>(b) * static_cast<std::size_t>(n);
    std::copy_n(whole.tokens.begin() + static_cast<std::ptrdiff_t>(from), n, out.tokens.begin() + static_cast<std::ptrdiff_t>(to));
    std::copy_n(whole.targets.begin() + static_cast<std::ptrdiff_t>(from), n, out.targets.begin() + static_cast<std::ptrdiff_t>(to));
  }
  for (std::int32_t t : whole.targets) all += t != Batch::kIgnore ? 1 : 0;
  for (std::int32_t t : out.targets) mine += t != Batch::kIgnore ? 1 : 0;
  out.loss_factor = all == 0 ? 0.0f : whole.loss_factor * static_cast<float>(ranks) * static_cast<float>(mine) / static_cast<float>(all);
}

/// One block's attention under a ContextParallel (see the file comment). Not copyable (it keeps its
/// activations between forward and backward, as the block does).
class ContextAttention {
 public:
  /// `heads` of this tensor rank, heads [first_head, first_head + heads) of the model's `total_heads`.
  ContextAttention(const ContextParallel& cp, int heads, int head_dim, int first_head, int total_heads)
      : cp_(&cp), heads_(heads), hd_(static_cast<std::size_t>(head_dim)), first_head_(first_head), total_heads_(total_heads) {}
  ContextAttention(const ContextAttention&) = delete;
  ContextAttention& operator=(const ContextAttention&) = delete;

  /// Evaluation: false runs every token of each sequence here (no context group); true again for training.
  void set_split(bool on) noexcept { split_on_ = on; }

  /// qkv [B n][3 d] (this rank's n tokens of B sequences; q, k, v column blocks of its heads) ->
  /// att [B n][d].
  void forward(const Matrix& qkv, int n, Matrix& att) {
    const std::size_t d = static_cast<std::size_t>(heads_) * hd_;
    if (n <= 0 || qkv.rows() % n != 0 || static_cast<std::size_t>(qkv.cols()) != 3 * d) {
      throw zerotk::usage_error("qkv must be [B n][3 d]", "gpt::ContextAttention::forward",
                                std::to_string(qkv.rows()) + " x " + std::to_string(qkv.cols()) + " for n " + std::to_string(n));
    }
    prepare(static_cast<int>(qkv.rows() / n), n);
    if (A() > 1 && qkv.rows() / n * heads_ < A()) {  // the same on every rank: all refuse, none waits
      throw zerotk::usage_error("Ulysses gives each of its ranks (sequence, head) pairs: the micro batch x heads must be at "
                                "least its degree",
                                "gpt::ContextAttention",
                                std::to_string(qkv.rows() / n) + " x " + std::to_string(heads_) + " pairs over " +
                                    std::to_string(A()) + " ranks");
    }
    pack(qkv, 0, q_);
    pack(qkv, d, k_);
    pack(qkv, 2 * d, v_);
    const std::size_t rows = m_ * static_cast<std::size_t>(count_);
    if (A() > 1) {
      qa_.resize(rows * hd_), ka_.resize(rows * hd_), va_.resize(rows * hd_);
      ulysses_->seq_to_heads(q_, split_, qa_);
      ulysses_->seq_to_heads(k_, split_, ka_);
      ulysses_->seq_to_heads(v_, split_, va_);
    }
    oa_.assign(rows * hd_, 0.f);
    lsea_.assign(rows, kNone);
    const auto attn = kernel();
    if (!ring_) {
      if (count_ > 0) attn.forward(Q(), K(), V(), oa_, lsea_);
    } else {
      ob_.resize(rows * hd_);
      lseb_.resize(rows);
      ring_->forward(K(), V(), [&](int, std::span<const int> blocks, std::span<const float> kb, std::span<const float> vb) {
        attn.forward(Q(), kb, vb, ob_, lseb_, {.queries_from = first_query_, .key_blocks = blocks});
        zerotk::context::merge_partial(oa_, lsea_, ob_, lseb_, hd_);
      });
    }
    if (A() > 1) {
      o_.resize(q_.size());
      ulysses_->heads_to_seq(oa_, split_, o_);
    }
    detail::ensure_shape(att, qkv.rows(), static_cast<Eigen::Index>(d));
    unpack(A() > 1 ? std::span<const float>(o_) : std::span<const float>(oa_), att, 0);
  }

  /// datt [B n][d] -> dqkv [B n][3 d], after forward.
  void backward(const Matrix& datt, Matrix& dqkv) {
    const std::size_t d = static_cast<std::size_t>(heads_) * hd_;
    pack(datt, 0, do_);
    if (A() > 1) {
      doa_.resize(oa_.size());
      ulysses_->seq_to_heads(do_, split_, doa_);
    }
    const std::span<const float> dO = A() > 1 ? std::span<const float>(doa_) : std::span<const float>(do_);
    dqa_.assign(Q().size(), 0.f);
    dka_.assign(K().size(), 0.f);
    dva_.assign(V().size(), 0.f);
    const auto attn = kernel();
    if (!ring_) {
      if (count_ > 0) attn.backward(Q(), K(), V(), oa_, lsea_, dO, dqa_, dka_, dva_);
    } else {
      ring_->backward(K(), V(), dka_, dva_, [&](int, std::span<const int> blocks, auto kb, auto vb, auto dkb, auto dvb) {
        attn.backward(Q(), kb, vb, oa_, lsea_, dO, dqa_, dkb, dvb, {.queries_from = first_query_, .key_blocks = blocks});
      });
    }
    detail::ensure_shape(dqkv, datt.rows(), static_cast<Eigen::Index>(3 * d));
    if (A() > 1) {
      dq_.resize(q_.size()), dk_.resize(k_.size()), dv_.resize(v_.size());
      ulysses_->heads_to_seq(dqa_, split_, dq_);
      ulysses_->heads_to_seq(dka_, split_, dk_);
      ulysses_->heads_to_seq(dva_, split_, dv_);
      unpack(dq_, dqkv, 0), unpack(dk_, dqkv, d), unpack(dv_, dqkv, 2 * d);
    } else {
      unpack(dqa_, dqkv, 0), unpack(dka_, dqkv, d), unpack(dva_, dqkv, 2 * d);
    }
  }

  /// Activation bytes held now (forward's packed rows, output and log-sum-exps; backward's scratch).
  std::size_t activation_bytes() const noexcept {
    std::size_t n = 0;
    each_buffer(*this, [&](const std::vector<float>& v) { n += v.capacity(); });
    return n * sizeof(float);
  }
  void release() noexcept {
    each_buffer(*this, [](std::vector<float>& v) {
      v.clear();
      v.shrink_to_fit();
    });
  }

 private:
  static constexpr float kNone = -std::numeric_limits<float>::infinity();
  using Comm = ContextParallel::Comm;

  bool split() const noexcept { return split_on_ && cp_->split(); }
  int A() const noexcept { return split() ? cp_->a2a_size() : 1; }

  // f(buffer) for every activation buffer of `self` (const or not).
  template <class Self, class F>
  static void each_buffer(Self& self, F&& f) {
    for (auto* v : {&self.q_, &self.k_, &self.v_, &self.qa_, &self.ka_, &self.va_, &self.oa_, &self.lsea_, &self.o_, &self.ob_,
                    &self.lseb_, &self.do_, &self.doa_, &self.dqa_, &self.dka_, &self.dva_, &self.dq_, &self.dk_, &self.dv_}) {
      f(*v);
    }
  }

  std::span<const float> Q() const { return A() > 1 ? qa_ : q_; }
  std::span<const float> K() const { return A() > 1 ? ka_ : k_; }
  std::span<const float> V() const { return A() > 1 ? va_ : v_; }

  zerotk::context::BlockSparseAttention kernel() const {
    return {.layout = &layout_, .head_dim = hd_, .causal = true};
  }

  // The shapes of a micro-batch of B sequences, n tokens here: the pairs this rank attends for, the
  // kernel's layout over them, the Ulysses re-layout and the ring. Rebuilt when a shape changes.
  void prepare(int B, int n) {
    const bool split_now = split();
    if (B == B_ && n == n_ && split_now == prepared_split_) return;
    B_ = B, n_ = n, prepared_split_ = split_now;
    const int P = split_now ? cp_->size : 1;
    const int pairs = B * heads_;
    const std::size_t T = static_cast<std::size_t>(n) * static_cast<std::size_t>(P);
    // Ulysses over A ranks: this rank attends for pairs [first, first + count) over A n tokens.
    ulysses_.reset();
    int first = 0;
    count_ = pairs;
    if (A() > 1) {
      split_ = zerotk::context::split_heads(pairs, A());
      first = split_.first[static_cast<std::size_t>(cp_->a2a->rank())];
      count_ = split_.count[static_cast<std::size_t>(cp_->a2a->rank())];
      ulysses_ = std::make_unique<zerotk::context::Ulysses<Comm>>(*cp_->a2a, static_cast<std::size_t>(n), hd_);
    }
    m_ = static_cast<std::size_t>(n) * static_cast<std::size_t>(A());
    const int R = split_now ? cp_->ring_size() : 1;
    first_query_ = split_now ? static_cast<std::size_t>(cp_->ring_rank()) * m_ : 0;
    // The model's layout over T tokens: DeepSpeed's for --sparse-attention, else every block (the
    // kernel masks causally inside a block). Dense blocks are n tokens: whole chunks of every rank.
    zerotk::context::BlockLayout base;
    if (cp_->sparse) {
      zerotk::context::SparsityConfig c = *cp_->sparse;
      c.heads = total_heads_;
      base = zerotk::context::make_layout(c, T);
    } else {
      const int blocks = P;
      base = zerotk::context::BlockLayout(1, blocks, n);
      for (int q = 0; q < blocks; ++q) {
        for (int k = 0; k < blocks; ++k) base.set(0, q, k);
      }
    }
    layout_ = zerotk::context::BlockLayout(std::max(count_, 1), base.blocks(), base.block_size());
    for (int j = 0; j < count_; ++j) {
      const int h = (first + j) % heads_;  // pair (b, h): b = (first + j) / heads_
      const int from = base.heads() == 1 ? 0 : first_head_ + h;
      for (int q = 0; q < base.blocks(); ++q) {
        for (int k = 0; k < base.blocks(); ++k) layout_.set(j, q, k, base.has(from, q, k));
      }
    }
    ring_.reset();
    if (R > 1) {
      ring_ = std::make_unique<zerotk::context::MaskedRing<Comm>>(*cp_->ring, layout_, m_,
                                                                   static_cast<std::size_t>(std::max(count_, 1)) * hd_, true);
    }
  }

  // Columns [col, col + heads x d) of `m` ([B n][...]) -> [n][B x heads][d].
  void pack(const Matrix& m, std::size_t col, std::vector<float>& out) const {
    const auto B = static_cast<std::size_t>(B_), n = static_cast<std::size_t>(n_), H = static_cast<std::size_t>(heads_);
    out.resize(n * B * H * hd_);
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t t = 0; t < n; ++t) {
        const float* row = m.data() + (b * n + t) * static_cast<std::size_t>(m.cols()) + col;
        std::copy_n(row, H * hd_, out.data() + (t * B + b) * H * hd_);
      }
    }
  }
  // [n][B x heads][d] -> columns [col, col + heads x d) of `m` ([B n][...]).
  void unpack(std::span<const float> in, Matrix& m, std::size_t col) const {
    const auto B = static_cast<std::size_t>(B_), n = static_cast<std::size_t>(n_), H = static_cast<std::size_t>(heads_);
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t t = 0; t < n; ++t) {
        float* row = m.data() + (b * n + t) * static_cast<std::size_t>(m.cols()) + col;
        std::copy_n(in.data() + (t * B + b) * H * hd_, H * hd_, row);
      }
    }
  }

  const ContextParallel* cp_;
  int heads_;
  std::size_t hd_;
  int first_head_, total_heads_;
  bool split_on_ = true;
  // prepare()'s shapes
  int B_ = 0, n_ = 0;
  bool prepared_split_ = false;
  int count_ = 0;             // (sequence, head) pairs this rank attends for
  std::size_t m_ = 0;         // tokens it attends over per ring step (A n; T without a ring)
  std::size_t first_query_ = 0;
  zerotk::context::HeadSplit split_;
  zerotk::context::BlockLayout layout_;
  std::unique_ptr<zerotk::context::Ulysses<Comm>> ulysses_;
  std::unique_ptr<zerotk::context::MaskedRing<Comm>> ring_;
  // [n][pairs][d] packed (this rank's tokens), [m][count][d] after Ulysses (qa_ ...), outputs
  std::vector<float> q_, k_, v_, qa_, ka_, va_, oa_, lsea_, o_, ob_, lseb_;
  std::vector<float> do_, doa_, dqa_, dka_, dva_, dq_, dk_, dv_;
};

}  // namespace gpt
