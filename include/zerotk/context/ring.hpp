#pragma once
/// \file zerotk/context/ring.hpp
/// Ring attention's schedule over a context-parallel group (docs/context.md): each of the P ranks
/// keeps its queries and passes its key/value block around the ring, so every rank meets every
/// block once; the user's attention kernel runs per block and its partial results merge with an
/// online softmax in a fixed order (blocks of ranks r, r-1, ..., r-P+1). The backward passes the
/// blocks again, and the gradient contributions to a block travel with it and reach its owner after
/// P-1 passes. Per rank, the forward sends 2 N h_kv (P-1)/P elements, forward and backward 6 N
/// h_kv (P-1)/P (SEMANTICS.md section 17; the travelling gradients are fp32).
///
///   zerotk::context::Ring ring(cp_group, k.size());
///   std::vector<float> o(rows * d, 0.f), lse(rows, -INFINITY);
///   ring.forward(k, v, [&](int source, auto kb, auto vb) {
///     my_attention(q, kb, vb, source, o_block, lse_block);         // this rank's queries, that block
///     zerotk::context::merge_partial(o, lse, o_block, lse_block, d);
///   });
///   ring.backward(k, v, dk, dv, [&](int source, auto kb, auto vb, std::span<float> dkb, std::span<float> dvb) {
///     my_attention_backward(q, kb, vb, o, lse, d_o, source, dq, dkb, dvb);  // adds into dq, dkb, dvb
///   });
///
/// Causal attention balances its work with `zigzag_positions` (Megatron's split into 2P chunks:
/// rank r holds chunks r and 2P-1-r); the kernel masks by the positions it is given.

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::context {

/// Merges a block's partial attention (`o_block` normalized over the block, `lse_block` its
/// log-sum-exp per row; -inf where every key was masked) into the running `o` and `lse` (start
/// with 0 and -inf), row by row: rows = lse.size(), each of `d` elements.
inline void merge_partial(std::span<float> o, std::span<float> lse, std::span<const float> o_block,
                          std::span<const float> lse_block, std::size_t d) {
  if (o.size() != lse.size() * d || o_block.size() != o.size() || lse_block.size() != lse.size()) {
    throw usage_error("o, lse, o_block and lse_block must be rows x d, rows, rows x d and rows",
                      "zerotk::context::merge_partial",
                      std::to_string(o.size()) + ", " + std::to_string(lse.size()) + ", " +
                          std::to_string(o_block.size()) + ", " + std::to_string(lse_block.size()));
  }
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  for (std::size_t row = 0; row < lse.size(); ++row) {
    const float a = lse[row], b = lse_block[row];
    if (b == kNone) continue;
    float* out = o.data() + row * d;
    const float* in = o_block.data() + row * d;
    if (a == kNone) {
      for (std::size_t i = 0; i < d; ++i) out[i] = in[i];
      lse[row] = b;
      continue;
    }
    const float top = a > b ? a : b;
    const float m = top + std::log(std::exp(a - top) + std::exp(b - top));
    const float wa = std::exp(a - m), wb = std::exp(b - m);
    for (std::size_t i = 0; i < d; ++i) out[i] = out[i] * wa + in[i] * wb;
    lse[row] = m;
  }
}

/// The global positions of rank `rank`'s `total / P` tokens under Megatron's causal balance: the
/// sequence cut into 2P chunks, rank r holding chunks r and 2P-1-r (total must divide by 2P).
inline std::vector<std::size_t> zigzag_positions(std::size_t total, int ranks, int rank) {
  const auto p = static_cast<std::size_t>(ranks);
  if (ranks < 1 || rank < 0 || rank >= ranks || total % (2 * p) != 0) {
    throw usage_error("the sequence must divide into 2P chunks, and rank be in [0, P)", "zerotk::context::zigzag_positions",
                      std::to_string(total) + " tokens, P " + std::to_string(ranks) + ", rank " + std::to_string(rank));
  }
  const std::size_t chunk = total / (2 * p), r = static_cast<std::size_t>(rank);
  std::vector<std::size_t> pos;
  for (std::size_t c : {r, 2 * p - 1 - r}) {
    for (std::size_t i = 0; i < chunk; ++i) pos.push_back(c * chunk + i);
  }
  return pos;
}

/// The ring over `group` for key and value blocks of `block` elements each (the same on every
/// rank), of element type T (float, bfloat16 or half).
template <comm::Communicator C, class T = float>
class Ring {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bfloat16> || std::is_same_v<T, half>,
                "context::Ring: elements are float, zerotk::bfloat16 or zerotk::half");

 public:
  Ring(C& group, std::size_t block) : c_(&group), n_(block) {}

  /// Calls block(source, k, v) for source = rank, rank-1, ..., rank-P+1 (mod P), the next block
  /// already in flight while it runs.
  template <class F>
  void forward(std::span<const T> k, std::span<const T> v, F&& block) {
    check(k.size(), v.size(), "forward");
    pass_around(k, v, [&](int s, int source, std::span<const T> kb, std::span<const T> vb) {
      static_cast<void>(s);
      block(source, kb, vb);
    });
  }

  /// Calls grad(source, k, v, dk_part, dv_part) in the forward's order; the user adds its queries'
  /// gradient contributions into dk_part and dv_part (fp32; they may already hold other ranks'
  /// contributions to that block: add, never overwrite) and into its own dq. dk and dv receive this rank's block's gradient: its own queries' contribution, plus
  /// the others' summed in ring order (ranks r+1, r+2, ..., r-1), in fp32, rounded once.
  template <class F>
  void backward(std::span<const T> k, std::span<const T> v, std::span<T> dk, std::span<T> dv, F&& grad) {
    check(k.size(), v.size(), "backward");
    check(dk.size(), dv.size(), "backward (dk, dv)");
    std::vector<float> own(2 * n_, 0.f), travel(2 * n_, 0.f), arrived(2 * n_, 0.f);
    pass_around(k, v, [&](int s, int source, std::span<const T> kb, std::span<const T> vb) {
      std::vector<float>& into = s == 0 ? own : travel;
      grad(source, kb, vb, std::span<float>(into.data(), n_), std::span<float>(into.data() + n_, n_));
      if (s == 0 || P() == 1) return;
      // The contributions to `source`'s block go on with it; the next block's arrive from behind
      // (after the last step: this rank's own, home after P-1 passes).
      comm::Work out = c_->send(travel.data(), travel.size(), DType::fp32, next(), kGradTag);
      c_->recv(arrived.data(), arrived.size(), DType::fp32, prev(), kGradTag).wait();
      out.wait();
      std::swap(travel, arrived);
    });
    for (std::size_t i = 0; i < n_; ++i) {
      const bool home = P() > 1;
      dk[i] = from_float<T>(home ? own[i] + travel[i] : own[i]);
      dv[i] = from_float<T>(home ? own[n_ + i] + travel[n_ + i] : own[n_ + i]);
    }
  }

 private:
  static constexpr int kKeyTag = 0x5a10, kValueTag = 0x5a11, kGradTag = 0x5a12;

  int P() const { return c_->size(); }
  int next() const { return (c_->rank() + 1) % P(); }
  int prev() const { return (c_->rank() + P() - 1) % P(); }

  void check(std::size_t k, std::size_t v, const char* what) const {
    if (k != n_ || v != n_) {
      throw usage_error("key and value blocks must have the ring's block size",
                        std::string("zerotk::context::Ring::") + what + " on rank " + std::to_string(c_->rank()),
                        std::to_string(k) + " and " + std::to_string(v) + " (expected " + std::to_string(n_) + ")");
    }
  }

  // fn(step, source, k, v) for steps 0..P-1; the block of step s+1 travels while step s computes.
  template <class F>
  void pass_around(std::span<const T> k, std::span<const T> v, F&& fn) {
    std::vector<T> cur_k(k.begin(), k.end()), cur_v(v.begin(), v.end()), nxt_k(n_), nxt_v(n_);
    const auto dt = dtype_of_v<T>;
    for (int s = 0; s < P(); ++s) {
      comm::Work works[4];
      if (s + 1 < P()) {
        works[0] = c_->send(cur_k.data(), n_, dt, next(), kKeyTag);
        works[1] = c_->send(cur_v.data(), n_, dt, next(), kValueTag);
        works[2] = c_->recv(nxt_k.data(), n_, dt, prev(), kKeyTag);
        works[3] = c_->recv(nxt_v.data(), n_, dt, prev(), kValueTag);
      }
      fn(s, (c_->rank() - s + P()) % P(), std::span<const T>(cur_k), std::span<const T>(cur_v));
      for (comm::Work& w : works) w.wait();
      std::swap(cur_k, nxt_k), std::swap(cur_v, nxt_v);
    }
  }

  C* c_;
  std::size_t n_;
};

}  // namespace zerotk::context
