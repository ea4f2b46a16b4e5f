#pragma once
/// \file zerotk/activation/recompute.hpp
/// Recompute<L>: activation checkpointing for any Recomputable layer (core/concepts.hpp). Its forward
/// keeps only the layer's input, runs the layer and makes it drop what it saved; its backward runs
/// the layer's forward again from that input and then the layer's backward.
///
///   zerotk::Recompute<Block> r(block, ckpt, "blocks.3");
///   const Matrix& y = r.forward(x);       // block.forward(x), block.release_activations()
///   ...
///   const Matrix& dx = r.backward(dy);    // block.forward(saved x) again, then block.backward(dy)
///
/// With a ZeRO-3 engine, open the engine's scope on the layer itself (`scope.backward(block)`)
/// around r.backward(dy): the scope gathers the parameters, and the recompute runs inside it.
///
/// Where the saved input lives (Options, activation/options.hpp):
/// - by default, in an input_type object. When the input is the output of the checkpointed layer
///   just before (a chain of blocks), that object is taken over instead of copied, so a chain keeps
///   one tensor per layer;
/// - contiguous_memory: in a slot of the shared arena (activation/arena.hpp);
/// - cpu_checkpointing: in page-locked host memory (an arena slot with contiguous_memory, else a
///   buffer of this layer's, kept for the next step), copied there on the copy thread while the
///   layer computes, and copied back on that thread when the layer above begins its backward.
/// The latter two go through ActivationTraits<input_type> (activation/traits.hpp).
///
/// The output is a copy the Recompute owns, freed when the next checkpointed layer has consumed it
/// or when this layer's backward begins (by then its consumer's backward has run). The input
/// gradient is likewise a copy, freed once the checkpointed layer below has used it, or at this
/// layer's next forward. Both copies exist because the layer's own buffers are released.
///
/// A stochastic layer (HasRngState) gets its random state of the forward back for the recompute,
/// and its state of the moment afterwards. The recomputed output must have the shape the forward's
/// had, else usage_error naming the layer and both shapes. Layers with activation_bytes()
/// (HasActivationBytes) have their memory reported to the Checkpointing's Meter, as is what the
/// Recompute itself holds.

#include <chrono>
#include <concepts>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "zerotk/activation/checkpointing.hpp"
#include "zerotk/activation/traits.hpp"
#include "zerotk/core/concepts.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/pinned_host_space.hpp"

namespace zerotk::activation {

namespace detail {
template <class L, bool = HasRngState<L>>
struct RngStateOf {
  using type = char;  // a layer without random state: nothing kept
};
template <class L>
struct RngStateOf<L, true> {
  using type = std::decay_t<decltype(std::declval<L&>().rng_state())>;
};
}  // namespace detail

template <class L>
class Recompute final : public RecomputeBase {
  static_assert(Recomputable<L>,
                "Recompute<L>: L must be a Layer (input_type, output_type, forward(x), backward(dy), parameters(visit)) "
                "with release_activations() that drops everything its forward saved (core/concepts.hpp)");

 public:
  using layer_type = L;
  using input_type = typename L::input_type;
  using output_type = typename L::output_type;
  static_assert(std::copy_constructible<input_type> && std::copy_constructible<output_type>,
                "Recompute<L>: the layer's input and output types must be copyable (they are kept by copy)");

  /// `ckpt` must outlive this object; `name` is shown in errors and in the profile.
  Recompute(L& layer, Checkpointing& ckpt, std::string name = "layer")
      : layer_(&layer), ckpt_(&ckpt), name_(std::move(name)), profile_id_(ckpt.enroll(name_)) {}
  ~Recompute() override {
    ckpt_->forget(this);
    release_saved();
    output_.reset();
    grad_.reset();
    report();
  }

  L& layer() noexcept { return *layer_; }
  const std::string& name() const noexcept override { return name_; }

  template <class Visit>
  void parameters(Visit&& visit) {
    layer_->parameters(visit);
  }

  /// Runs the layer, keeps its input, makes it release its activations. The reference is valid until
  /// the next checkpointed layer's forward has returned, or this layer's backward begins.
  const output_type& forward(const input_type& x) {
    ckpt_->boundary();
    release_saved();  // a forward without backward (evaluation) leaves a saved input behind
    grad_.reset();    // the layer below has used it (its backward ran in the last step)
    RecomputeBase* before = ckpt_->last_forward_;
    const bool chained = before != nullptr && before != this && before->output_address() == &x;
    const Savings where = savings();
    CopyWorker::Ticket saving = 0;
    if (where == Savings::object) {
      if (chained) {
        saved_ = std::static_pointer_cast<input_type>(before->take_output());
      } else {
        saved_ = std::make_shared<input_type>(x);
      }
    } else {
      saving = save_bytes(x, where);
    }
    ckpt_->push(this);
    if constexpr (HasRngState<L>) rng_ = layer_->rng_state();
    report();

    try {
      const output_type& y = layer_->forward(x);
      report_layer();
      forward_shape_ = shape_of(y);
      output_ = std::make_shared<output_type>(y);
      report();  // beside the layer's buffers until they are released
      if (saving != 0) ckpt_->worker().wait(std::exchange(saving, 0));
    } catch (...) {  // nothing kept: the copy thread must be done with x before it goes
      if (saving != 0) ckpt_->worker().drain_quietly();
      release_saved();
      output_.reset();
      layer_->release_activations();
      report_layer();
      report();
      throw;
    }
    layer_->release_activations();
    report_layer();
    if (chained && where != Savings::object) before->drop_output();  // copied out above
    ckpt_->last_forward_ = this;
    report();
    ckpt_->boundary();
    return *output_;
  }

  /// Runs the layer's forward again from the saved input, then its backward; returns the input's
  /// gradient (valid until the checkpointed layer below has used it, or this layer's next forward).
  const input_type& backward(const output_type& dy) {
    if (!holds_saved_input()) {
      throw usage_error("backward without a forward since the last backward: no saved input to recompute from",
                        "Recompute " + name_);
    }
    ckpt_->boundary();
    ckpt_->pop(this, /*prefetch_next=*/true);
    if (ckpt_->last_forward_ == this) ckpt_->last_forward_ = nullptr;
    output_.reset();  // its consumer's backward has run
    const input_type& x = input();
    report();

    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    const output_type* y = nullptr;
    if constexpr (HasRngState<L>) {
      auto now = layer_->rng_state();
      layer_->set_rng_state(*rng_);
      y = &layer_->forward(x);
      layer_->set_rng_state(std::move(now));
    } else {
      y = &layer_->forward(x);
    }
    ckpt_->record(profile_id_, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    report_layer();
    if (const Shape again = shape_of(*y); again != forward_shape_) {
      layer_->release_activations();
      report_layer();
      throw usage_error("the recomputed output's shape differs from the forward's " + to_string(forward_shape_) +
                            " (is the layer's forward deterministic in its shapes?)",
                        "Recompute " + name_, to_string(again));
    }

    const input_type& dx = layer_->backward(dy);
    report_layer();
    grad_ = std::make_shared<input_type>(dx);
    report();  // the copy exists beside the layer's buffers until they are released
    layer_->release_activations();
    report_layer();
    RecomputeBase* above = ckpt_->last_backward_;
    if (above != nullptr && above != this && above->grad_address() == &dy) above->drop_grad();  // used
    release_saved();
    ckpt_->last_backward_ = this;
    report();
    ckpt_->boundary();
    return *grad_;
  }

  /// A forward ran and its backward has not.
  bool holds_saved_input() const noexcept { return saved_ != nullptr || saved_bytes_ != nullptr; }
  /// Bytes this object holds now: the saved input (in any space), output and gradient copies.
  std::size_t held_bytes() const noexcept { return host_bytes() + (saved_bytes_ != nullptr ? saved_size_ : 0); }

 private:
  enum class Savings { object, arena, pinned };

  Savings savings() const noexcept {
    const Options& o = ckpt_->options();
    if (o.contiguous_memory) return Savings::arena;
    if (o.cpu_checkpointing) return Savings::pinned;
    return Savings::object;
  }

  template <class T>
  static Shape shape_of(const T& v) {
    if constexpr (Savable<T>) {
      return ActivationTraits<T>::shape(v);
    } else {
      return Shape{};
    }
  }
  template <class T>
  static std::size_t bytes_of(const T& v) {
    if constexpr (Savable<T>) {
      return ActivationTraits<T>::bytes(v);
    } else {
      return 0;  // unknown to zerotk: not reported
    }
  }

  CopyWorker::Ticket save_bytes(const input_type& x, Savings where) {
    if constexpr (!Savable<input_type>) {
      throw usage_error(
          "contiguous_memory_optimization and cpu_checkpointing copy saved inputs as bytes, which needs "
          "zerotk::activation::ActivationTraits for the layer's input type (activation/traits.hpp)",
          "Recompute " + name_);
    } else {
      using Traits = ActivationTraits<input_type>;
      saved_shape_ = Traits::shape(x);
      saved_size_ = Traits::bytes(x);
      if (where == Savings::arena) {
        saved_bytes_ = ckpt_->arena().acquire(saved_size_, "Recompute " + name_);
        from_arena_ = true;
      } else {
        if (pinned_.size() < saved_size_) {
          pinned_ = PinnedTrackedBuffer<std::byte>(saved_size_, MemoryCategory::activations, ckpt_->ledger());
        }
        saved_bytes_ = pinned_.data();
        from_arena_ = false;
      }
      std::byte* dst = saved_bytes_;
      if (!ckpt_->options().cpu_checkpointing) {
        Traits::save(x, dst);
        return 0;
      }
      return ckpt_->worker().submit([&x, dst] { Traits::save(x, dst); });
    }
  }

  /// The saved input as an object: itself, or brought back from bytes (waiting for a prefetch).
  const input_type& input() {
    if (saved_ != nullptr) return *saved_;
    if constexpr (Savable<input_type>) {
      if (restoring_ != 0) {
        ckpt_->worker().wait(std::exchange(restoring_, 0));
      } else {
        restored_.emplace();
        ActivationTraits<input_type>::restore(*restored_, saved_shape_, saved_bytes_);
      }
      return *restored_;
    }
    throw usage_error("no saved input", "Recompute " + name_);  // unreachable: save_bytes threw
  }

  void prefetch() override {
    if constexpr (Savable<input_type>) {
      if (saved_bytes_ == nullptr || restoring_ != 0 || !ckpt_->options().cpu_checkpointing) return;
      restored_.emplace();
      input_type* into = &*restored_;
      const std::byte* src = saved_bytes_;
      const Shape shape = saved_shape_;
      restoring_ = ckpt_->worker().submit([into, shape, src] { ActivationTraits<input_type>::restore(*into, shape, src); });
      restored_reported_ = saved_size_;  // about to exist: counted from now
      report();
    }
  }

  void release_saved() noexcept {
    if (std::exchange(restoring_, 0) != 0) ckpt_->worker().drain_quietly();  // a failed copy is not used
    saved_.reset();
    restored_.reset();
    restored_reported_ = 0;
    if (saved_bytes_ != nullptr && from_arena_) ckpt_->arena().release(saved_bytes_);
    saved_bytes_ = nullptr;
    saved_size_ = 0;
    ckpt_->pop(this, false);
  }

  const void* output_address() const noexcept override { return output_.get(); }
  std::shared_ptr<void> take_output() override {
    std::shared_ptr<void> out = std::move(output_);
    output_.reset();
    report();
    return out;
  }
  void drop_output() override {
    output_.reset();
    report();
  }
  const void* grad_address() const noexcept override { return grad_.get(); }
  void drop_grad() override {
    grad_.reset();
    report();
  }

  std::size_t host_bytes() const noexcept {
    std::size_t n = 0;
    if (saved_ != nullptr) n += bytes_of(*saved_);
    if (output_ != nullptr) n += bytes_of(*output_);
    if (grad_ != nullptr) n += bytes_of(*grad_);
    if (restored_) n += restoring_ != 0 ? restored_reported_ : bytes_of(*restored_);
    return n;
  }
  /// What this object holds in host memory, to the meter (pinned and arena bytes are ledger buffers).
  void report() noexcept {
    if (Meter* m = ckpt_->meter()) m->set(this, host_bytes());
  }
  void report_layer() {
    if constexpr (HasActivationBytes<L>) {
      if (Meter* m = ckpt_->meter()) m->set(layer_, layer_->activation_bytes());
    }
  }

  L* layer_;
  Checkpointing* ckpt_;
  std::string name_;
  std::size_t profile_id_;
  std::shared_ptr<input_type> saved_;      // Savings::object
  std::byte* saved_bytes_ = nullptr;       // Savings::arena / pinned
  bool from_arena_ = false;
  Shape saved_shape_;
  std::size_t saved_size_ = 0;
  PinnedTrackedBuffer<std::byte> pinned_;  // cpu_checkpointing without the arena
  std::optional<input_type> restored_;
  CopyWorker::Ticket restoring_ = 0;
  std::size_t restored_reported_ = 0;
  std::shared_ptr<output_type> output_;
  std::shared_ptr<input_type> grad_;
  Shape forward_shape_;
  std::optional<typename detail::RngStateOf<L>::type> rng_;
};

}  // namespace zerotk::activation

namespace zerotk {
using activation::Recompute;
}  // namespace zerotk
