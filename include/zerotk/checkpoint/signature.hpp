#pragma once
/// \file zerotk/checkpoint/signature.hpp
/// What a checkpoint must agree with before an engine loads it: precision, optimizer, the model's
/// parameters (names, whole shapes, groups) and the scheduler setting. World size, tensor size, stage
/// and bucket size may differ: the fragment tables say where every element went (load.hpp reshards). A mismatch is
/// a usage_error naming the manifest key and both values (the checkpoint is intact; it is for
/// another engine).

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "zerotk/checkpoint/manifest.hpp"
#include "zerotk/checkpoint/whole.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/engine/api.hpp"
#include "zerotk/engine/shards.hpp"
#include "zerotk/engine/state.hpp"
#include "zerotk/policies.hpp"

namespace zerotk::checkpoint {

/// The per-element optimizer states of the optimizer named `optimizer` (its tag's name), in file
/// order (DeepSpeed's names): as many of exp_avg, exp_avg_sq, exp_avg_sq_fresh as its tag has
/// states (policies.hpp). An unknown name has Adam's two.
inline std::vector<std::string> optimizer_state_names(std::string_view optimizer) {
  static constexpr std::string_view kNames[] = {"exp_avg", "exp_avg_sq", "exp_avg_sq_fresh"};
  std::size_t states = 2;
  visit_named(optimizer_tags{}, optimizer, [&](auto tag) { states = decltype(tag)::states; });
  return std::vector<std::string>(kNames, kNames + states);
}

/// The name a checkpoint records for the optimizer of tag `Tag`: its DeepSpeed type name.
template <class Tag>
constexpr std::string_view optimizer_name() {
  return Tag::name;
}

/// The structure of one engine on one rank.
struct EngineSignature {
  int world_size = 1;
  int rank = 0;
  int stage = 0;
  std::string precision;
  std::string optimizer;
  std::uint64_t parameter_count = 0;
  std::uint64_t flat_numel = 0;
  engine::ShardTable shards;
};

template <TrainingEngine E>
EngineSignature signature_of(const E& engine) {
  EngineSignature s;
  s.world_size = engine.world_size();
  s.rank = engine.rank();
  s.stage = engine.stage();
  s.precision = std::string(to_string(engine.storage_dtype()));
  s.optimizer = std::string(engine.optimizer_name());
  s.parameter_count = engine.parameter_count();
  s.flat_numel = engine.flat_numel();
  s.shards = engine.shard_table();
  return s;
}

namespace detail {

template <class T>
void require_same(const std::string& manifest_path, const char* key, const char* what, const T& saved, const T& here) {
  if (saved == here) return;
  std::string s, h;
  if constexpr (std::is_same_v<T, std::string>) {
    s = saved;
    h = here;
  } else {
    s = std::to_string(saved);
    h = std::to_string(here);
  }
  throw usage_error(std::string("the checkpoint is for ") + what, manifest_path + ": " + key,
                    "saved " + s + ", this engine " + h);
}

}  // namespace detail

namespace detail {

inline std::string param_text(const WholeParam& p) {
  std::string s = "\"" + p.name + "\" " + p.dtype + " [";
  for (std::size_t d = 0; d < p.shape.size(); ++d) s += (d ? "," : "") + std::to_string(p.shape[d]);
  return s + "] group " + std::to_string(p.group) + " optimizer group " + std::to_string(p.optimizer_group);
}

}  // namespace detail

/// Throws unless `m` was saved by an engine of the same model, precision and optimizer as `sig`,
/// with the same flat groups and scheduler setting as `current` (this engine's own state).
inline void check_compatible(const Manifest& m, const EngineSignature& sig, const EngineState& current,
                             const std::string& manifest_path) {
  using detail::require_same;
  require_same(manifest_path, "precision", "another precision", m.precision, sig.precision);
  require_same(manifest_path, "optimizer", "another optimizer", m.optimizer, sig.optimizer);
  std::string saved_states, here_states;
  for (const auto& s : m.optimizer_states) saved_states += (saved_states.empty() ? "" : " ") + s;
  for (const auto& s : optimizer_state_names(sig.optimizer)) here_states += (here_states.empty() ? "" : " ") + s;
  require_same(manifest_path, "optimizer_states", "other optimizer states", saved_states, here_states);
  // The model's whole parameters, however each side split them across its tensor group, matched by
  // name, so that a mismatch names the parameter that differs (issue 57 item 12: it named only
  // parameter_count): one the checkpoint has and this model lacks, or the reverse, or a shape,
  // dtype or group that differs; then their order.
  const std::vector<WholeParam> saved = whole_params(m.shards, manifest_path), here = whole_params(sig.shards, "this engine");
  std::map<std::string_view, const WholeParam*> here_by_name, saved_by_name;
  for (const WholeParam& p : here) here_by_name.emplace(p.name, &p);
  for (const WholeParam& p : saved) saved_by_name.emplace(p.name, &p);
  for (const WholeParam& s : saved) {
    const std::string key = "param" + std::to_string(s.entries.front());
    const auto it = here_by_name.find(s.name);
    if (it == here_by_name.end()) {
      throw usage_error("the checkpoint is for another model: its parameter \"" + s.name + "\" is not in this model",
                        manifest_path + ": " + key, detail::param_text(s));
    }
    require_same(manifest_path, key.c_str(), "another model (parameters differ)", detail::param_text(s),
                 detail::param_text(*it->second));
  }
  for (const WholeParam& h : here) {
    if (!saved_by_name.contains(h.name)) {
      throw usage_error("the checkpoint is for another model: this model's parameter \"" + h.name + "\" is not in it",
                        manifest_path + ": parameters", detail::param_text(h));
    }
  }
  for (std::size_t i = 0; i < saved.size(); ++i) {
    const std::string key = "param" + std::to_string(saved[i].entries.front());
    require_same(manifest_path, key.c_str(), "the same parameters in another order", saved[i].name, here[i].name);
  }
  require_same(manifest_path, "parameter_count", "another model", m.parameter_count, sig.parameter_count);
  require_same(manifest_path, "groups", "another split into fp32-kept and working-precision groups",
               m.shards.owned_numel.size(), current.groups.size());
  const std::string saved_sched = m.scheduler ? "a scheduler" : "none";
  const std::string here_sched = current.scheduler ? "a scheduler" : "none";
  require_same(manifest_path, "scheduler", "an engine with another LR scheduler setting (set_scheduler before load)",
               saved_sched, here_sched);
}

/// True when rank `sig.rank` owns exactly what the saving rank of the same number owned: its file
/// then holds its state as is, and no resharding is needed. (The whole tables are compared: on a
/// grid the same fragments can belong to another tensor rank's shards.)
inline bool same_layout(const Manifest& m, const EngineSignature& sig) {
  return m.world_size == sig.world_size && m.shards == sig.shards;
}

}  // namespace zerotk::checkpoint
