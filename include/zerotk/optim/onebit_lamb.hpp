#pragma once
/// \file zerotk/optim/onebit_lamb.hpp
/// `Optimizer<OneBitLamb>`: DeepSpeed's 1-bit LAMB (docs/design/onebit_next.md section B; DeepSpeed
/// v0.19 runtime/fp16/onebit/lamb.py). LAMB without bias correction whose trust ratios are learnt
/// in a warm-up and then frozen, so that the momentum can be exchanged in 1 bit per value. Phases by
/// the step count t of the step being taken (the same rule as 1-bit Adam):
///
///   t = 1        counted (the scheduler steps too); nothing else changes
///   warm-up      the gradients were all-reduced (averaged) by the engine. Per tensor:
///                m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, upd = m / (sqrt(v) + eps) [+ wd p],
///                r = ||p|| / ||upd|| clamped by max_coeff then min_coeff (1 when a norm is 0),
///                c_f = coeff_beta c_f + (1 - coeff_beta) r when r != 1, p -= lr r upd;
///                at t = freeze_step the fresh variance starts as a copy: v_f = v
///   compression  from the step after the first t >= max(2, freeze_step): local gradients.
///                At its first step, per tensor k = U / rms(m) with U the mean of rms(m) over the
///                tensors (scaling coefficients, kept from then on). m_prev = m;
///                m = (b1 m + (1 - b1) g) k; the whole model's momentum is 1-bit all-reduced as one
///                flat vector (one worker and one server error); then per tensor m /= k,
///                gh = (m - b1 m_prev) / (1 - b1), v_f = b2 v_f + (1 - b2) gh^2 (v stays frozen),
///                upd as above, the factor f = max over the tensor of (sqrt(v) + eps) / (sqrt(v_f) + eps)
///                (with decay, pulled towards 1 by rho = min(1, ||u0|| / ||upd||)), clamped to
///                [factor_min, factor_max] and to within factor_threshold of its last value F;
///                F = f; p -= lr (c_f f) upd
///
/// Scalars DeepSpeed keeps as Python floats (c_f, F, k, r, f, the norms) are doubles here, rounded to
/// float once where they meet the elements: float(lr r), float(lr c_f f), float(k).
///
/// The optimizer holds no element buffers. Whoever steps it gives it the fresh variance v_f and 2n
/// floats of scratch (`set_buffers`: the engine's part in optim/onebit_exchange.hpp, or
/// optim::Standalone), and the engine the exchange (`set_momentum_exchange`); without one the
/// momentum stays local, the W = 1 behaviour. Per tensor it keeps c_f, F and k (tensor_states()),
/// which the checkpoint saves with v_f (save_extra / load_extra).
///
/// Deliberate differences from DeepSpeed v0.19 (docs/compress.md): a load restores c_f, F and k as
/// saved (DeepSpeed zeroes c_f and drops k when it loads a warm-up state), so a resumed run equals
/// an uninterrupted one; a tensor whose momentum is all zero at the first compression step is a
/// numerics_error naming it (DeepSpeed divides by zero); compression is per model in one flat vector
/// as DeepSpeed, over the segments in their order (DeepSpeed's group-then-parameter order when the
/// model has one parameter group).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/optim/optimizer.hpp"
#include "zerotk/optim/lamb.hpp"  // optim::detail::lamb_step_consts

namespace zerotk {

namespace optim {

/// 1-bit LAMB's scalars of one tensor (DeepSpeed's lamb_coeff_freeze, last_factor, scaling_coeff).
struct LambTensorState {
  double coeff_freeze = 0.0;  ///< c_f: EMA of the warm-up trust ratio (no bias correction, from 0)
  double last_factor = 1.0;   ///< F: the compression phase's factor of the last step
  double scaling = 0.0;       ///< k: the momentum's scaling coefficient, > 0 once set (first compression step)
  bool scaled() const noexcept { return scaling != 0.0; }
};

/// Doubles per tensor in OptimizerState::tensor_scalars: c_f, F, k (0 while unset).
inline constexpr std::size_t kLambScalarsPerTensor = 3;

}  // namespace optim

template <>
class Optimizer<OneBitLamb> : public optim::detail::FreezePhaseCore {
 public:
  using policy_kind = policy::optimizer;
  using tag = OneBitLamb;
  using State = OptimizerState;
  using consts_type = kernels::LambStepConsts;

  // Phase, next_phase(), gradients_local(), set_freeze_step() and the momentum exchange (all
  // segments' scaled m end to end, as one vector): optim::detail::FreezePhaseCore.
  using FreezePhaseCore::FreezePhaseCore;

  /// coeff_beta, factor_max, factor_min, factor_threshold (config_error when out of range).
  void set_lamb_options(const OneBitLambOptions& o) {
    optim::validate(o);
    lamb_ = o;
  }
  const OneBitLambOptions& lamb_options() const noexcept { return lamb_; }

  /// The fresh second moment v_f ([n] fp32, zeros at first) and [2n] fp32 of scratch, both indexed
  /// like m and v (n: the partition). Not owned.
  void set_buffers(float* v_fresh, float* scratch, std::size_t n) noexcept {
    v_fresh_ = v_fresh;
    scratch_ = scratch;
    buffer_numel_ = n;
  }
  float* fresh_variance() const noexcept { return v_fresh_; }
  float* scratch() const noexcept { return scratch_; }
  std::size_t buffer_numel() const noexcept { return buffer_numel_; }
  /// usage_error (nothing changed) unless the buffers cover every segment.
  void check_buffers(std::span<const Segment> segments) const {
    const std::size_t need = kernels::segments_extent(segments);
    if (need > 0 && (v_fresh_ == nullptr || scratch_ == nullptr || need > buffer_numel_)) {
      throw usage_error("1-bit LAMB's fresh variance and scratch do not cover the partition (set_buffers)",
                        "Optimizer<OneBitLamb>::step",
                        std::to_string(buffer_numel_) + " elements, segments end at " + std::to_string(need));
    }
  }

  /// Sizes the per-tensor scalars too (every rank holds the same number).
  void set_tensor_count(std::size_t n) {
    FreezePhaseCore::set_tensor_count(n);
    reserve_tensors(n);
  }
  /// c_f, F and k per tensor id.
  std::span<const optim::LambTensorState> tensor_states() const noexcept { return tensors_; }
  /// Each tensor's coefficient of the last step: the trust ratio r in the warm-up, c_f f in the
  /// compression phase (DeepSpeed's get_lamb_coeffs); 0 for a tensor not stepped yet.
  std::span<const double> last_coefficients() const noexcept { return last_coeffs_; }

  /// The kernel constants of the step about to be taken, one per group: LAMB's without bias
  /// correction (step_size = lr).
  std::vector<kernels::LambStepConsts> step_consts() const {
    return optim::detail::lamb_step_consts(groups_, step_ + 1, /*allow_bias_correction=*/false);
  }

  // ---- the host-side scalars of one step (optim/run.hpp calls these) -----------------------------

  /// Sizes the per-tensor scalars for `tensors` ids (check_step's count).
  void reserve_tensors(std::size_t tensors) {
    if (tensors_.size() < tensors) tensors_.resize(tensors);
    if (last_coeffs_.size() < tensors_.size()) last_coeffs_.resize(tensors_.size(), 0.0);
  }

  /// Warm-up: from each tensor's ||p||^2 and ||upd||^2 (sums[2t], sums[2t + 1], complete), the
  /// trust ratio r; updates c_f once per tensor; returns float(lr r) per segment.
  std::vector<float> warmup_steps(std::span<const Segment> segments, std::span<const double> sums) {
    std::vector<float> steps(segments.size());
    std::vector<char> done(tensors_.size(), 0);
    for (std::size_t i = 0; i < segments.size(); ++i) {
      const Segment& s = segments[i];
      const OptimizerOptions& o = groups_[s.group].options;
      const double w = std::sqrt(sums[2 * s.tensor]), ru = std::sqrt(sums[2 * s.tensor + 1]);
      double r = 1.0;
      if (w != 0.0 && ru != 0.0) {
        r = w / ru;
        if (r > o.lamb_max_coeff) r = o.lamb_max_coeff;
        if (r < o.lamb_min_coeff) r = o.lamb_min_coeff;
      }
      if (!done[s.tensor]) {
        done[s.tensor] = 1;
        optim::LambTensorState& ts = tensors_[s.tensor];
        if (r != 1.0) ts.coeff_freeze = lamb_.coeff_beta * ts.coeff_freeze + (1.0 - lamb_.coeff_beta) * r;
        last_coeffs_[s.tensor] = r;
      }
      steps[i] = static_cast<float>(o.lr * r);
    }
    return steps;
  }

  /// Whether any tensor of `segments` has no scaling coefficient yet (the first compression step).
  bool needs_scaling(std::span<const Segment> segments) const {
    for (const Segment& s : segments) {
      if (!tensors_[s.tensor].scaled()) return true;
    }
    return false;
  }
  /// Sets every tensor's k = U / rms from ||m||^2 per tensor (m_sumsq, complete): rms = ||m|| /
  /// sqrt(numel), U = the mean of rms over the tensors of `segments`. numerics_error naming the
  /// tensor, with nothing changed, when a tensor's rms is 0 or not finite.
  void set_scaling(std::span<const Segment> segments, std::span<const double> m_sumsq) {
    std::vector<double> numel(tensors_.size(), 0.0);
    for (const Segment& s : segments) numel[s.tensor] += static_cast<double>(s.numel);
    std::vector<double> rms(tensors_.size(), 0.0);
    double total = 0.0;
    std::size_t count = 0;
    for (std::size_t t = 0; t < tensors_.size(); ++t) {
      if (numel[t] == 0.0) continue;
      rms[t] = std::sqrt(m_sumsq[t]) / std::sqrt(numel[t]);
      if (!(rms[t] > 0.0) || !std::isfinite(rms[t])) {
        throw numerics_error("1-bit LAMB cannot scale a tensor whose momentum is all zero or not finite at the first "
                             "compression step (is it trained? does freeze_step leave a warm-up?)",
                             "Optimizer<OneBitLamb>::step: tensor " + std::to_string(t),
                             "rms " + optim::detail::double_text(rms[t]));
      }
      total += rms[t];
      ++count;
    }
    const double mean = total / static_cast<double>(count);
    for (std::size_t t = 0; t < tensors_.size(); ++t) {
      if (numel[t] == 0.0) continue;
      tensors_[t].scaling = mean / rms[t];
    }
  }
  /// float(k) per segment.
  std::vector<float> scaling_of(std::span<const Segment> segments) const {
    std::vector<float> k(segments.size());
    for (std::size_t i = 0; i < segments.size(); ++i) k[i] = static_cast<float>(tensors_[segments[i].tensor].scaling);
    return k;
  }

  /// Compression: from each tensor's factor max (fmax[t]) and, with weight decay, ||u0||^2 and
  /// ||upd||^2 (u0_sumsq[t], upd_sumsq[t]), the clamped factor f; F = f once per tensor; returns
  /// float(lr c_f f) per segment.
  std::vector<float> compression_steps(std::span<const Segment> segments, std::span<const double> fmax,
                                       std::span<const double> u0_sumsq, std::span<const double> upd_sumsq) {
    std::vector<float> steps(segments.size());
    std::vector<char> done(tensors_.size(), 0);
    std::vector<double> coeff(tensors_.size(), 0.0);
    for (std::size_t i = 0; i < segments.size(); ++i) {
      const Segment& s = segments[i];
      const OptimizerOptions& o = groups_[s.group].options;
      if (!done[s.tensor]) {
        done[s.tensor] = 1;
        optim::LambTensorState& ts = tensors_[s.tensor];
        double f = fmax[s.tensor];
        if (o.weight_decay > 0) {
          const double q = std::sqrt(u0_sumsq[s.tensor]) / std::sqrt(upd_sumsq[s.tensor]);
          const double rho = q < 1.0 ? q : 1.0;  // Python's min(1, q): 1 when q is NaN
          f = f * rho + (1.0 - rho);
        }
        if (f > lamb_.factor_max) f = lamb_.factor_max;
        if (f < lamb_.factor_min) f = lamb_.factor_min;
        const double hi = ts.last_factor * (1.0 + lamb_.factor_threshold);
        const double lo = ts.last_factor * (1.0 - lamb_.factor_threshold);
        if (f > hi) f = hi;
        if (f < lo) f = lo;
        ts.last_factor = f;
        coeff[s.tensor] = ts.coeff_freeze * f;
        last_coeffs_[s.tensor] = coeff[s.tensor];
      }
      steps[i] = static_cast<float>(o.lr * coeff[s.tensor]);
    }
    return steps;
  }

  // ---- checkpoint -------------------------------------------------------------------------------

  /// The per-tensor scalars as saved: c_f, F, k per tensor id.
  std::vector<double> encoded_tensor_states() const {
    std::vector<double> out;
    out.reserve(optim::kLambScalarsPerTensor * tensors_.size());
    for (const optim::LambTensorState& t : tensors_) out.insert(out.end(), {t.coeff_freeze, t.last_factor, t.scaling});
    return out;
  }
  /// v_f and the per-tensor scalars into `s` (its m, v and step are the store's).
  void save_extra(OptimizerState& s) const {
    s.v_fresh.assign(v_fresh_, v_fresh_ + (v_fresh_ ? buffer_numel_ : 0));
    s.tensor_scalars = encoded_tensor_states();
  }
  /// usage_error unless `s` carries a v_f over this optimizer's buffers and whole tensor records.
  void check_extra(const OptimizerState& s, const char* where) const {
    if (s.v_fresh.size() != buffer_numel_) {
      throw usage_error("1-bit LAMB state's fresh variance is for a partition of another size", where,
                        std::to_string(s.v_fresh.size()) + " for " + std::to_string(buffer_numel_) + " elements");
    }
    const std::size_t n = s.tensor_scalars.size();
    if (n % optim::kLambScalarsPerTensor != 0 || n / optim::kLambScalarsPerTensor < tensor_count()) {
      throw usage_error("1-bit LAMB state's per-tensor scalars do not fit this model", where,
                        std::to_string(n) + " values for " + std::to_string(tensor_count()) + " tensors (" +
                            std::to_string(optim::kLambScalarsPerTensor) + " each)");
    }
    for (std::size_t i = 0; i < n; ++i) {
      const double x = s.tensor_scalars[i];
      if (!std::isfinite(x) || (i % optim::kLambScalarsPerTensor == 2 && x < 0.0)) {
        throw usage_error("1-bit LAMB state's per-tensor scalars must be finite and its scaling coefficient >= 0",
                          where,
                          "tensor " + std::to_string(i / optim::kLambScalarsPerTensor) + ": " +
                              optim::detail::double_text(x));
      }
    }
  }
  /// Restores v_f and the per-tensor scalars (check_extra first); the exchange's errors and tail are
  /// the engine's to zero.
  void load_extra(const OptimizerState& s) {
    check_extra(s, "Optimizer<OneBitLamb>::load_extra");
    std::copy(s.v_fresh.begin(), s.v_fresh.end(), v_fresh_);
    tensors_.assign(s.tensor_scalars.size() / optim::kLambScalarsPerTensor, {});
    for (std::size_t t = 0; t < tensors_.size(); ++t) {
      const double* x = s.tensor_scalars.data() + optim::kLambScalarsPerTensor * t;
      tensors_[t] = {x[0], x[1], x[2]};
    }
    last_coeffs_.assign(tensors_.size(), 0.0);
  }

 private:
  OneBitLambOptions lamb_;
  float* v_fresh_ = nullptr;  // [buffer_numel_]
  float* scratch_ = nullptr;  // [2 buffer_numel_]
  std::size_t buffer_numel_ = 0;
  std::vector<optim::LambTensorState> tensors_;
  std::vector<double> last_coeffs_;
};

}  // namespace zerotk
