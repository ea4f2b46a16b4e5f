#pragma once
/// \file zerotk/interop/torch/model.hpp
/// The libtorch adapter's module: a torch module's trainable parameters as a zerotk Module, and
/// its direct children as stage 3's fetch units (zerotk/interop/torch.hpp).
#include "zerotk/interop/torch/libtorch.hpp"

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zerotk/core/concepts.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/interop/torch/param.hpp"

namespace zerotk::interop {

/// A torch module's trainable parameters as a zerotk Module, in named_parameters() order.
/// Neither copyable nor movable: the engine keeps the addresses of its parameters.
class TorchModel {
 public:
  explicit TorchModel(torch::nn::Module& module) {
    std::unordered_map<const void*, std::size_t> by_impl;    // TensorImpl -> index into params_
    std::unordered_map<const void*, std::string> by_storage;  // StorageImpl -> the first name using it
    std::vector<std::pair<std::string, torch::Tensor>> keep;
    for (const auto& item : module.named_parameters(/*recurse=*/true)) {
      const torch::Tensor& t = item.value();
      const void* impl = t.unsafeGetTensorImpl();
      if (auto it = by_impl.find(impl); it != by_impl.end()) {
        aliases_.emplace_back(item.key(), keep[it->second].first);
        continue;
      }
      if (!t.requires_grad()) {
        frozen_.push_back(item.key());
        continue;
      }
      if (t.layout() == torch::kStrided && t.has_storage()) {
        const void* storage = t.storage().unsafeGetStorageImpl();
        if (auto it = by_storage.find(storage); it != by_storage.end()) {
          throw usage_error("two torch parameters share storage (one is a view of the other); tie weights by "
                            "registering the same tensor in both modules instead",
                            item.key(), it->second);
        }
        by_storage.emplace(storage, item.key());
      }
      by_impl.emplace(impl, keep.size());
      keep.emplace_back(item.key(), t);
    }
    params_.reserve(keep.size());
    for (auto& [name, t] : keep) params_.emplace_back(name, t);
    // Stage 3's fetch units: the module's direct children, each with the parameters under its name.
    for (const auto& child : module.named_children()) {
      children_.push_back(child.key());
      Unit u{child.key(), {}};
      for (TorchParam& p : params_) {
        if (first_segment(p.name()) == child.key()) u.params.push_back(&p);
      }
      if (!u.params.empty()) units_.push_back(std::move(u));
    }
    for (const auto& [alias, name] : aliases_) {
      if (first_segment(alias) != first_segment(name)) cross_unit_aliases_.emplace_back(alias, name);
    }
  }

  /// A direct child of the module with the parameters under its name: one fetch unit at stage 3.
  struct Unit {
    std::string name;
    std::vector<TorchParam*> params;
    template <class Visit>
    void parameters(Visit&& visit) {
      for (TorchParam* p : params) visit(p->name(), *p);
    }
  };
  /// The units, for the engine (stage 3 gathers one unit's parameters together).
  template <class Visit>
  void modules(Visit&& visit) {
    for (Unit& u : units_) visit(u);
  }
  /// The unit of the child `name`, or null if that child has no trainable parameter.
  Unit* unit(std::string_view name) noexcept {
    for (Unit& u : units_) {
      if (u.name == name) return &u;
    }
    return nullptr;
  }
  std::size_t unit_count() const noexcept { return units_.size(); }
  /// Whether the module has a direct child named `name` (with or without trainable parameters).
  bool has_child(std::string_view name) const noexcept {
    return std::find(children_.begin(), children_.end(), name) != children_.end();
  }
  /// The direct children's names, in named_children() order.
  const std::vector<std::string>& children() const noexcept { return children_; }
  /// Tied tensors whose names sit under two different children (stage 3 refuses them).
  const std::vector<std::pair<std::string, std::string>>& cross_unit_aliases() const noexcept {
    return cross_unit_aliases_;
  }
  TorchModel(const TorchModel&) = delete;
  TorchModel& operator=(const TorchModel&) = delete;

  template <class Visit>
  void parameters(Visit&& visit) {
    for (TorchParam& p : params_) visit(p.name(), p);
  }

  std::size_t size() const noexcept { return params_.size(); }
  TorchParam& operator[](std::size_t i) noexcept { return params_[i]; }
  const TorchParam& operator[](std::size_t i) const noexcept { return params_[i]; }
  /// (alias, parameter): a tensor met again under another name (tied weights).
  const std::vector<std::pair<std::string, std::string>>& aliases() const noexcept { return aliases_; }
  /// Parameters with requires_grad false: left to the module, not trained.
  const std::vector<std::string>& frozen() const noexcept { return frozen_; }

  /// Every bound tensor still reads the engine's storage, or a usage_error naming the first that does not.
  void require_bound() const {
    for (const TorchParam& p : params_) p.require_bound();
  }
  /// Every tensor gets its own copy of its current values (before the engine goes away).
  void unbind() {
    for (TorchParam& p : params_) p.unbind();
  }

 private:
  static std::string_view first_segment(std::string_view name) noexcept { return name.substr(0, name.find('.')); }

  std::vector<TorchParam> params_;
  std::vector<Unit> units_;
  std::vector<std::pair<std::string, std::string>> aliases_, cross_unit_aliases_;
  std::vector<std::string> children_;  // every direct child, parameters or not
  std::vector<std::string> frozen_;
};

static_assert(Module<TorchModel>);

}  // namespace zerotk::interop
