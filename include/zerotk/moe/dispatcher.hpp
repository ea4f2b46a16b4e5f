#pragma once
/// \file zerotk/moe/dispatcher.hpp
/// The token dispatcher of an expert-parallel layer over the user's buffers (docs/moe.md): drop
/// (Capacity) or keep (Dropless) each routed slot, exchange counts, permute, all_to_all_v, hand
/// the expert's rows to the user in expert order, and the reverse for the combine; the backward
/// runs the same transfers the other way. Rows of `hidden` elements of T (float, bfloat16 or half:
/// 16-bit rows halve the transfers; gates apply and sums accumulate in fp32, rounded once).
///
///   zerotk::moe::Dispatcher d(ep_group, experts, hidden, zerotk::moe::Dropless{});
///   d.dispatch(x, routing);                       // x: [T * h], this rank's tokens
///   for (int e = 0; e < d.local_experts(); ++e)   // the user's expert: rows of d.input(e) -> d.output(e)
///     my_expert[d.first_expert() + e].forward(d.input(e), d.output(e));
///   d.combine(y);                                 // y[t] = sum_j gate_j * expert_{e_j}(x[t]), kept slots
///   d.combine_backward(dy, d_gate);               // d.output_grad(e) for the experts; d_gate for the router
///   ... the user's expert backward writes d.input_grad(e) ...
///   d.dispatch_backward(dx);                      // dx[t] += the rows' gradients, in slot order
///
/// Experts are spread in contiguous blocks: rank r of the expert group holds experts
/// [r * E / E_p, (r + 1) * E / E_p). Expert e receives its rows from source rank 0, then 1, ..., each
/// source's in token order: with a row-wise expert, expert parallelism gives the bits one expert
/// rank gives over the same tokens in rank order. Per rank and layer, forward and backward move
/// 4 T k h b (E_p - 1) / E_p bytes under uniform routing; Dropless sends exactly the routed rows,
/// not DeepSpeed's padding to the largest load.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/moe/router.hpp"

namespace zerotk::moe {

/// Which of an expert's slots a full expert keeps.
enum class DropBy : std::uint8_t {
  position,     ///< first choices before second ones, each in token order (DeepSpeed's order)
  probability,  ///< the slots with the largest router probability (Megatron's "probs"); ties by position
};

/// Keeps every routed slot: the all-to-all sends exactly the routed rows.
struct Dropless {
  static constexpr const char* name = "dropless";
  static constexpr DropBy drop_by = DropBy::position;  // (nothing is dropped)
  std::size_t capacity(std::size_t /*slots*/, std::size_t /*tokens*/, int /*experts*/) const noexcept {
    return SIZE_MAX;
  }
};

/// DeepSpeed's capacity: each expert takes at most max(ceil(T * k / E * factor), min_capacity) of
/// a rank's T * k slots, never more than T, chosen `drop_by` (DeepSpeed's random token selection is
/// not offered); the rest are dropped (their gates count as zero). DeepSpeed's MoE layer sets
/// min_capacity 4.
struct Capacity {
  static constexpr const char* name = "capacity";
  double factor = 1.0;
  std::size_t min_capacity = 0;
  DropBy drop_by = DropBy::position;
  std::size_t capacity(std::size_t slots, std::size_t tokens, int experts) const {
    if (!(factor > 0)) throw usage_error("the capacity factor must be > 0", "zerotk::moe::Capacity", std::to_string(factor));
    const auto c = static_cast<std::size_t>(std::ceil(static_cast<double>(slots) / experts * factor));
    return std::min(std::max(c, min_capacity), tokens);
  }
};

template <comm::Communicator C, class Drop, class T = float>
class Dispatcher {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bfloat16> || std::is_same_v<T, half>,
                "moe::Dispatcher: rows are float, zerotk::bfloat16 or zerotk::half");

 public:
  /// `group`: the expert-parallel group (its size E_p must divide `experts`).
  Dispatcher(C& group, int experts, int hidden, Drop drop = {})
      : c_(&group), experts_(experts), hidden_(static_cast<std::size_t>(hidden)), drop_(drop) {
    const int ep = group.size();
    if (experts < 1 || hidden < 1 || experts % ep != 0) {
      throw usage_error("experts must be a positive multiple of the expert-parallel size, hidden positive",
                        "zerotk::moe::Dispatcher on rank " + std::to_string(group.rank()),
                        std::to_string(experts) + " experts, expert parallel " + std::to_string(ep) + ", hidden " +
                            std::to_string(hidden));
    }
    local_ = experts / ep;
  }

  int local_experts() const noexcept { return local_; }
  int first_expert() const noexcept { return c_->rank() * local_; }
  /// Rows of local expert `e` (0-based on this rank) after dispatch.
  std::size_t rows(int e) const { return rows_by_expert_[static_cast<std::size_t>(e)]; }
  /// Of those, the rows from source rank `source` of the expert group: they follow the rows of
  /// sources 0..source-1 (an expert that sums its weight gradient per source, in source order, gets
  /// the bits of a rank-order all-reduce of per-rank gradients).
  std::size_t rows(int e, int source) const {
    return from_source_[static_cast<std::size_t>(source) * static_cast<std::size_t>(local_) + static_cast<std::size_t>(e)];
  }
  std::span<const T> input(int e) const { return expert_span(in_, e); }
  std::span<T> output(int e) { return expert_span(out_, e); }
  std::span<const T> output_grad(int e) const { return expert_span(dout_, e); }
  std::span<T> input_grad(int e) { return expert_span(din_, e); }
  /// Slots of this rank's last dispatch that were dropped (Capacity), and kept per expert (all E).
  std::size_t dropped() const noexcept { return dropped_; }
  std::span<const std::size_t> kept_per_expert() const noexcept { return kept_; }

  /// Sends this rank's tokens `x` ([T x h]) to their experts as `r` routes them. `r` is read again
  /// by combine() and the backward passes: keep it alive until dispatch_backward().
  void dispatch(std::span<const T> x, const Routing& r) {
    constexpr const char* where = "zerotk::moe::Dispatcher::dispatch";
    if (r.experts != experts_) {
      throw usage_error("the routing's expert count differs from the dispatcher's", where,
                        std::to_string(r.experts) + " vs " + std::to_string(experts_));
    }
    detail::check_shape(x.size(), static_cast<std::size_t>(r.tokens) * hidden_, "x", where);
    routing_ = &r;
    plan(r);
    exchange_counts();
    // Rows leave in (destination, expert, token) order: slot_order_ is sorted that way.
    std::vector<T> send(slot_order_.size() * hidden_);
    for (std::size_t i = 0; i < slot_order_.size(); ++i) {
      const std::size_t t = slot_order_[i] / k();
      std::copy_n(x.data() + t * hidden_, hidden_, send.data() + i * hidden_);
    }
    to_experts(send, in_, out_);
  }

  /// y[t] = sum over t's kept slots j, in slot order, of gate_j * (its expert's output row).
  void combine(std::span<T> y) {
    check_tokens(y, "y", "zerotk::moe::Dispatcher::combine");
    back_ = from_experts(out_);
    std::vector<float> acc(y.size(), 0.f);
    for_each_kept([&](std::size_t t, std::size_t slot, std::size_t row) {
      const float g = routing_->gate[slot];
      for (std::size_t i = 0; i < hidden_; ++i) acc[t * hidden_ + i] += g * to_float(back_[row * hidden_ + i]);
    });
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = from_float<T>(acc[i]);
  }

  /// From dy = d(loss)/dy: d_gate (T * k; dropped slots 0) and, for the experts, output_grad(e).
  void combine_backward(std::span<const T> dy, std::span<float> d_gate) {
    constexpr const char* where = "zerotk::moe::Dispatcher::combine_backward";
    check_tokens(dy, "dy", where);
    detail::check_shape(d_gate.size(), routing_->gate.size(), "d_gate", where);
    std::fill(d_gate.begin(), d_gate.end(), 0.f);
    std::vector<T> send(slot_order_.size() * hidden_);
    for_each_kept([&](std::size_t t, std::size_t slot, std::size_t row) {
      const float g = routing_->gate[slot];
      double dot = 0;
      for (std::size_t i = 0; i < hidden_; ++i) {
        const float d = to_float(dy[t * hidden_ + i]);
        send[row * hidden_ + i] = from_float<T>(g * d);
        dot += static_cast<double>(d) * to_float(back_[row * hidden_ + i]);
      }
      d_gate[slot] = static_cast<float>(dot);
    });
    to_experts(send, dout_, din_);
  }

  /// dx[t] += the input gradients of t's kept slots, in slot order.
  void dispatch_backward(std::span<T> dx) {
    check_tokens(dx, "dx", "zerotk::moe::Dispatcher::dispatch_backward");
    const std::vector<T> got = from_experts(din_);
    std::vector<float> acc(dx.size());
    for (std::size_t i = 0; i < dx.size(); ++i) acc[i] = to_float(dx[i]);
    for_each_kept([&](std::size_t t, std::size_t, std::size_t row) {
      for (std::size_t i = 0; i < hidden_; ++i) acc[t * hidden_ + i] += to_float(got[row * hidden_ + i]);
    });
    for (std::size_t i = 0; i < dx.size(); ++i) dx[i] = from_float<T>(acc[i]);
  }

 private:
  std::size_t k() const noexcept { return static_cast<std::size_t>(routing_->top_k); }
  std::size_t ep() const noexcept { return static_cast<std::size_t>(c_->size()); }
  std::size_t received_rows() const {
    std::size_t n = 0;
    for (std::size_t v : recv_rows_) n += v;
    return n;
  }

  template <class V>
  auto expert_span(V& v, int e) const {
    const auto ue = static_cast<std::size_t>(e);
    return std::span(v.data() + expert_first_[ue] * hidden_, rows_by_expert_[ue] * hidden_);
  }

  void check_tokens(std::span<const T> v, const char* what, const char* where) const {
    if (routing_ == nullptr) throw usage_error("call dispatch() first", where);
    detail::check_shape(v.size(), static_cast<std::size_t>(routing_->tokens) * hidden_, what, where);
  }

  // Which slots are kept, and the order rows leave in.
  void plan(const Routing& r) {
    const std::size_t slots = r.expert.size(), kk = static_cast<std::size_t>(r.top_k);
    const std::size_t cap = drop_.capacity(slots, static_cast<std::size_t>(r.tokens), experts_);
    // Each expert's slots in priority order: first choices first, each in token order ...
    std::vector<std::vector<std::size_t>> wanted(static_cast<std::size_t>(experts_));
    for (std::size_t j = 0; j < kk; ++j) {
      for (std::size_t t = 0; t < static_cast<std::size_t>(r.tokens); ++t) {
        wanted[static_cast<std::size_t>(r.expert[t * kk + j])].push_back(t * kk + j);
      }
    }
    kept_.assign(static_cast<std::size_t>(experts_), 0);
    keep_.assign(slots, 0);
    dropped_ = 0;
    const auto E = static_cast<std::size_t>(experts_);
    for (std::size_t e = 0; e < E; ++e) {
      auto& w = wanted[e];
      if (w.size() > cap && drop_.drop_by == DropBy::probability) {  // ... or by probability
        // Ties keep the priority order (choice j, then token): std::sort with that as the last key
        // (std::stable_sort's temporary buffer is deprecated API in libstdc++, which clang reports).
        std::sort(w.begin(), w.end(), [&](std::size_t a, std::size_t b) {
          const float pa = r.probs[a / kk * E + e], pb = r.probs[b / kk * E + e];
          if (pa != pb) return pa > pb;
          return a % kk != b % kk ? a % kk < b % kk : a / kk < b / kk;
        });
      }
      kept_[e] = std::min(w.size(), cap);
      dropped_ += w.size() - kept_[e];
      for (std::size_t i = 0; i < kept_[e]; ++i) keep_[w[i]] = 1;
    }
    slot_order_.clear();
    for (std::size_t s = 0; s < slots; ++s) {
      if (keep_[s]) slot_order_.push_back(s);
    }
    std::sort(slot_order_.begin(), slot_order_.end(), [&](std::size_t a, std::size_t b) {  // (expert, token)
      return r.expert[a] != r.expert[b] ? r.expert[a] < r.expert[b] : a < b;
    });
    row_of_.assign(slots, 0);
    for (std::size_t i = 0; i < slot_order_.size(); ++i) row_of_[slot_order_[i]] = i;
  }

  // Each source tells each destination how many rows it sends to each of its experts.
  void exchange_counts() {
    const auto L = static_cast<std::size_t>(local_);
    std::vector<std::int32_t> mine(static_cast<std::size_t>(experts_)), theirs(mine.size());
    for (std::size_t e = 0; e < mine.size(); ++e) mine[e] = static_cast<std::int32_t>(kept_[e]);
    c_->all_to_all(mine.data(), theirs.data(), L, DType::int32).wait();
    send_rows_.assign(ep(), 0), recv_rows_.assign(ep(), 0);
    from_source_.assign(ep() * L, 0);  // [source][local expert]
    rows_by_expert_.assign(L, 0), expert_first_.assign(L, 0);
    for (std::size_t d = 0; d < ep(); ++d) {
      for (std::size_t e = 0; e < L; ++e) {
        send_rows_[d] += kept_[d * L + e];
        const auto n = static_cast<std::size_t>(theirs[d * L + e]);
        from_source_[d * L + e] = n;
        recv_rows_[d] += n;
        rows_by_expert_[e] += n;
      }
    }
    for (std::size_t e = 1; e < L; ++e) expert_first_[e] = expert_first_[e - 1] + rows_by_expert_[e - 1];
  }

  // all_to_all_v of rows (`send_rows[d]` rows to rank d, `recv_rows[s]` from rank s).
  void move(const std::vector<T>& send, const std::vector<std::size_t>& send_rows, std::vector<T>& recv,
            const std::vector<std::size_t>& recv_rows) {
    std::vector<std::size_t> sc(ep()), rc(ep());
    for (std::size_t r = 0; r < ep(); ++r) sc[r] = send_rows[r] * hidden_, rc[r] = recv_rows[r] * hidden_;
    c_->all_to_all_v(send.data(), sc, recv.data(), rc, dtype_of_v<T>).wait();
  }

  // Rows in send order to their experts, landing in expert order in `into`; `partner` (what the
  // user writes next: the outputs, the input gradients) is zeroed to the same size.
  void to_experts(const std::vector<T>& send, std::vector<T>& into, std::vector<T>& partner) {
    std::vector<T> got(received_rows() * hidden_);
    move(send, send_rows_, got, recv_rows_);
    into.assign(got.size(), T{});
    to_expert_order(got, into);
    partner.assign(into.size(), T{});
  }

  // The experts' rows (expert order) back to their sources, in send order.
  std::vector<T> from_experts(const std::vector<T>& rows) {
    std::vector<T> src(rows.size()), got(slot_order_.size() * hidden_);
    from_expert_order(rows, src);
    move(src, recv_rows_, got, send_rows_);
    return got;
  }

  // Received rows are [source][local expert][token order]; the user's are [local expert][source][...].
  template <bool ToExpert>
  void reorder(const std::vector<T>& from, std::vector<T>& to) const {
    const auto L = static_cast<std::size_t>(local_);
    std::size_t source_row = 0;
    std::vector<std::size_t> next(expert_first_);
    for (std::size_t s = 0; s < ep(); ++s) {
      for (std::size_t e = 0; e < L; ++e) {
        const std::size_t n = from_source_[s * L + e] * hidden_;
        const std::size_t a = source_row * hidden_, b = next[e] * hidden_;
        if constexpr (ToExpert) {
          std::copy_n(from.data() + a, n, to.data() + b);
        } else {
          std::copy_n(from.data() + b, n, to.data() + a);
        }
        source_row += from_source_[s * L + e];
        next[e] += from_source_[s * L + e];
      }
    }
  }
  void to_expert_order(const std::vector<T>& from, std::vector<T>& to) const { reorder<true>(from, to); }
  void from_expert_order(const std::vector<T>& from, std::vector<T>& to) const { reorder<false>(from, to); }

  // fn(token, slot, row in the send order) for every kept slot, token by token, slot by slot.
  template <class F>
  void for_each_kept(F&& fn) const {
    const std::size_t kk = k();
    for (std::size_t t = 0; t < static_cast<std::size_t>(routing_->tokens); ++t) {
      for (std::size_t j = 0; j < kk; ++j) {
        const std::size_t slot = t * kk + j;
        if (keep_[slot]) fn(t, slot, row_of_[slot]);
      }
    }
  }

  C* c_;
  int experts_ = 1, local_ = 1;
  std::size_t hidden_ = 1;
  Drop drop_;
  const Routing* routing_ = nullptr;
  std::vector<std::size_t> kept_;         // [E] slots kept per expert (this rank's)
  std::vector<char> keep_;                // [T * k]
  std::size_t dropped_ = 0;
  std::vector<std::size_t> slot_order_;   // kept slots in send order
  std::vector<std::size_t> row_of_;       // slot -> its row in the send order
  std::vector<std::size_t> send_rows_, recv_rows_;        // [E_p]
  std::vector<std::size_t> from_source_;                  // [E_p * L]
  std::vector<std::size_t> rows_by_expert_, expert_first_;  // [L]
  std::vector<T> in_, out_, dout_, din_;  // expert-major rows
  std::vector<T> back_;                  // combine: the expert outputs back in send order
};

}  // namespace zerotk::moe
