#pragma once
/// \file zerotk/activation/arena.hpp
/// Arena: DeepSpeed's `contiguous_memory_optimization`. The saved inputs of up to
/// `number_checkpoints` checkpointed layers live in one allocation instead of one allocation each,
/// so a long run does not fragment the heap with buffers of one size freed and taken every step.
///
/// The arena is allocated on the first save, with `number_checkpoints` slots of that first input's
/// size (rounded up to 64 bytes); checkpointed layers of one model usually take inputs of one shape.
/// An input larger than a slot, or more saved inputs alive at once than there are slots, is a
/// usage_error that names `activation_checkpointing.number_checkpoints` and the sizes. With
/// cpu_checkpointing the arena is page-locked host memory (MemorySpace::pinned_host), otherwise
/// ordinary host memory; the ledger records it under `activations` for as long as it exists.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/core/pinned_host_space.hpp"

namespace zerotk::activation {

class Arena {
 public:
  static constexpr std::size_t kSlotAlignment = 64;

  Arena(std::int64_t slots, bool pinned, MemoryLedger* ledger) : slots_(slots), pinned_(pinned), ledger_(ledger) {
    if (slots <= 0) {
      throw config_error("contiguous_memory_optimization needs the number of checkpointed layers (> 0)",
                         "activation_checkpointing.number_checkpoints", std::to_string(slots));
    }
  }

  /// A free slot for `bytes` bytes; `who` names the layer in errors.
  std::byte* acquire(std::size_t bytes, std::string_view who) {
    if (slot_bytes_ == 0) allocate(round_up(bytes == 0 ? 1 : bytes));
    if (bytes > slot_bytes_) {
      throw usage_error("saved input of " + std::string(who) + " is larger than an arena slot (" +
                            std::to_string(slot_bytes_) +
                            " bytes, sized by the first saved input); contiguous_memory_optimization wants inputs of "
                            "one size",
                        "activation_checkpointing.contiguous_memory_optimization", std::to_string(bytes) + " bytes");
    }
    for (std::size_t i = 0; i < used_.size(); ++i) {
      if (!used_[i]) {
        used_[i] = true;
        return base() + i * slot_bytes_;
      }
    }
    throw usage_error("more saved inputs alive at once than arena slots (saving " + std::string(who) +
                          "); raise number_checkpoints to the number of checkpointed layers",
                      "activation_checkpointing.number_checkpoints", std::to_string(slots_));
  }

  /// Gives a slot from acquire() back (nullptr: nothing).
  void release(const std::byte* p) noexcept {
    if (p == nullptr || slot_bytes_ == 0) return;
    const auto i = static_cast<std::size_t>(p - base()) / slot_bytes_;
    if (i < used_.size()) used_[i] = false;
  }

  std::size_t slot_bytes() const noexcept { return slot_bytes_; }
  std::int64_t slots() const noexcept { return slots_; }
  std::size_t in_use() const noexcept {
    std::size_t n = 0;
    for (bool u : used_) n += u ? 1 : 0;
    return n;
  }
  /// Bytes allocated (0 before the first save).
  std::size_t bytes() const noexcept { return pinned_ ? pinned_buffer_.bytes() : host_buffer_.bytes(); }
  MemorySpace space() const noexcept { return pinned_ ? MemorySpace::pinned_host : MemorySpace::host; }

 private:
  static std::size_t round_up(std::size_t b) { return (b + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment; }

  void allocate(std::size_t slot) {
    const std::size_t total = slot * static_cast<std::size_t>(slots_);
    if (pinned_) {
      pinned_buffer_ = PinnedTrackedBuffer<std::byte>(total, MemoryCategory::activations, ledger_);
    } else {
      host_buffer_ = TrackedBuffer<std::byte>(total, MemoryCategory::activations, ledger_);
    }
    slot_bytes_ = slot;
    used_.assign(static_cast<std::size_t>(slots_), false);
  }
  std::byte* base() noexcept { return pinned_ ? pinned_buffer_.data() : host_buffer_.data(); }
  const std::byte* base() const noexcept { return pinned_ ? pinned_buffer_.data() : host_buffer_.data(); }

  std::int64_t slots_;
  bool pinned_;
  MemoryLedger* ledger_;
  std::size_t slot_bytes_ = 0;
  std::vector<bool> used_;
  TrackedBuffer<std::byte> host_buffer_;
  PinnedTrackedBuffer<std::byte> pinned_buffer_;
};

}  // namespace zerotk::activation
