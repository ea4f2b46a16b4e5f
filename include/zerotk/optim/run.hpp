#pragma once
/// \file zerotk/optim/run.hpp
/// `optim::Run<Opt, Space>`: the kernels that apply one optimizer step, chosen by the memory space the
/// fp32 master, the moments and the gradients live in. This file holds the host kernels (OpenMP/SIMD,
/// kernels/host/); optim/run_cuda.cuh adds `Run<..., CudaSpace>` (nvcc only). An optimizer without
/// kernels for a space is a compile error that names both, never a fall-through to another optimizer.
///
///   Run<Opt, HostSpace>::step(opt, segments, master, moments, grads, param_out, grad_scale, reduce);
///
/// Every step checks its arguments before anything is modified (Optimizer::check_step), takes the
/// step constants for t = step_count() + 1, counts the step, then runs the fused pass: for every
/// segment, g = grads[i] * grad_scale, update master[i], m, v and, if param_out is not null,
/// param_out[i] = P(master[i]). master and the moments are indexed by partition offset, grads and
/// param_out by each segment's grad_at() / out_at(). param_out may alias grads element for element
/// (each gradient is read before the output at the same index is written); otherwise no overlap.
/// `reduce(std::span<double>)` sums LAMB's per-tensor partials over ranks in place (Adam never
/// calls it).

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/kernels/host/adam.hpp"
#include "zerotk/kernels/host/elementwise_step.hpp"
#include "zerotk/kernels/host/lamb.hpp"
#include "zerotk/kernels/host/onebit_adam.hpp"
#include "zerotk/kernels/host/onebit_lamb.hpp"
#include "zerotk/kernels/host/zero_one_adam.hpp"
#include "zerotk/optim/optimizer.hpp"

namespace zerotk::optim {

/// Primary template: no kernels for this optimizer in this memory space.
template <class Opt, class Space>
struct Run {
  static_assert(dependent_false<Opt>,
                "optim::Run<Opt, Space>: this optimizer has no kernels for this memory space (host kernels: "
                "optim/run.hpp; CUDA kernels: optim/run_cuda.cuh). Add them, or run the optimizer where it has some");
};

/// Adam and AdamW on host memory: one fused pass (kernels::host::fused_adam).
template <class Tag>
  requires std::is_same_v<Tag, Adam> || std::is_same_v<Tag, AdamW>
struct Run<Optimizer<Tag>, HostSpace> {
  template <FloatingElement G, class P, TensorSumReducer ReduceFn>
  static void step(Optimizer<Tag>& opt, std::span<const Segment> segments, float* master, const Moments& st,
                   const G* grads, P* param_out, float grad_scale, ReduceFn&& /*reduce: Adam needs no sums*/) {
    opt.check_step(segments, master, st, grads);
    const std::vector<kernels::AdamStepConsts> consts = opt.step_consts();
    opt.advance();
    kernels::host::fused_adam<G, P>(segments, consts, master, st.m, st.v, grads, param_out, grad_scale);
  }
  /// The working-precision values step() would write, with master, m, v and the step count
  /// unchanged (the constants of the next step): the first pass of offload/writer_passes.hpp.
  template <FloatingElement G, class P>
  static void values(const Optimizer<Tag>& opt, std::span<const Segment> segments, const float* master,
                     const Moments& st, const G* grads, P* param_out, float grad_scale) {
    opt.check_step(segments, master, st, grads);
    kernels::host::fused_adam_values<G, P>(segments, opt.step_consts(), master, st.m, st.v, grads, param_out,
                                           grad_scale);
  }
};

/// Any elementwise optimizer on host memory (optim/optimizer.hpp, ElementwiseOptimizer): its rule
/// through the generic fused driver (kernels/host/elementwise_step.hpp), one pass.
template <ElementwiseOptimizer Opt>
struct Run<Opt, HostSpace> {
  using Rule = typename Opt::rule;
  template <FloatingElement G, class P, TensorSumReducer ReduceFn>
  static void step(Opt& opt, std::span<const Segment> segments, float* master, const Moments& st, const G* grads,
                   P* param_out, float grad_scale, ReduceFn&& /*reduce: elementwise, no sums*/) {
    opt.check_step(segments, master, st, grads);
    const std::vector<typename Rule::Consts> consts = opt.step_consts();
    opt.advance();
    kernels::host::elementwise_step<Rule, G, P>(segments, consts, master, st.m, st.v, grads, param_out, grad_scale);
  }
  /// The working-precision values step() would write, the state and the step count unchanged.
  template <FloatingElement G, class P>
  static void values(const Opt& opt, std::span<const Segment> segments, const float* master, const Moments& st,
                     const G* grads, P* param_out, float grad_scale) {
    opt.check_step(segments, master, st, grads);
    kernels::host::elementwise_values<Rule, G, P>(segments, opt.step_consts(), master, st.m, st.v, grads, param_out,
                                                  grad_scale);
  }
};

/// LAMB on host memory: phase 1 (moments, per-tensor sums), the reducer, phase 2 (trust-ratio step).
template <>
struct Run<Optimizer<Lamb>, HostSpace> {
  template <FloatingElement G, class P, TensorSumReducer ReduceFn>
  static void step(Optimizer<Lamb>& opt, std::span<const Segment> segments, float* master, const Moments& st,
                   const G* grads, P* param_out, float grad_scale, ReduceFn&& reduce) {
    const std::size_t tensors = opt.check_step(segments, master, st, grads);
    const std::vector<kernels::LambStepConsts> consts = opt.step_consts();
    opt.advance();
    std::vector<double> sums(2 * tensors, 0.0);
    kernels::host::lamb_phase1<G>(segments, consts, master, st.m, st.v, grads, grad_scale, sums);
    reduce(std::span<double>(sums));
    kernels::host::lamb_phase2<P>(segments, consts, master, st.m, st.v, param_out, sums);
  }
};

/// 1-bit Adam on host memory: its phase picks the pass (optim/onebit_adam.hpp). The step is counted
/// after the momentum exchange, so a failed exchange (comm_error) leaves the count as it was.
template <>
struct Run<Optimizer<OneBitAdam>, HostSpace> {
  using Opt = Optimizer<OneBitAdam>;
  template <FloatingElement G, class P, TensorSumReducer ReduceFn>
  static void step(Opt& opt, std::span<const Segment> segments, float* master, const Moments& st, const G* grads,
                   P* param_out, float grad_scale, ReduceFn&& /*reduce: no per-tensor sums*/) {
    opt.check_step(segments, master, st, grads);
    const std::vector<kernels::AdamStepConsts> consts = opt.step_consts();
    switch (opt.next_phase()) {
      case Opt::Phase::first:  // DeepSpeed's initialisation step: counted, nothing changes
        break;
      case Opt::Phase::warmup:
        kernels::host::fused_adam<G, P>(segments, consts, master, st.m, st.v, grads, param_out, grad_scale);
        break;
      case Opt::Phase::compressed:
        kernels::host::momentum_update<G>(segments, consts, st.m, grads, grad_scale);
        opt.exchange_momentum(segments, st.m);
        kernels::host::frozen_variance_step<P>(segments, consts, master, st.m, st.v, param_out);
        break;
    }
    opt.advance();
  }
};

/// 0/1 Adam on host memory: the schedule's kind picks the passes (optim/zero_one_adam.hpp). The step
/// is counted last, so a failed exchange (comm_error) leaves the count, and with it the schedule, as
/// it was.
template <>
struct Run<Optimizer<ZeroOneAdam>, HostSpace> {
  using Opt = Optimizer<ZeroOneAdam>;
  using Kind = Opt::Kind;
  template <FloatingElement G, class P, TensorSumReducer ReduceFn>
  static void step(Opt& opt, std::span<const Segment> segments, float* master, const Moments& st, const G* grads,
                   P* param_out, float grad_scale, ReduceFn&& /*reduce: no per-tensor sums*/) {
    namespace zo = kernels::host::zero_one;
    opt.check_step(segments, master, st, grads);
    opt.check_accumulator(segments);
    const std::vector<kernels::AdamStepConsts> consts = opt.step_consts();
    const std::int64_t t = opt.step_count() + 1;
    float* u = opt.accumulator();
    const Kind kind = opt.next_kind();
    switch (kind) {
      case Kind::init:  // DeepSpeed's set-up step: counted, nothing changes
        break;
      case Kind::var:
        kernels::host::fused_adam<G, P>(segments, consts, master, st.m, st.v, grads, param_out, grad_scale);
        break;
      case Kind::grad:
        if (opt.has_exchange()) {
          zo::scaled_gradient<G>(segments, u, grads, grad_scale);
          opt.all_reduce(segments, u);
          zo::momentum_from(segments, consts, st.m, u);
          zo::zero(segments, u);
        } else {  // one rank: the local gradient is the average
          kernels::host::momentum_update<G>(segments, consts, st.m, grads, grad_scale);
        }
        kernels::host::frozen_variance_step<P>(segments, consts, master, st.m, st.v, param_out);
        break;
      case Kind::local:
      case Kind::sync: {
        if (t == opt.schedule().last_variance_step() + 1) opt.reset_errors();  // they held gradient errors
        opt.add_lr_sums();
        const bool sync = kind == Kind::sync;
        zo::frozen_local<G, P>(segments, consts, master, st.m, st.v, u, grads, grad_scale, sync, param_out);
        if (sync) {
          opt.all_reduce(segments, u);
          const std::vector<float> lr_sums = opt.lr_sums_float();
          zo::sync_finish<P>(segments, consts, lr_sums, master, st.m, st.v, u, param_out);
          opt.clear_lr_sums();
        }
        break;
      }
    }
    opt.advance();
  }
};

/// 1-bit LAMB on host memory: its phase picks the passes (optim/onebit_lamb.hpp). The step is counted
/// last, so an exchange that fails (comm_error) or a tensor that cannot be scaled (numerics_error,
/// thrown before anything changes) leaves the count as it was.
template <>
struct Run<Optimizer<OneBitLamb>, HostSpace> {
  using Opt = Optimizer<OneBitLamb>;
  template <FloatingElement G, class P, TensorSumReducer ReduceFn>
  static void step(Opt& opt, std::span<const Segment> segments, float* master, const Moments& st, const G* grads,
                   P* param_out, float grad_scale, ReduceFn&& reduce) {
    namespace ob = kernels::host::onebit_lamb;
    const std::size_t tensors = opt.check_step(segments, master, st, grads);
    opt.check_buffers(segments);
    opt.reserve_tensors(tensors);
    const std::vector<kernels::LambStepConsts> consts = opt.step_consts();
    const std::int64_t t = opt.step_count() + 1;
    float* vf = opt.fresh_variance();
    switch (opt.next_phase()) {
      case Opt::Phase::first:  // DeepSpeed's set-up step: counted, nothing changes
        break;
      case Opt::Phase::warmup: {
        std::vector<double> sums(2 * tensors, 0.0);
        kernels::host::lamb_phase1<G>(segments, consts, master, st.m, st.v, grads, grad_scale, sums);
        reduce(std::span<double>(sums));
        if (t == opt.freeze_step()) ob::copy(segments, st.v, vf);  // the fresh variance starts from v
        const std::vector<float> steps = opt.warmup_steps(segments, sums);
        kernels::host::lamb_apply_steps<P>(segments, consts, master, st.m, st.v, param_out, steps);
        break;
      }
      case Opt::Phase::compressed: {
        float* a = opt.scratch();                       // m_prev, then u0
        float* b = opt.scratch() + opt.buffer_numel();  // upd
        std::vector<double> sums(tensors, 0.0), sums2(tensors, 0.0), fmax(tensors, 0.0);
        if (opt.needs_scaling(segments)) {
          ob::tensor_sumsq(segments, st.m, sums);
          reduce(std::span<double>(sums));
          opt.set_scaling(segments, sums);
        }
        const std::vector<float> k = opt.scaling_of(segments);
        ob::scaled_momentum<G>(segments, consts, k, st.m, a, grads, grad_scale);
        opt.exchange_momentum(segments, st.m);
        ob::fresh(segments, consts, k, master, st.m, st.v, vf, a, b, fmax);
        bool decay = false;
        for (const Segment& s : segments) decay = decay || opt.groups()[s.group].options.weight_decay > 0;
        if (decay) {
          ob::tensor_sumsq(segments, a, sums);
          ob::tensor_sumsq(segments, b, sums2);
          reduce(std::span<double>(sums));
          reduce(std::span<double>(sums2));
        }
        const std::vector<float> steps = opt.compression_steps(segments, fmax, sums, sums2);
        ob::apply<P>(segments, steps, master, b, param_out);
        break;
      }
    }
    opt.advance();
  }
};

/// An optimizer with its moments in host memory: the standalone form, for a trainer or a research
/// prototype that steps its own fp32 buffers without an engine (the engine keeps its moments in a
/// state store, offload/resident.hpp).
///
///   optim::Standalone<Optimizer<AdamW>> opt({ParamGroup{{.lr = 1e-3}}});
///   opt.init_state(n, &ledger);                              // m, v: n fp32 zeros (optimizer_state)
///   opt.step(segments, master, grads16, params16, 1.0f / scale);
template <class Opt>
class Standalone : public Opt {
 public:
  using Opt::Opt;

  /// Allocates m and v (zeros) for a partition of `partition_numel` fp32 elements, 0/1 Adam's
  /// accumulator u and 1-bit LAMB's fresh variance and scratch, recorded in the ledger's
  /// optimizer_state category. Resets the step count.
  void init_state(std::size_t partition_numel, MemoryLedger* ledger = nullptr) {
    m_ = TrackedBuffer<float>(partition_numel, MemoryCategory::optimizer_state, ledger);
    v_ = TrackedBuffer<float>(moments_v<Opt> >= 2 ? partition_numel : 0, MemoryCategory::optimizer_state, ledger);
    if constexpr (requires(Opt& o, float* p, std::size_t n) { o.set_accumulator(p, n); }) {
      u_ = TrackedBuffer<float>(partition_numel, MemoryCategory::optimizer_state, ledger);
      this->set_accumulator(u_.data(), u_.size());
    }
    if constexpr (requires(Opt& o, float* p, std::size_t n) { o.set_buffers(p, p, n); }) {
      u_ = TrackedBuffer<float>(partition_numel, MemoryCategory::optimizer_state, ledger);
      scratch_ = TrackedBuffer<float>(2 * partition_numel, MemoryCategory::optimizer_state, ledger);
      this->set_buffers(u_.data(), scratch_.data(), partition_numel);
    }
    this->set_step_count(0);
    initialized_ = true;
  }
  std::size_t partition_numel() const noexcept { return m_.size(); }

  /// One step over the partition (Run<Opt, HostSpace>::step); param_out may be nullptr.
  template <FloatingElement G, class Out, TensorSumReducer ReduceFn>
  void step(std::span<const Segment> segments, float* master, const G* grads, Out param_out, float grad_scale,
            ReduceFn&& reduce) {
    require_state("step");
    using P = std::conditional_t<std::is_null_pointer_v<Out>, void, std::remove_pointer_t<Out>>;
    Run<Opt, HostSpace>::template step<G, P>(*this, segments, master, moments(), grads, param_out, grad_scale,
                                             std::forward<ReduceFn>(reduce));
  }
  /// Single-process form (the per-tensor sums are already complete).
  template <FloatingElement G, class Out>
  void step(std::span<const Segment> segments, float* master, const G* grads, Out param_out, float grad_scale) {
    step(segments, master, grads, param_out, grad_scale, [](std::span<double>) {});
  }

  /// v is m's place for a one-moment optimizer (whose kernels never read it).
  Moments moments() noexcept { return {m_.data(), moments_v<Opt> >= 2 ? v_.data() : m_.data(), m_.size()}; }
  std::span<float> exp_avg() noexcept { return {m_.data(), m_.size()}; }
  std::span<float> exp_avg_sq() noexcept { return {v_.data(), v_.size()}; }
  std::span<const float> exp_avg() const noexcept { return {m_.data(), m_.size()}; }
  std::span<const float> exp_avg_sq() const noexcept { return {v_.data(), v_.size()}; }

  OptimizerState state() const {
    OptimizerState s{this->step_count(), std::vector<float>(m_.begin(), m_.end()),
                     std::vector<float>(v_.begin(), v_.end()), {}, {}};
    optim::save_extra(static_cast<const Opt&>(*this), s);
    return s;
  }
  /// Restores a state taken from an optimizer over a partition of the same size (bit-exact).
  void load_state(const OptimizerState& s) {
    require_state("load_state");
    check_state(s, m_.size(), "Optimizer::load_state", moments_v<Opt>);
    optim::check_extra(static_cast<const Opt&>(*this), s, "Optimizer::load_state");
    std::copy(s.m.begin(), s.m.end(), m_.begin());
    std::copy(s.v.begin(), s.v.end(), v_.begin());
    optim::load_extra(static_cast<Opt&>(*this), s);
    this->set_step_count(s.step);
  }

 private:
  void require_state(const char* what) const {
    if (!initialized_) throw usage_error("init_state(partition_numel) must be called first", std::string("Optimizer::") + what);
  }

  TrackedBuffer<float> m_, v_;  // [partition_numel] fp32 each (v: [0] for a one-moment optimizer)
  TrackedBuffer<float> u_;        // 0/1 Adam's accumulator, 1-bit LAMB's fresh variance; empty for the others
  TrackedBuffer<float> scratch_;  // 1-bit LAMB's [2 partition_numel]
  bool initialized_ = false;
};

}  // namespace zerotk::optim
