#pragma once
/// \file zerotk/engine/resolve.hpp
/// Reading an Engine's policy pack: each slot's policy or its default, and the compatibility table
/// (engine/compat.hpp). A required slot left empty is reported by one static_assert and replaced by
/// a stand-in, so the compiler says nothing else (the first error line names what is missing).

#include <cstddef>
#include <type_traits>

#include "zerotk/engine/compat.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/policies.hpp"
#include "zerotk/precision/loss_scaler.hpp"
#include "zerotk/zero/partitioner.hpp"

namespace zerotk {

namespace engine {
/// The policies of a pack, resolved. A required slot left empty is reported by the first
/// static_assert and replaced by a stand-in, so the compiler says nothing else.
template <class... Ps>
struct Resolved {
  static_assert(PolicyPackCheck<Ps...>::value);
  using found_partitioner = find_policy_t<policy::partitioner, missing_policy, Ps...>;
  using found_optimizer = find_policy_t<policy::optimizer, missing_policy, Ps...>;
  static_assert(!std::is_same_v<found_optimizer, missing_policy>,
                "Engine: an Optimizer policy is required, e.g. zerotk::Optimizer<zerotk::AdamW>");
  static_assert(!std::is_same_v<found_partitioner, missing_policy>,
                "Engine: a Partitioner policy is required, e.g. zerotk::Partitioner<zerotk::Stage<2>>");
  using partitioner = std::conditional_t<std::is_same_v<found_partitioner, missing_policy>, Partitioner<Stage<0>>,
                                         found_partitioner>;
  using optimizer = std::conditional_t<std::is_same_v<found_optimizer, missing_policy>, Optimizer<AdamW>, found_optimizer>;
  using precision = find_policy_t<policy::precision, Precision<fp32>, Ps...>;
  using bucketer =
      find_policy_t<policy::bucketer, Bucketer<Bytes<std::size_t{500'000'000} * sizeof(typename precision::storage)>>, Ps...>;
  using loss_scaler = find_policy_t<policy::loss_scaler,
                                    std::conditional_t<std::is_same_v<typename precision::tag, fp16>, LossScaler<Dynamic>,
                                                       LossScaler<None>>,
                                    Ps...>;
  using offload = find_policy_t<policy::offload, Offload<None>, Ps...>;
  using device = find_policy_t<policy::device, Device<Host>, Ps...>;
  using param_offload = find_policy_t<policy::param_offload, OffloadParams<None>, Ps...>;
  using gradient_compression = find_policy_t<policy::gradient_compression, GradientCompression<None>, Ps...>;
  using sparsity = find_policy_t<policy::sparsity, Sparsity<None>, Ps...>;
  using compat = Compat<partitioner, optimizer, precision, offload, device, param_offload, gradient_compression, sparsity>;
  static constexpr bool compatible = compat::value;
  /// The Offload tag whose state store the groups use (offload/store.hpp).
  using store_tag = typename offload::tag;
  /// The OffloadParams tag whose shard home the groups use: None below stage 3 (no shards) and for a
  /// pack that does not combine (a stand-in, so the first error is the table's sentence).
  using shard_tag =
      std::conditional_t<partitioner::stage != 3 || !compat::ok, None, typename param_offload::tag>;
};

/// The canonical pack: every slot's policy, resolved, in one fixed order. `Engine<Ps...>` names
/// `BasicEngine<policies_t<Ps...>>` (zerotk/engine.hpp), so the policies in any order, with the
/// defaults spelled or left out, are one engine type: one type to instantiate, and the type the
/// compiled set (zerotk/engines.hpp) declares whatever the user's spelling.
template <class PartitionerP, class OptimizerP, class PrecisionP, class BucketerP, class LossScalerP, class OffloadP,
          class OffloadParamsP, class DeviceP, class GradientCompressionP, class SparsityP>
struct Policies {};

template <class... Ps>
struct CanonicalPolicies {
  using R = Resolved<Ps...>;
  using type = Policies<typename R::partitioner, typename R::optimizer, typename R::precision, typename R::bucketer,
                        typename R::loss_scaler, typename R::offload, typename R::param_offload, typename R::device,
                        typename R::gradient_compression, typename R::sparsity>;
};
template <class... Ps>
using policies_t = typename CanonicalPolicies<Ps...>::type;

/// Resolved<...> of a canonical pack (BasicEngine's own view of its policies).
template <class Pack>
struct ResolvedPack;
template <class... Ps>
struct ResolvedPack<Policies<Ps...>> {
  using type = Resolved<Ps...>;
};
template <class Pack>
using resolved_pack_t = typename ResolvedPack<Pack>::type;
}  // namespace engine

}  // namespace zerotk
