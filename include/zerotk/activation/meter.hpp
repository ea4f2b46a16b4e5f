#pragma once
/// \file zerotk/activation/meter.hpp
/// Meter: keeps a ledger's `activations` category equal to what the layers hold right now.
///
/// A layer's activation buffers belong to the user's code, not to zerotk, so nothing allocates them
/// through a TrackedBuffer. Instead the owner of each piece of activation memory reports its current
/// size under a key (the layer's address, say) and the meter adds the difference to the ledger:
///
///   activation::Meter meter(&engine.memory());
///   layer.forward(x);   meter.set(&layer, layer.activation_bytes());   // grew
///   layer.release();    meter.set(&layer, 0);                          // gave it back
///
/// Reporting the same size again changes nothing, so a layer may be reported by both the model's
/// loop and a Recompute around it. The ledger's peak is then the peak over the points where sizes
/// were reported: report after each step that grows or frees memory. Not thread-safe (one meter per
/// rank, used by that rank's thread); the ledger itself is.

#include <cstddef>
#include <unordered_map>
#include <utility>

#include "zerotk/core/memory.hpp"

namespace zerotk::activation {

class Meter {
 public:
  explicit Meter(MemoryLedger* ledger = nullptr) noexcept : ledger_(ledger) {}
  Meter(const Meter&) = delete;
  Meter& operator=(const Meter&) = delete;
  /// Gives back every byte still reported, so the ledger does not keep counting freed owners.
  ~Meter() { clear(); }

  /// The bytes `key` holds in `space` from now on.
  void set(const void* key, std::size_t bytes, MemorySpace space = MemorySpace::host) {
    auto& held = held_[{key, space}];
    if (ledger_ != nullptr) {
      if (bytes > held) ledger_->add(space, MemoryCategory::activations, bytes - held);
      if (bytes < held) ledger_->sub(space, MemoryCategory::activations, held - bytes);
    }
    held = bytes;
  }

  /// What `key` holds in `space` now (0 if it never reported).
  std::size_t held(const void* key, MemorySpace space = MemorySpace::host) const {
    const auto it = held_.find({key, space});
    return it == held_.end() ? 0 : it->second;
  }

  /// Everything reported, all keys and spaces.
  std::size_t total() const noexcept {
    std::size_t n = 0;
    for (const auto& [k, b] : held_) n += b;
    return n;
  }

  void clear() noexcept {
    for (auto& [k, b] : held_) {
      if (ledger_ != nullptr && b > 0) ledger_->sub(k.second, MemoryCategory::activations, b);
      b = 0;
    }
  }

  MemoryLedger* ledger() const noexcept { return ledger_; }

 private:
  struct KeyHash {
    std::size_t operator()(const std::pair<const void*, MemorySpace>& k) const noexcept {
      return std::hash<const void*>{}(k.first) * 31u + static_cast<std::size_t>(k.second);
    }
  };
  MemoryLedger* ledger_;
  std::unordered_map<std::pair<const void*, MemorySpace>, std::size_t, KeyHash> held_;
};

}  // namespace zerotk::activation
