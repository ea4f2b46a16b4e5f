#pragma once
/// \file zerotk/engine/registry.hpp
/// ParamRegistry: every parameter of the model the engine was built with, identified once.
///
/// Parameters get a ParamId in the order the model visits them; each remembers its name, size,
/// element type, which flat group it lives in (the working precision, or the fp32-kept group), and
/// how to bind it. Layers get a ModuleId the first time a scope sees them: the layer's own
/// parameters and its `external_parameters` are resolved then and cached, so later scopes cost one
/// hash lookup of the layer's address instead of one per parameter.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "zerotk/parallel/split.hpp"
#include "zerotk/core/concepts.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/engine/model_view.hpp"

namespace zerotk::engine {

using ParamId = std::uint32_t;
using ModuleId = std::uint32_t;

/// Which flat buffer family a parameter lives in: the working precision's, the fp32-kept one, or the
/// experts' (working precision, reduced and sharded over the expert-data group).
enum class GroupKind : std::uint8_t { main, fp32, expert };
inline constexpr std::size_t kGroupKinds = 3;

struct ParamEntry {
  std::string name;
  std::size_t numel = 0;
  std::vector<std::size_t> shape;   ///< the Param's shape() if it has one, else {numel}
  DType value_dtype = DType::fp32;  ///< the Param's element type
  GroupKind group = GroupKind::main;
  std::uint32_t local = 0;          ///< index within its group's layout
  std::uint32_t optimizer_group = 0;
  /// Stage 3's fetch unit: the index of the model's direct sub-module (`modules(visit)`) whose
  /// parameters() visit it, or, for a parameter no sub-module visits, a unit of its own.
  std::uint32_t unit = 0;
  /// Stage 3: kept unpartitioned because of its module's type (Rules::partitioned_module_types,
  /// replicated_module_types).
  bool replicated = false;
  /// How the parameter is split across the tensor group (the Param holds this rank's shard).
  parallel::TensorSplit tensor_split{};
  /// Points the Param at (data, grad); both typed as the Param's element type.
  std::function<void(void* data, void* grad)> bind;
  /// Copies the values the Param holds before the engine binds it into `dst` (numel elements of
  /// the Param's type); false, copying nothing, if its data() is null. Valid until the first bind.
  std::function<bool(void* dst)> read_initial;
};

/// A layer as the scopes see it.
struct ModuleEntry {
  std::vector<ParamId> own;       ///< parameters(visit)
  std::vector<ParamId> external;  ///< external_parameters(visit): gradients written here, owned elsewhere
  std::vector<const void*> addresses;  ///< of own, then external: to recognise the layer again
};

class ParamRegistry {
 public:
  struct Rules {
    /// Element type the engine stores the main group in.
    DType storage = DType::fp32;
    std::function<bool(std::string_view)> keep_fp32;
    std::function<std::uint32_t(std::string_view)> group_of;
    std::size_t optimizer_groups = 1;
    std::vector<std::string> fp32_module_types;
    /// Stage 3: only parameters of modules of these types are partitioned (empty: all); never
    /// those of `replicated_module_types`. A listed type no module declares is an error.
    std::vector<std::string> partitioned_module_types;
    std::vector<std::string> replicated_module_types;
    /// ModelOptions::tensor_split: by name, an override of what the parameters declare.
    std::function<parallel::TensorSplit(std::string_view)> tensor_split;
    /// ModelOptions::expert: by name, parameters that belong to an expert (besides those whose
    /// `expert()` says so).
    std::function<bool(std::string_view)> expert;
  };

  /// Records every parameter of the model `view` describes (and its current values, if it has any).
  ParamRegistry(ModelView view, Rules rules) : rules_(std::move(rules)) {
    for (const TypedModuleView& t : view.typed) {
      if (std::find(types_seen_.begin(), types_seen_.end(), t.type) == types_seen_.end()) types_seen_.emplace_back(t.type);
      const auto listed = [&](const std::vector<std::string>& types) {
        return std::find(types.begin(), types.end(), t.type) != types.end();
      };
      if (listed(rules_.fp32_module_types)) fp32_params_.insert(t.params.begin(), t.params.end());
      if (listed(rules_.partitioned_module_types)) partitioned_params_.insert(t.params.begin(), t.params.end());
      if (listed(rules_.replicated_module_types)) replicated_params_.insert(t.params.begin(), t.params.end());
    }
    check_types_exist("zero_allowed_param_types (Stage3Options::partitioned_module_types)",
                      rules_.partitioned_module_types);
    check_types_exist("zero_force_param_types (Stage3Options::replicated_module_types)",
                      rules_.replicated_module_types);
    for (const std::vector<const void*>& unit : view.units) {
      for (const void* p : unit) unit_of_.emplace(p, units_);
      ++units_;
    }
    for (ParamView& p : view.params) add(std::move(p));
    check_groups();
  }

  /// Visits `model` once (engine/model_view.hpp) and records every parameter.
  template <Module M>
  ParamRegistry(M& model, Rules rules) : ParamRegistry(view_model(model), std::move(rules)) {}

  std::size_t size() const noexcept { return entries_.size(); }
  ParamEntry& operator[](ParamId id) noexcept { return entries_[id]; }
  const ParamEntry& operator[](ParamId id) const noexcept { return entries_[id]; }
  std::span<ParamEntry> entries() noexcept { return entries_; }
  std::span<const ParamEntry> entries() const noexcept { return entries_; }
  /// Main-group parameters hold float while the engine stores 16-bit values (emulated 16-bit).
  bool emulated() const noexcept { return emulated_; }
  /// Some parameter belongs to an expert (GroupKind::expert).
  bool has_experts() const noexcept { return expert_count_ > 0; }
  std::size_t parameter_count() const noexcept { return psi_; }

  /// The id of a layer, resolving its parameters to ids on first sight. Later scopes of the same
  /// layer only compare parameter addresses with the cached ones (no lookups); a different layer at
  /// a reused address (a temporary view) is resolved again.
  ModuleId module(const LayerRef& layer) {
    if (auto it = modules_by_address_.find(layer.layer); it != modules_by_address_.end()) {
      if (!matches(layer, modules_[it->second])) modules_[it->second] = resolve(layer);
      return it->second;
    }
    const auto id = static_cast<ModuleId>(modules_.size());
    modules_.push_back(resolve(layer));
    modules_by_address_.emplace(layer.layer, id);
    return id;
  }
  template <Module L>
  ModuleId module(L& layer) {
    return module(layer_ref(layer));
  }
  const ModuleEntry& module_entry(ModuleId id) const noexcept { return modules_[id]; }

  ParamId lookup(const void* param, std::string_view name) const {
    auto it = index_.find(param);
    if (it == index_.end()) {
      throw usage_error("parameter is not part of the model this engine was built with", std::string(name));
    }
    return it->second;
  }

 private:
  ModuleEntry resolve(const LayerRef& layer) const {
    struct Sink final : LayerParamSink {
      const ParamRegistry* r;
      ModuleEntry m;
      void own(const void* p, std::string_view name) override {
        m.own.push_back(r->lookup(p, name));
        m.addresses.push_back(p);
      }
      void external(const void* p, std::string_view name) override {
        m.external.push_back(r->lookup(p, name));
        m.addresses.push_back(p);
      }
    } sink;
    sink.r = this;
    layer.visit(layer.layer, sink);
    return std::move(sink.m);
  }

  static bool matches(const LayerRef& layer, const ModuleEntry& m) {
    struct Sink final : LayerParamSink {
      const ModuleEntry* m;
      std::size_t i = 0;
      bool same = true;
      void check(const void* p) {
        same = same && i < m->addresses.size() && m->addresses[i] == p;
        ++i;
      }
      void own(const void* p, std::string_view) override { check(p); }
      void external(const void* p, std::string_view) override { check(p); }
    } sink;
    sink.m = &m;
    layer.visit(layer.layer, sink);
    return sink.same && sink.i == m.addresses.size();
  }

  void add(ParamView&& p) {
    const void* address = p.address;
    if (index_.count(address)) throw usage_error("parameter visited twice by the model", p.name);
    ParamEntry e;
    e.name = std::move(p.name);
    e.numel = p.numel;
    e.shape = std::move(p.shape);
    e.value_dtype = p.value_dtype;
    const std::string_view name = e.name;
    const bool want_fp32 = (rules_.keep_fp32 && rules_.keep_fp32(name)) || fp32_params_.count(address) > 0;
    const bool fp32 = rules_.storage != DType::fp32 && want_fp32;
    const bool holds_float = e.value_dtype == DType::fp32;
    const bool expert = p.expert || (rules_.expert && rules_.expert(name));
    if (expert && want_fp32) {
      throw usage_error("an expert parameter is trained in the working precision; keeping it in fp32 (keep_fp32 / "
                        "fp32_module_types) is not supported",
                        e.name);
    }
    e.group = expert ? GroupKind::expert : fp32 ? GroupKind::fp32 : GroupKind::main;
    if (fp32 && !holds_float) {
      throw usage_error("parameters kept in fp32 (keep_fp32 / fp32_module_types) must hold float values", e.name,
                        std::string(to_string(e.value_dtype)));
    }
    if (!fp32 && e.value_dtype != rules_.storage && !holds_float) {
      throw usage_error("parameter element type must be the engine precision's storage type or float", e.name,
                        std::string(to_string(e.value_dtype)));
    }
    if (!fp32 && e.value_dtype != rules_.storage) emulated_ = true;
    e.optimizer_group = rules_.group_of ? rules_.group_of(name) : 0;
    if (e.optimizer_group >= rules_.optimizer_groups) {
      throw config_error("group_of returned a group that does not exist", e.name, std::to_string(e.optimizer_group));
    }
    e.local = expert ? expert_count_++ : fp32 ? fp32_count_++ : main_count_++;
    const auto unit = unit_of_.find(address);
    e.unit = unit != unit_of_.end() ? unit->second : units_++;
    e.replicated = replicated_params_.count(address) > 0 ||
                   (!rules_.partitioned_module_types.empty() && partitioned_params_.count(address) == 0);
    e.tensor_split = split_of(e.name, p.tensor_split);
    e.bind = std::move(p.bind);
    e.read_initial = std::move(p.read_initial);
    index_.emplace(address, static_cast<ParamId>(entries_.size()));
    psi_ += e.numel;
    entries_.push_back(std::move(e));
  }

  /// The parameter's own declaration (its tensor_split(), parallel/split_param.hpp), unless the
  /// by-name rule splits it: the rule overrides; a rule answering replicated() leaves the declaration.
  parallel::TensorSplit split_of(std::string_view name, const std::optional<parallel::TensorSplit>& declared) const {
    if (rules_.tensor_split) {
      const parallel::TensorSplit by_name = rules_.tensor_split(name);
      if (by_name.is_split()) return by_name;
    }
    return declared.value_or(parallel::TensorSplit{});
  }

  void check_groups() const {
    if (!emulated_) return;
    for (const auto& e : entries_) {
      if (e.group != GroupKind::fp32 && e.value_dtype != DType::fp32) {
        throw usage_error("float and 16-bit Params cannot be mixed in one model's working-precision parameters "
                          "(dense and expert): give every one float, or every one the storage type",
                          e.name, std::string(to_string(e.value_dtype)));
      }
    }
  }

  /// A type name that matches no module is most likely a typo: say so rather than partition all.
  void check_types_exist(std::string_view key, const std::vector<std::string>& types) const {
    for (const std::string& t : types) {
      if (std::find(types_seen_.begin(), types_seen_.end(), t) != types_seen_.end()) continue;
      std::string seen;
      for (const std::string& s : types_seen_) seen += (seen.empty() ? "" : ", ") + s;
      throw config_error("no module of the model declares this module_type (types declared: " +
                             (seen.empty() ? std::string("none; a module names its type with `static constexpr "
                                                         "std::string_view module_type`")
                                           : seen) +
                             ")",
                         std::string(key), t);
    }
  }

  Rules rules_;
  std::vector<ParamEntry> entries_;
  std::unordered_map<const void*, ParamId> index_;
  std::unordered_set<const void*> fp32_params_, partitioned_params_, replicated_params_;
  std::vector<std::string> types_seen_;
  std::vector<ModuleEntry> modules_;
  std::unordered_map<const void*, ModuleId> modules_by_address_;
  std::unordered_map<const void*, std::uint32_t> unit_of_;
  std::uint32_t main_count_ = 0, fp32_count_ = 0, expert_count_ = 0, units_ = 0;
  std::size_t psi_ = 0;
  bool emulated_ = false;
};

}  // namespace zerotk::engine
