#pragma once
/// \file zerotk/offload/store.hpp
/// StoreOf<Tag>: the state store an Offload<Tag> policy selects (the tag picks a type; nothing
/// branches on it).
///
///   Offload<None>  Resident     fp32 master, m, v in the compute space (offload/resident.hpp)
///   Offload<Cpu>   HostPinned   in page-locked host memory, stepped on the host sub-group by
///                               sub-group (offload/host_pinned.hpp)
///   Offload<Nvme>  NvmeSwapped  in a swap file per rank, swapped through pinned buffers sub-group
///                               by sub-group (offload/nvme.hpp)

#include "zerotk/offload/concepts.hpp"
#include "zerotk/offload/host_pinned.hpp"
#include "zerotk/offload/nvme.hpp"
#include "zerotk/offload/resident.hpp"
#include "zerotk/policies.hpp"

namespace zerotk::offload {

template <class Tag>
struct StoreOf {
  static_assert(dependent_false<Tag>, "offload::StoreOf: no state store for this Offload tag");
};
template <>
struct StoreOf<None> {
  template <class Opt, class Ops>
  using type = Resident<Opt, Ops>;
};
template <>
struct StoreOf<Cpu> {
  template <class Opt, class Ops>
  using type = HostPinned<Opt, Ops>;
};
template <>
struct StoreOf<Nvme> {
  template <class Opt, class Ops>
  using type = NvmeSwapped<Opt, Ops>;
};

namespace detail {
template <class S, class T>
struct checked_store {
  static_assert(check_state_store_v<S, T>);
  using type = S;
};
}  // namespace detail

/// The store Offload<Tag> selects for a group of element type T, checked against StateStore
/// (offload/concepts.hpp) here, where the tag picks it.
template <class Tag, class Opt, class Ops, class T>
using store_t = typename detail::checked_store<typename StoreOf<Tag>::template type<Opt, Ops>, T>::type;

}  // namespace zerotk::offload
