#pragma once
/// \file zerotk/engine/sparsity.hpp
/// The engine's Sparsity part, selected by the policy's tag: Sparsity<None> does nothing;
/// Sparsity<NofM<N, M>> keeps one sparsity::ShardMasks per flat group and acts at the boundary in
/// NVIDIA ASP's order (gradients masked, step, weights masked), with one choice of zerotk's own: the
/// gradients are masked before the global norm, so the norm and clipping see what the optimizer
/// sees (ASP masks them inside the optimizer's step, after the trainer's clipping):
///
///   before the norm   at the boundary of step start_step + 1 the masks are chosen from the fp32
///                     master (sparsity/shard_masks.hpp: per ZeRO shard, the groups a block boundary
///                     cuts completed from the neighbours' block edges); from then on the pruned
///                     weights' reduced gradients are set to zero, so the norm, clipping and the
///                     optimizer see the masked gradients
///   after the update  the pruned weights' fp32 master and the optimizer's output (the working
///                     values about to be published) are set to zero, so every later forward sees N
///                     of every M weights and pruned weights stay at zero; their optimizer moments
///                     are kept, unused. (Values a trainer writes afterwards, through
///                     initialize_master() or a gather with modifier_rank, stand until the next
///                     update prunes them.)
///
/// Which parameters: SparsityOptions::parameters (names), else every parameter of two or more
/// dimensions whose last dimension M divides. Groups of M run along the last dimension of the
/// parameter as this rank holds it (a tensor-parallel shard's own last dimension).

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/core/glob.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/engine/registry.hpp"
#include "zerotk/policies.hpp"
#include "zerotk/sparsity/options.hpp"
#include "zerotk/sparsity/shard_masks.hpp"
#include "zerotk/zero/ownership.hpp"
#include "zerotk/zero/params/optimizer_out.hpp"

namespace zerotk::engine {

/// Sparsity<None>: no masks, nothing to do.
template <class Tag>
class SparsityPart {
 public:
  static constexpr bool kOn = false;
  template <class Groups, class AgreeMax>
  void build(Groups&, const ParamRegistry&, const sparsity::SparsityOptions&, MemoryLedger*, AgreeMax&&) {}
  template <class Groups>
  void before_norm(Groups&, std::int64_t) {}
  template <class Group>
  void after_update(Group&) const {}
  template <class Group>
  std::span<const std::uint8_t> keep(const Group&) const {
    return {};
  }
  template <class Group>
  void load(Group&, std::span<const std::uint8_t>) {}
  void loaded() noexcept {}
};

/// Whether `p` is made sparse by N:M masks under `options`: named by a pattern (then it must have a
/// shape the rule fits: refused in words otherwise), or, with no patterns, any parameter that fits.
/// `named[k]` is set for each pattern k that names `p`.
inline bool sparse_parameter(const ParamEntry& p, const sparsity::SparsityOptions& options, int m, std::vector<char>& named) {
  const bool fits = p.shape.size() >= 2 && p.shape.back() % static_cast<std::size_t>(m) == 0;
  if (options.parameters.empty()) return fits;
  bool sparse = false;
  for (std::size_t k = 0; k < options.parameters.size(); ++k) {
    const std::string& pattern = options.parameters[k];
    if (!glob_match(pattern, p.name)) continue;
    named[k] = 1;
    if (!fits) {
      std::string shape = "[";
      for (std::size_t i = 0; i < p.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(p.shape[i]);
      throw config_error("a sparse parameter needs two or more dimensions and a last dimension that M = " +
                             std::to_string(m) + " divides",
                         "sparsity.parameters \"" + pattern + "\"", p.name + " " + shape + "]");
    }
    sparse = true;
  }
  return sparse;
}

template <int N, int M>
class SparsityPart<NofM<N, M>> {
 public:
  static constexpr bool kOn = true;

  /// One ShardMasks per group present (indexed by GroupKind). Refuses patterns that name no
  /// parameter on any rank, and a model with nothing to make sparse: `agree_max(values, n)` takes
  /// the maximum over every rank the engine spans (a pipeline stage may hold none of a pattern's).
  template <class Groups, class AgreeMax>
  void build(Groups& groups, const ParamRegistry& registry, const sparsity::SparsityOptions& options,
             MemoryLedger* ledger, AgreeMax&& agree_max) {
    options_ = options;
    std::vector<char> named(options.parameters.size(), 0);
    bool any = false;
    std::exception_ptr failed;  // a parameter named with a shape the rule does not fit, on this rank
    try {
      groups.each([&](auto& g) {
        using Own = typename std::remove_cvref_t<decltype(g)>::Own;
        std::vector<char> sparse(g.layout().param_count(), 0);
        for (std::uint32_t i = 0; i < sparse.size(); ++i) {
          const ParamEntry& p = registry[g.member(i)];
          sparse[i] = sparse_parameter(p, options, M, named) ? 1 : 0;
        }
        masks_[index(g.kind())] =
            sparsity::ShardMasks(N, M, g.layout(), Own::fragments(g.layout(), g.rank()), std::move(sparse),
                                 g.store().owned_numel(), g.rank(), std::is_same_v<Own, zero::OwnsAll>, ledger);
        any = any || masks_[index(g.kind())].active();
      });
    } catch (...) {
      failed = std::current_exception();
    }
    // One agreement for every rank's findings, so that all refuse together (none waits in a collective).
    std::vector<double> seen(named.begin(), named.end());
    seen.push_back(any ? 1.0 : 0.0);
    seen.push_back(failed ? 1.0 : 0.0);
    agree_max(seen.data(), seen.size());
    if (failed) std::rethrow_exception(failed);
    if (seen.back() != 0.0) {
      throw config_error("another rank refused a sparse parameter (its error names it)", "sparsity.parameters", "");
    }
    for (std::size_t k = 0; k < named.size(); ++k) {
      if (seen[k] == 0.0) {
        throw config_error("names no parameter of the model", "sparsity.parameters", "\"" + options.parameters[k] + "\"");
      }
    }
    if (seen[named.size()] == 0.0) {
      throw config_error("no parameter of the model has two or more dimensions and a last dimension that M = " +
                             std::to_string(M) + " divides: nothing to make sparse",
                         "Sparsity<" + std::string(NofM<N, M>::name) + ">", "");
    }
  }

  /// At a boundary, before the global norm; `steps_before`: optimizer steps taken before this one.
  template <class Groups>
  void before_norm(Groups& groups, std::int64_t steps_before) {
    if (!chosen_ && steps_before >= options_.start_step) {
      groups.each([&](auto& g) {
        sparsity::ShardMasks& masks = masks_[index(g.kind())];
        if (masks.active()) masks.choose(g.store().master(), g.comm());
      });
      chosen_ = true;
    }
    if (!chosen_) return;
    groups.each([&](auto& g) {
      const sparsity::ShardMasks& masks = masks_[index(g.kind())];
      if (!masks.active()) return;
      // The reduced gradients are the engine's own buffer; the paths hand them to the norm and the
      // optimizer read-only, and pruning is the one writer between the reduction and those reads.
      g.grads().owned().visit([&](const auto* grads) {
        using E = std::remove_cv_t<std::remove_pointer_t<decltype(grads)>>;
        masks.zero_pruned(const_cast<E*>(grads), g.segments(), [](const kernels::Segment& s) { return s.grad_at(); });
      });
    });
  }

  /// After a group's update, before it is published: the pruned master and output values to zero.
  template <class Group>
  void after_update(Group& g) const {
    const sparsity::ShardMasks& masks = masks_[index(g.kind())];
    if (!masks.active() || !masks.chosen()) return;
    masks.zero_pruned(g.store().master(), g.segments(), [](const kernels::Segment& s) { return s.offset; });
    const auto out = g.params().optimizer_out();
    if constexpr (!zero::OutputWriter<std::remove_pointer_t<decltype(out.base)>>) {  // a shard file: refused (compat)
      masks.zero_pruned(out.base, g.segments(), [](const kernels::Segment& s) { return s.out_at(); });
    }
  }

  /// A group's keep flags (empty before the masks are chosen), for the engine's state.
  template <class Group>
  std::span<const std::uint8_t> keep(const Group& g) const {
    const sparsity::ShardMasks& masks = masks_[index(g.kind())];
    return masks.chosen() ? masks.keep() : std::span<const std::uint8_t>{};
  }
  /// Restores a group's flags from a state (empty: the masks were not chosen yet when it was
  /// taken, and will be at their step); loaded() after the last group.
  template <class Group>
  void load(Group& g, std::span<const std::uint8_t> keep) {
    sparsity::ShardMasks& masks = masks_[index(g.kind())];
    if (keep.empty() || !masks.active()) {  // none saved, or none this group needs (nothing here is sparse)
      masks.reset();
    } else {
      masks.load(keep);
    }
  }
  void loaded() noexcept {
    chosen_ = false;
    for (const sparsity::ShardMasks& m : masks_) chosen_ = chosen_ || m.chosen();
  }

  bool chosen() const noexcept { return chosen_; }

 private:
  static std::size_t index(GroupKind k) noexcept { return static_cast<std::size_t>(k); }

  sparsity::SparsityOptions options_;
  std::array<sparsity::ShardMasks, 3> masks_;
  bool chosen_ = false;
};

}  // namespace zerotk::engine
