#pragma once
// examples/02_gpt/moe_mlp.hpp: a block's MLP as a mixture of experts (Config::experts > 0).
//
//   x [N][d] -> router logits = x W_r^T + b_r [N][E] -> zerotk::moe::route: top-k experts and gates
//            -> zerotk::moe::Dispatcher over the expert-parallel group: each row to its experts' rank
//            -> expert e: proj_e(gelu(fc_e(rows))), the dense MLP's shape, on the rows it received
//            -> combine: y[t] = sum over t's kept slots of gate * expert output
//
// Expert e's parameters are named blocks.<i>.mlp.experts.<e>.fc/proj with e the GLOBAL expert index:
// a rank of the expert-parallel group holds experts [r E / E_p, (r + 1) E / E_p), and the names say
// which, so checkpoints carry whole experts under one name whatever E_p saved them. The engine learns
// they are experts from those names (train.cpp's EngineOptions::expert) and reduces and shards them
// over the expert-data group. The router is dense: every rank holds it, its gradient averages over the
// data group as any other.
//
// Under tensor parallelism the experts are whole on every tensor rank (the expert layout's
// expert_tensor equals the tensor size): each tensor rank dispatches its copy of the block's token rows
// over its own expert group and computes the same values. Sequence parallelism (token rows split over
// the tensor group) is refused: the experts would see a different token set per tensor rank.
//
// Drops: Dropless keeps every routed slot; a capacity factor c keeps at most ceil(N k / E x c) of a
// rank's slots per expert (DeepSpeed's), first choices first in token order.
//
// Balance: with ExpertParallel::balance_coef > 0 the Switch Transformer's balance loss,
// coef x E x sum_i f_i P_i over this rank's tokens (zerotk::moe::switch_balance), joins the loss: its
// gradient is added to the router logits' in backward (switch_balance_backward), unscaled, as the
// example's experts train in fp32 without a loss scale; a trainer with one multiplies coef by it.
// The printed loss stays the cross-entropy; ExpertLoad::balance_loss sums the term over the backward
// passes (ExpertLoad::passes counts them).
//
// Each backward adds the
// slots kept per expert and those dropped to load() (forward does not, so a recomputed forward
// counts once).
#include <Eigen/Core>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <zerotk/comm/any.hpp>
#include <zerotk/core/error.hpp>
#include <zerotk/moe/balance.hpp>
#include <zerotk/moe/dispatcher.hpp>
#include <zerotk/moe/router.hpp>

#include "layers.hpp"

namespace gpt {

/// The group a model's mixture-of-experts blocks dispatch over, and how full experts drop.
struct ExpertParallel {
  /// The expert-parallel group: its size E_p divides Config::experts. Required when experts > 0.
  std::shared_ptr<zerotk::comm::AnyCommunicator> group;
  /// 0: dropless; otherwise DeepSpeed's capacity factor (> 0).
  double capacity = 0;
  /// The balance loss's coefficient (0: none; Switch Transformer and DeepSpeed use 0.01).
  double balance_coef = 0;

  int size() const { return group ? group->size() : 1; }

  /// Throws zerotk::usage_error naming the value when `c` cannot run this way.
  void check(const Config& c, const TensorParallel& tp) const {
    if (c.experts == 0) return;
    if (!group) {
      throw zerotk::usage_error("a model with experts needs its expert-parallel group (size 1 for all experts on one rank)",
                                "gpt::ExpertParallel", std::to_string(c.experts) + " experts");
    }
    if (c.experts % group->size() != 0) {
      throw zerotk::usage_error("the expert-parallel size must divide the experts (each rank holds E / E_p whole experts)",
                                "gpt::ExpertParallel",
                                std::to_string(c.experts) + " experts, expert parallel " + std::to_string(group->size()));
    }
    if (capacity < 0) throw zerotk::usage_error("the capacity factor must be > 0 (0: dropless)", "gpt::ExpertParallel", std::to_string(capacity));
    if (!(balance_coef >= 0)) {
      throw zerotk::usage_error("the balance loss coefficient must be >= 0", "gpt::ExpertParallel", std::to_string(balance_coef));
    }
    if (tp.sequence_parallel) {
      throw zerotk::usage_error("experts with sequence parallelism are not offered: each tensor rank would route a "
                                "different token set through experts that must stay equal on every tensor rank",
                                "gpt::ExpertParallel", "tensor " + std::to_string(tp.size) + ", sequence parallel");
    }
  }
};

/// True for the parameters of an expert, as MoeMlp names them (blocks.<i>.mlp.experts.<e>.*): how a
/// trainer tells the engine which parameters are experts' (EngineOptions::expert).
inline bool is_expert_param(std::string_view name) noexcept { return name.find(".mlp.experts.") != std::string_view::npos; }

/// Slots routed, kept per expert and dropped, summed over the backward passes of one rank's layers.
struct ExpertLoad {
  std::vector<double> kept;  ///< [E]
  double dropped = 0;
  double slots = 0;  ///< tokens x top_k
  double balance_loss = 0;  ///< coef x the Switch balance loss, summed (ExpertParallel::balance_coef)
  double passes = 0;        ///< backward passes counted (one per block and micro-batch)
  void add(const ExpertLoad& o) {
    if (kept.size() < o.kept.size()) kept.resize(o.kept.size(), 0.0);
    for (std::size_t e = 0; e < o.kept.size(); ++e) kept[e] += o.kept[e];
    dropped += o.dropped;
    slots += o.slots;
    balance_loss += o.balance_loss;
    passes += o.passes;
  }
  /// As E + 4 numbers (kept..., dropped, slots, balance_loss, passes): what a sum over ranks adds.
  std::vector<double> packed() const {
    std::vector<double> v(kept);
    v.insert(v.end(), {dropped, slots, balance_loss, passes});
    return v;
  }
  static ExpertLoad unpacked(const std::vector<double>& v) {
    const std::size_t e = v.size() - 4;
    return {std::vector<double>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(e)), v[e], v[e + 1], v[e + 2], v[e + 3]};
  }
};

/// A block's MLP as a mixture of experts (this file's header): the router, this rank's experts, and
/// the activations one micro-batch's backward needs. Not copyable (the dispatcher keeps its state).
class MoeMlp {
 public:
  Linear router;             ///< [E][d]
  std::vector<Linear> fc;    ///< this rank's experts, [d_ff][d] each
  std::vector<Linear> proj;  ///< [d][d_ff] each

  /// Block `block`'s experts on this rank of `ep`'s group (`ep` has passed check(c, ...)).
  MoeMlp(const Config& c, int block, const ExpertParallel& ep)
      : router(prefix(block) + "router", c.d_model, c.experts),
        group_(ep.group),
        experts_(c.experts),
        top_k_(c.top_k),
        balance_coef_(ep.balance_coef),
        dispatcher_(make_dispatcher(*ep.group, c, ep.capacity)) {
    const int local = c.experts / group_->size(), first = group_->rank() * local;
    fc.reserve(static_cast<std::size_t>(local));
    proj.reserve(static_cast<std::size_t>(local));
    for (int e = first; e < first + local; ++e) {
      const std::string name = prefix(block) + "experts." + std::to_string(e) + ".";
      fc.emplace_back(name + "fc", c.d_model, c.mlp_width());
      proj.emplace_back(name + "proj", c.mlp_width(), c.d_model);
    }
    load_.kept.assign(static_cast<std::size_t>(c.experts), 0.0);
  }
  MoeMlp(const MoeMlp&) = delete;
  MoeMlp& operator=(const MoeMlp&) = delete;

  template <class Visit>
  void parameters(Visit&& visit) {
    router.parameters(visit);
    for (std::size_t e = 0; e < fc.size(); ++e) {
      fc[e].parameters(visit);
      proj[e].parameters(visit);
    }
  }

  /// x [N][d] -> y [N][d]: a collective over the expert-parallel group (every rank of it calls).
  void forward(const Matrix& x, Matrix& y) {
    const auto n = static_cast<int>(x.rows());
    const Eigen::Index d = x.cols();
    router.forward(x, logits_);
    routing_ = zerotk::moe::route(span_of(logits_), n, experts_, {.top_k = top_k_, .renormalize = top_k_ > 1});
    std::visit(
        [&](auto& disp) {
          disp.dispatch(span_of(x), routing_);
          resize_local(disp.local_experts());
          for (int e = 0; e < disp.local_experts(); ++e) {
            const auto ue = static_cast<std::size_t>(e);
            const auto rows = static_cast<Eigen::Index>(disp.rows(e));
            detail::ensure_shape(in_[ue], rows, d);
            std::copy_n(disp.input(e).data(), in_[ue].size(), in_[ue].data());
            fc[ue].forward(in_[ue], h_[ue]);
            detail::gelu(h_[ue], g_[ue]);
            proj[ue].forward(g_[ue], out_);
            std::copy_n(out_.data(), out_.size(), disp.output(e).data());
          }
          detail::ensure_shape(y, x.rows(), d);
          disp.combine(span_of(y));
        },
        dispatcher_);
  }

  /// dy [N][d] -> dx [N][d] (overwritten): the router's input gradient plus the experts'. `x` is the
  /// forward's input. Parameter gradients accumulate (+=), computed at once (never deferred).
  void backward(const Matrix& x, const Matrix& dy, Matrix& dx) {
    d_gate_.assign(routing_.gate.size(), 0.f);
    std::visit(
        [&](auto& disp) {
          disp.combine_backward(span_of(dy), d_gate_);
          for (int e = 0; e < disp.local_experts(); ++e) {
            const auto ue = static_cast<std::size_t>(e);
            const auto out_grad = disp.output_grad(e);
            detail::ensure_shape(dout_, h_[ue].rows(), x.cols());
            std::copy_n(out_grad.data(), dout_.size(), dout_.data());
            proj[ue].backward(g_[ue], dout_, &dg_);
            detail::gelu_backward(h_[ue], dg_);
            fc[ue].backward(in_[ue], dg_, &din_);
            std::copy_n(din_.data(), din_.size(), disp.input_grad(e).data());
          }
          detail::ensure_shape(dlogits_, x.rows(), experts_);
          zerotk::moe::route_backward(routing_, d_gate_, span_of(dlogits_));
          if (balance_coef_ > 0) {
            const zerotk::moe::Balance b = zerotk::moe::switch_balance(routing_);
            zerotk::moe::switch_balance_backward(routing_, b, balance_coef_, span_of(dlogits_));
            load_.balance_loss += balance_coef_ * b.loss;
          }
          router.backward(x, dlogits_, &dx);
          disp.dispatch_backward(span_of(dx));
          const auto kept = disp.kept_per_expert();
          for (std::size_t e = 0; e < kept.size(); ++e) load_.kept[e] += static_cast<double>(kept[e]);
          load_.dropped += static_cast<double>(disp.dropped());
          load_.slots += static_cast<double>(routing_.expert.size());
          load_.passes += 1;
        },
        dispatcher_);
  }

  const ExpertLoad& load() const noexcept { return load_; }

  std::size_t activation_bytes() const noexcept {
    std::size_t n = detail::bytes_of(logits_, out_, dout_, dg_, din_, dlogits_);
    for (std::size_t e = 0; e < in_.size(); ++e) n += detail::bytes_of(in_[e], h_[e], g_[e]);
    return n + (routing_.probs.size() + routing_.gate.size()) * sizeof(float) + routing_.expert.size() * sizeof(int);
  }
  void release_activations() noexcept {
    detail::free_all(logits_, out_, dout_, dg_, din_, dlogits_);
    for (std::size_t e = 0; e < in_.size(); ++e) detail::free_all(in_[e], h_[e], g_[e]);
  }

 private:
  using Any = zerotk::comm::AnyCommunicator;
  using Dispatch = std::variant<zerotk::moe::Dispatcher<Any, zerotk::moe::Dropless>, zerotk::moe::Dispatcher<Any, zerotk::moe::Capacity>>;

  static std::string prefix(int block) { return "blocks." + std::to_string(block) + ".mlp."; }
  static Dispatch make_dispatcher(Any& group, const Config& c, double capacity) {
    if (capacity == 0) return Dispatch(std::in_place_index<0>, group, c.experts, c.d_model);
    return Dispatch(std::in_place_index<1>, group, c.experts, c.d_model, zerotk::moe::Capacity{.factor = capacity});
  }
  static std::span<float> span_of(Matrix& m) { return {m.data(), static_cast<std::size_t>(m.size())}; }
  static std::span<const float> span_of(const Matrix& m) { return {m.data(), static_cast<std::size_t>(m.size())}; }
  void resize_local(int n) {
    in_.resize(static_cast<std::size_t>(n));
    h_.resize(static_cast<std::size_t>(n));
    g_.resize(static_cast<std::size_t>(n));
  }

  std::shared_ptr<Any> group_;
  int experts_, top_k_;
  double balance_coef_;
  Dispatch dispatcher_;
  zerotk::moe::Routing routing_;
  std::vector<Matrix> in_, h_, g_;  // per local expert: its rows, fc's output, the GELU's
  Matrix logits_, out_, dout_, dg_, din_, dlogits_;
  std::vector<float> d_gate_;
  ExpertLoad load_;
};

}  // namespace gpt
