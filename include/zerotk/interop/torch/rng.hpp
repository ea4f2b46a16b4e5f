#pragma once
/// \file zerotk/interop/torch/rng.hpp
/// The libtorch adapter's replay of torch's CPU generator, so that a recomputed forward draws what
/// the first one drew (zerotk/interop/torch.hpp).
#include "zerotk/interop/torch/libtorch.hpp"

#include <mutex>

namespace zerotk::interop {

namespace detail {

/// torch's default CPU generator's state now.
inline torch::Tensor cpu_rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

/// For a recompute: torch's default CPU generator set to the state the forward found, so the
/// recomputed forward draws what the first one drew (the same dropout mask), and put back when the
/// guard ends, so the stream goes on as if no recompute had run (torch.utils.checkpoint's
/// preserve_rng_state, for the CPU generator). The generator is one per process: on several thread
/// ranks their draws interleave, and neither the forward's masks nor this replay are reproducible.
class ReplayCpuRng {
 public:
  explicit ReplayCpuRng(const torch::Tensor& state) : gen_(at::detail::getDefaultCPUGenerator()) {
    if (!state.defined()) return;
    std::lock_guard<std::mutex> lock(gen_.mutex());
    saved_ = gen_.get_state();
    gen_.set_state(state);
  }
  ~ReplayCpuRng() {
    if (!saved_.defined()) return;
    try {
      std::lock_guard<std::mutex> lock(gen_.mutex());
      gen_.set_state(saved_);
    } catch (...) {  // a state this generator produced itself: cannot be refused
    }
  }
  ReplayCpuRng(const ReplayCpuRng&) = delete;
  ReplayCpuRng& operator=(const ReplayCpuRng&) = delete;

 private:
  at::Generator gen_;
  torch::Tensor saved_;
};

}  // namespace detail

}  // namespace zerotk::interop
